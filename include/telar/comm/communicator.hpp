#pragma once
/*! \file
 *  \brief telar::Communicator: a private, RAII-managed MPI communicator with
 *         typed, bounded operations that raise telar::CommError.
 */

#include <telar/comm/detail/comm_cache.hpp>
#include <telar/comm/detail/comm_handle.hpp>
#include <telar/comm/detail/mpi_type.hpp>
#include <telar/comm/detail/progress.hpp>
#include <telar/comm/detail/topology.hpp>
#include <telar/comm/error.hpp>
#include <telar/comm/request.hpp>

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace telar {

/*! \brief Communication backend tag: MPI (the only one so far).
 *
 *  Backends are tags so that NCCL or GPI-2 can be added as new tags with
 *  their own BasicCommunicator specialisation, without touching the code that
 *  names telar::Communicator.
 */
struct MpiBackend {
  /*! \brief Backend name for logs and traces. */
  static constexpr const char* name() { return "mpi"; }
};

/*! \brief A communicator that owns an `MPI_Comm_dup` of the one it is given.
 *
 *  - Telar never talks on the caller's communicator: every operation runs on
 *    the duplicate, freed by RAII (move-only; nothing is freed once
 *    MPI_Finalize has run).
 *  - The duplicate uses MPI_ERRORS_RETURN; every MPI error becomes a
 *    telar::CommError naming the rank, the operation, the peer and MPI's
 *    error string.
 *  - Every blocking operation is a non-blocking one plus a bounded wait: after
 *    timeout() seconds (default from `TELAR_COMM_TIMEOUT`, else 300; 0 = no
 *    bound) it throws telar::CommTimeout instead of hanging.
 *  - Collective calls (all but send/recv and their variants) must be made by
 *    every rank in the same order, as in MPI.
 *
 *  Buffers are host pointers. Device buffers are staged by the caller (see
 *  telar/comm/device_buffer.hpp) unless `TELAR_ENABLE_GPU_AWARE_MPI` is set.
 *
 *  \code
 *  telar::Communicator comm(app_comm, "world"); // app_comm: the application's MPI_Comm
 *  float loss = local_loss;
 *  comm.allreduce(&loss, 1, telar::ReduceOp::sum);
 *  if (comm.any(!std::isfinite(loss))) throw std::runtime_error("loss diverged");
 *  \endcode
 *
 *  \tparam Backend communication backend tag; only telar::MpiBackend exists
 */
template <class Backend = MpiBackend>
class BasicCommunicator {
  static_assert(std::is_same_v<Backend, MpiBackend>,
                "telar::BasicCommunicator: only telar::MpiBackend is implemented");

public:
  /*! \brief A null communicator (valid() is false); assign a real one to use it. */
  BasicCommunicator() = default;

  /*! \brief Duplicates \p comm (collective over \p comm, bounded by the timeout).
   *  \param comm communicator to duplicate; Telar never talks on it directly
   *  \param name label used in error messages and MPI_Comm_set_name
   */
  explicit BasicCommunicator(MPI_Comm comm, std::string name = "comm") {
    double const timeout = detail::timeout_from_env();
    detail::CommHandle parent; // describes `comm` in messages; owns nothing
    parent.name = name + " (parent)";
    parent.timeout = timeout;
    MPI_Comm_rank(comm, &parent.rank);
    MPI_Comm_size(comm, &parent.size);
    h_ = detail::adopt(detail::bounded_dup(comm, parent), std::move(name), timeout);
  }

  /*! \brief Takes over another communicator (left null). */
  BasicCommunicator(BasicCommunicator&&) noexcept = default;
  /*! \brief Releases this communicator and takes over another (left null). */
  BasicCommunicator& operator=(BasicCommunicator&&) noexcept = default;
  BasicCommunicator(BasicCommunicator const&) = delete;
  BasicCommunicator& operator=(BasicCommunicator const&) = delete;
  /*! \brief Frees the duplicate once no request or operation uses it. */
  ~BasicCommunicator() = default;

  /*! \brief False for a null communicator (default-constructed, moved-from,
   *         or a split() with color MPI_UNDEFINED). */
  bool valid() const noexcept { return h_ && h_->comm != MPI_COMM_NULL; }
  /*! \brief Rank of this process in the communicator. */
  int rank() const { return handle().rank; }
  /*! \brief Number of processes in the communicator. */
  int size() const { return handle().size; }
  /*! \brief The duplicated MPI communicator, for interoperation with plain MPI. */
  MPI_Comm native() const { return handle().comm; }
  /*! \brief Label used in error messages. */
  std::string const& name() const { return handle().name; }
  /*! \brief Bound of every blocking wait in seconds (0 = unbounded). */
  double timeout() const { return handle().timeout; }
  /*! \brief Sets the bound of every later wait on this communicator.
   *  \param seconds new bound in seconds; 0 means unbounded
   */
  void set_timeout(double seconds) { handle().timeout = seconds > 0 ? seconds : 0.0; }

  /*! \brief Another duplicate of this communicator (collective).
   *  \param name label of the new communicator; empty keeps this one's
   */
  BasicCommunicator dup(std::string name = {}) const {
    auto const& h = handle();
    BasicCommunicator out;
    out.h_ = detail::adopt(detail::bounded_dup(h.comm, h), name.empty() ? h.name : std::move(name),
                           h.timeout);
    return out;
  }

  /*! \brief Splits into sub-communicators by \p color, ordered by \p key
   *         (collective; MPI_Comm_split semantics). The result inherits the timeout.
   *  \param color processes with the same color form one communicator; MPI_UNDEFINED gives a null
   * one \param key   order of the ranks in the new communicator \param name  label of the new
   * communicator; empty derives one from this one's
   */
  BasicCommunicator split(int color, int key, std::string name = {}) const {
    // Bounded, and a duplicate of an earlier group when the same processes
    // were split off before (comm/detail/comm_cache.hpp).
    return adopted(detail::split_comm(handle(), color, key), std::move(name), "/split");
  }

  /*! \brief The ranks of this communicator that share memory with this one
   *  (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED; collective).
   *  \param name label of the new communicator; empty derives one from this one's
   */
  BasicCommunicator split_shared(std::string name = {}) const {
    // Bounded, as in split().
    return adopted(detail::split_shared_comm(handle()), std::move(name), "/node");
  }

  /*! \brief The ranks of this communicator on this rank's node: those that
   *  share memory (split_shared()), or, under the testing aid
   *  `TELAR_RANKS_PER_NODE=k` (telar::node_layout), this rank's fake node of
   *  k launch ranks, whose memory is shared too (collective).
   *  \param name label of the new communicator; empty derives one from this one's
   *  \throws telar::CommError if `TELAR_RANKS_PER_NODE` is invalid */
  BasicCommunicator split_node(std::string name = {}) const {
    // Bounded, as in split().
    return adopted(detail::split_node(handle()), std::move(name), "/node");
  }

  /*! \brief Blocks until every rank has called barrier() (bounded). */
  void barrier() const {
    auto const& h = handle();
    MPI_Request req = MPI_REQUEST_NULL;
    h.check(MPI_Ibarrier(h.comm, &req), "MPI_Ibarrier");
    detail::wait_request(h, req, MPI_STATUS_IGNORE, "MPI_Barrier", -1, -1, "with");
  }

  /*! \brief Broadcasts \p n elements from \p root (bounded).
   *  \tparam T element type with an MPI datatype
   *  \param data buffer: input on \p root, output elsewhere
   *  \param n    number of elements
   *  \param root rank that sends
   */
  template <class T>
  void broadcast(T* data, std::size_t n, int root) const {
    auto const& h = handle();
    MPI_Request req = MPI_REQUEST_NULL;
    h.check(MPI_Ibcast(data, count(n, "MPI_Bcast"), detail::mpi_type<T>(), root, h.comm, &req),
            "MPI_Ibcast", root);
    handle().count_collective(double(n * sizeof(T)));
    detail::wait_request(h, req, MPI_STATUS_IGNORE, "MPI_Bcast", root, -1, "from root");
  }

  /*! \brief In-place allreduce of \p n elements (bounded).
   *  \tparam T element type with an MPI datatype
   *  \param inout buffer reduced in place
   *  \param n     number of elements
   *  \param op    reduction
   */
  template <class T>
  void allreduce(T* inout, std::size_t n, ReduceOp op = ReduceOp::sum) const {
    iallreduce(inout, n, op).wait();
  }

  /*! \brief Out-of-place allreduce (bounded).
   *  \tparam T element type with an MPI datatype
   *  \param in  input, \p n elements
   *  \param out output, \p n elements (must not overlap \p in)
   *  \param n   number of elements
   *  \param op  reduction
   */
  template <class T>
  void allreduce(T const* in, T* out, std::size_t n, ReduceOp op = ReduceOp::sum) const {
    start_allreduce(in, out, n, op, "MPI_Allreduce").wait();
  }

  /*! \brief Logical or of \p flag over all ranks (bounded collective).
   *
   *  Lets ranks agree on an error so that every rank raises the same
   *  exception: `if (comm.any(failed_here)) throw ...;`.
   *  \param flag this rank's value
   *  \return true if \p flag is true on at least one rank
   */
  bool any(bool flag) const {
    int v = flag ? 1 : 0;
    allreduce(&v, 1, ReduceOp::max);
    return v != 0;
  }

  /*! \brief Gathers \p n elements from every rank into \p recv, ordered by rank (bounded).
   *  \tparam T element type with an MPI datatype
   *  \param send this rank's \p n elements
   *  \param n    elements per rank
   *  \param recv output of `n * size()` elements
   */
  template <class T>
  void allgather(T const* send, std::size_t n, T* recv) const {
    auto const& h = handle();
    MPI_Request req = MPI_REQUEST_NULL;
    auto const c = count(n, "MPI_Allgather");
    handle().count_collective(double(n * sizeof(T)) * h.size);
    h.check(MPI_Iallgather(send, c, detail::mpi_type<T>(), recv, c, detail::mpi_type<T>(), h.comm,
                           &req),
            "MPI_Iallgather");
    detail::wait_request(h, req, MPI_STATUS_IGNORE, "MPI_Allgather", -1, -1, "with");
  }

  /*! \brief Gathers a variable number of elements from every rank (bounded).
   *
   *  Rank i's elements land at offset `counts[0] + ... + counts[i-1]` of \p recv.
   *  \tparam T element type with an MPI datatype
   *  \param send   this rank's elements, `counts[rank()]` of them
   *  \param counts number of elements of every rank (same on all ranks)
   *  \param recv   output of `sum(counts)` elements
   */
  template <class T>
  void allgatherv(T const* send, std::vector<int> const& counts, T* recv) const {
    check_counts(counts, "MPI_Allgatherv");
    std::vector<int> displs(counts.size(), 0);
    long long total = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      if (total > INT_MAX)
        count(static_cast<std::size_t>(total), "MPI_Allgatherv");
      displs[i] = static_cast<int>(total);
      total += counts[i];
    }
    iallgatherv(send, counts, displs, recv).wait();
  }

  /*! \brief Reduce-scatter in equal blocks (bounded): block i of the
   *         reduction of every rank's \p send ends on rank i.
   *  \tparam T element type with an MPI datatype
   *  \param send   `recv_n * size()` elements; if equal to \p recv, the
   *                operation runs in place (MPI_IN_PLACE) and \p recv must hold them all
   *  \param recv   this rank's block, \p recv_n elements
   *  \param recv_n elements per block
   *  \param op     reduction
   */
  template <class T>
  void reduce_scatter(T const* send, T* recv, std::size_t recv_n,
                      ReduceOp op = ReduceOp::sum) const {
    auto const& h = handle();
    MPI_Request req = MPI_REQUEST_NULL;
    void const* s = send == recv ? MPI_IN_PLACE : static_cast<void const*>(send);
    handle().count_collective(double(recv_n * sizeof(T)) * h.size);
    h.check(MPI_Ireduce_scatter_block(s, recv, count(recv_n, "MPI_Reduce_scatter_block"),
                                      detail::mpi_type<T>(), detail::mpi_op<T>(op), h.comm, &req),
            "MPI_Ireduce_scatter_block");
    detail::wait_request(h, req, MPI_STATUS_IGNORE, "MPI_Reduce_scatter_block", -1, -1, "with");
  }

  /*! \brief Sends \p n elements to \p dest (bounded).
   *  \tparam T element type with an MPI datatype
   *  \param data elements to send
   *  \param n    number of elements
   *  \param dest destination rank
   *  \param tag  message tag (0 .. 32767 is portable)
   */
  template <class T>
  void send(T const* data, std::size_t n, int dest, int tag = 0) const {
    isend(data, n, dest, tag).wait();
  }

  /*! \brief Receives \p n elements from \p source (bounded).
   *  \tparam T element type with an MPI datatype
   *  \param data output buffer
   *  \param n    number of elements expected (a longer message is an error)
   *  \param source source rank
   *  \param tag  message tag
   */
  template <class T>
  void recv(T* data, std::size_t n, int source, int tag = 0) const {
    matched_irecv(data, n, source, tag).wait();
  }

  /*! \brief Sends to \p dest and receives from \p source at once (bounded);
   *         no deadlock in rings or pairwise exchanges.
   *  \tparam T element type with an MPI datatype
   *  \param send    elements to send
   *  \param send_n  number of elements to send
   *  \param dest    destination rank
   *  \param recv    output buffer (must not overlap \p send)
   *  \param recv_n  number of elements to receive
   *  \param source  source rank
   *  \param tag     tag of both messages
   */
  template <class T>
  void sendrecv(T const* send, std::size_t send_n, int dest, T* recv, std::size_t recv_n,
                int source, int tag = 0) const {
    std::vector<Request> reqs;
    reqs.reserve(2);
    reqs.push_back(isend(send, send_n, dest, tag));
    reqs.push_back(matched_irecv(recv, recv_n, source, tag));
    wait_all(reqs);
  }

  /*! \brief Starts sending \p n elements to \p dest.
   *  \tparam T element type with an MPI datatype
   *  \param data elements, unchanged until the request completes
   *  \param n    number of elements
   *  \param dest destination rank
   *  \param tag  message tag
   *  \return the pending request
   */
  template <class T>
  Request isend(T const* data, std::size_t n, int dest, int tag = 0) const {
    auto const& h = handle();
    MPI_Request req = MPI_REQUEST_NULL;
    h.check(MPI_Isend(data, count(n, "MPI_Isend"), detail::mpi_type<T>(), dest, tag, h.comm, &req),
            "MPI_Isend", dest, tag, "to");
    handle().bytes_sent += n * sizeof(T);
    return Request(req, detail::RequestKind::send, "MPI_Send", dest, tag, h_);
  }

  /*! \brief Starts receiving \p n elements from \p source.
   *  \tparam T element type with an MPI datatype
   *  \param data output buffer, valid until the request completes
   *  \param n    number of elements expected
   *  \param source source rank
   *  \param tag  message tag
   *  \return the pending request
   */
  template <class T>
  Request irecv(T* data, std::size_t n, int source, int tag = 0) const {
    auto const& h = handle();
    MPI_Request req = MPI_REQUEST_NULL;
    h.check(
        MPI_Irecv(data, count(n, "MPI_Irecv"), detail::mpi_type<T>(), source, tag, h.comm, &req),
        "MPI_Irecv", source, tag, "from");
    return Request(req, detail::RequestKind::recv, "MPI_Recv", source, tag, h_);
  }

  /*! \brief Starts an in-place allreduce (MPI_Iallreduce).
   *  \tparam T element type with an MPI datatype
   *  \param inout buffer reduced in place, valid until the request completes
   *  \param n     number of elements
   *  \param op    reduction
   *  \return the pending request
   */
  template <class T>
  Request iallreduce(T* inout, std::size_t n, ReduceOp op = ReduceOp::sum) const {
    return start_allreduce(MPI_IN_PLACE, inout, n, op, "MPI_Iallreduce");
  }

  /*! \brief Starts a reduce-scatter in blocks of any size
   *         (MPI_Ireduce_scatter): the reduction of every rank's \p send is
   *         split in rank order, `counts[i]` elements ending on rank i.
   *  \tparam T element type with an MPI datatype
   *  \param send  the sum of \p counts elements, valid until the request completes
   *  \param recv  this rank's block, `counts[rank()]` elements
   *  \param counts elements per rank, the same on every rank; MPI reads
   *                them until the request completes, so keep them alive
   *  \param op    reduction
   *  \return the pending request
   */
  template <class T>
  Request ireduce_scatter(T const* send, T* recv, std::vector<int> const& counts,
                          ReduceOp op = ReduceOp::sum) const {
    auto const& h = handle();
    handle().count_collective(double(check_counts(counts, "MPI_Reduce_scatter")) * sizeof(T));
    MPI_Request req = MPI_REQUEST_NULL;
    h.check(MPI_Ireduce_scatter(send, recv, counts.data(), detail::mpi_type<T>(),
                                detail::mpi_op<T>(op), h.comm, &req),
            "MPI_Ireduce_scatter");
    return Request(req, detail::RequestKind::collective, "MPI_Reduce_scatter", -1, -1, h_);
  }

  /*! \brief Starts gathering a variable number of elements from every rank
   *         (MPI_Iallgatherv): rank i's `counts[i]` elements land at offset
   *         `displs[i]` of \p recv.
   *  \tparam T element type with an MPI datatype
   *  \param send   this rank's `counts[rank()]` elements, valid until the request
   *                completes; if equal to `recv + displs[rank()]` (already where they
   *                land), the gather runs in place (MPI_IN_PLACE)
   *  \param counts elements of every rank (the same on every rank)
   *  \param displs where each rank's elements land in \p recv; MPI reads
   *                \p counts and \p displs until the request completes, so keep them alive
   *  \param recv   output, valid until the request completes
   *  \return the pending request
   */
  template <class T>
  Request iallgatherv(T const* send, std::vector<int> const& counts, std::vector<int> const& displs,
                      T* recv) const {
    auto const& h = handle();
    check_counts(displs, "MPI_Iallgatherv");
    handle().count_collective(double(check_counts(counts, "MPI_Iallgatherv")) * sizeof(T));
    MPI_Request req = MPI_REQUEST_NULL;
    std::size_t const me = static_cast<std::size_t>(h.rank);
    void const* s = send == recv + displs[me] ? MPI_IN_PLACE : static_cast<void const*>(send);
    h.check(MPI_Iallgatherv(s, counts[me], detail::mpi_type<T>(), recv, counts.data(),
                            displs.data(), detail::mpi_type<T>(), h.comm, &req),
            "MPI_Iallgatherv");
    return Request(req, detail::RequestKind::collective, "MPI_Allgatherv", -1, -1, h_);
  }

  /*! \brief Bytes this rank has handed to MPI to send on this communicator:
   *         point-to-point messages (Telar's own allreduce algorithms
   *         included) exactly; a collective that moves T bytes over the N
   *         ranks in all (allgather, allgatherv, reduce-scatter: T the full
   *         gathered or reduced length; broadcast: T the message) as
   *         (N-1)/N T, what a ring sends; MPI's allreduce as 2(N-1)/N T.
   *         Counted, not measured on the wire. */
  std::uint64_t bytes_sent() const { return handle().bytes_sent; }
  /*! \brief Sets bytes_sent() back to zero (e.g. after warm-up steps). */
  void reset_bytes_sent() const { handle().bytes_sent = 0; }

  /*! \brief Tests \p req (see telar::Request::test).
   *  \param req request to test
   *  \return true when it has completed
   */
  bool test(Request& req) const { return req.test(); }
  /*! \brief Waits for \p req, bounded by its communicator's timeout.
   *  \param req request to complete
   */
  void wait(Request& req) const { req.wait(); }
  /*! \brief Waits for all \p reqs (see telar::wait_all).
   *  \param reqs requests to complete
   */
  void wait_all(std::vector<Request>& reqs) const { telar::wait_all(reqs); }

  /*! \brief Internal state shared with in-flight operations (not part of the
   *         stable API). */
  std::shared_ptr<detail::CommHandle> const& handle_ptr() const {
    handle();
    return h_;
  }

private:
  // The sum of a collective's per-rank counts (or displacements), which
  // must have one entry per rank: else an error naming `what`.
  long long check_counts(std::vector<int> const& counts, char const* what) const {
    auto const& h = handle();
    if (static_cast<int>(counts.size()) != h.size)
      throw CommError(std::string(what) + " on " + h.where() + ": " +
                          std::to_string(counts.size()) + " counts, expected one per rank",
                      h.rank, what);
    long long total = 0;
    for (int c : counts)
      total += c;
    return total;
  }

  // MPI_Iallreduce of `in` (MPI_IN_PLACE: `out` in place) into `out`; `what`
  // names the call in a count overflow.
  template <class T>
  Request start_allreduce(void const* in, T* out, std::size_t n, ReduceOp op,
                          char const* what) const {
    auto const& h = handle();
    MPI_Request req = MPI_REQUEST_NULL;
    handle().count_collective(2.0 * double(n * sizeof(T)));
    h.check(MPI_Iallreduce(in, out, count(n, what), detail::mpi_type<T>(), detail::mpi_op<T>(op),
                           h.comm, &req),
            "MPI_Iallreduce");
    return Request(req, detail::RequestKind::collective, "MPI_Allreduce", -1, -1, h_);
  }

  // A communicator owning `out`, split off this one: named `name`, or this
  // one's name and `suffix`; it inherits the timeout.
  BasicCommunicator adopted(MPI_Comm out, std::string name, char const* suffix) const {
    auto const& h = handle();
    BasicCommunicator c;
    c.h_ = detail::adopt(out, name.empty() ? h.name + suffix : std::move(name), h.timeout);
    return c;
  }

  // The receive of the blocking recv and sendrecv. It waits (bounded) for a
  // matching message with MPI_Iprobe, checks its length, and only then posts
  // MPI_Irecv for exactly that message, so a message longer than the buffer
  // is reported by Telar instead of by the completion call: MPI_Test and
  // MPI_Wait name no communicator, and MPICH 4.0 raises their errors on the
  // world communicator's handler, not on the duplicate's (docs/comm.md,
  // "Error model"). A longer message is received into scratch memory and dropped,
  // as MPI does, and the call throws CommError with MPI_ERR_TRUNCATE.
  template <class T>
  Request matched_irecv(T* data, std::size_t n, int source, int tag) const {
    auto& h = handle();
    int const want = count(n, "MPI_Recv");
    MPI_Status st;
    detail::wait_until(
        [&] {
          int flag = 0;
          h.check(MPI_Iprobe(source, tag, h.comm, &flag, &st), "MPI_Recv", source, tag, "from");
          return flag != 0;
        },
        h.timeout,
        [&](double waited) {
          h.timed_out(waited, detail::what_op("MPI_Recv", source, tag, "from"), "MPI_Recv", source);
        },
        nullptr,
        [&](double) {
          h.check_peers(detail::what_op("MPI_Recv", source, tag, "from"), "MPI_Recv", source);
        });
    int const from = st.MPI_SOURCE, got_tag = st.MPI_TAG;
    int got = 0;
    h.check(MPI_Get_count(&st, detail::mpi_type<T>(), &got), "MPI_Get_count", from, got_tag,
            "from");
    if (got != MPI_UNDEFINED && got <= want)
      return irecv(data, n, from, got_tag);
    int bytes = 0;
    MPI_Get_count(&st, MPI_BYTE, &bytes);
    std::size_t const elements = (static_cast<std::size_t>(bytes) + sizeof(T) - 1) / sizeof(T);
    auto sink = std::make_unique<T[]>(elements);
    irecv(sink.get(), elements, from, got_tag).wait();
    std::ostringstream os;
    os << detail::what_op("MPI_Recv", from, got_tag, "from") << " failed on " << h.where() << ": "
       << detail::mpi_error_string(MPI_ERR_TRUNCATE) << " (" << bytes << " bytes for a buffer of "
       << n * sizeof(T) << ")";
    throw CommError(os.str(), h.rank, "MPI_Recv", from, MPI_ERR_TRUNCATE);
  }

  detail::CommHandle& handle() const {
    if (!h_ || h_->comm == MPI_COMM_NULL)
      throw CommError("telar::Communicator: operation on a null communicator (default-constructed, "
                      "moved-from, or split with MPI_UNDEFINED)",
                      -1, "telar::Communicator");
    return *h_;
  }

  int count(std::size_t n, const char* op) const {
    if (n > static_cast<std::size_t>(INT_MAX)) {
      auto const& h = *h_;
      throw CommError(std::string(op) + " on " + h.where() + ": " + std::to_string(n) +
                          " elements exceed MPI's int count; split the buffer",
                      h.rank, op);
    }
    return static_cast<int>(n);
  }

  std::shared_ptr<detail::CommHandle> h_;
};

/*! \brief The communicator type used throughout Telar. */
using Communicator = BasicCommunicator<MpiBackend>;

/*! \brief Runs \p body; if it throws, prints `telar: rank R: <message>` to
 *         stderr and calls MPI_Abort on \p comm's duplicate, so the whole job
 *         ends instead of hanging on the ranks that did not fail. Peers on
 *         this host that are stopped (SIGSTOP) are continued first, so that
 *         the launcher's termination signal reaches them.
 *
 *  \code
 *  telar::Communicator comm(app_comm, "world"); // app_comm: the application's MPI_Comm
 *  telar::abort_on_error(comm, [&] { trainer.fit(loader); });
 *  \endcode
 *  \tparam F callable with no arguments
 *  \param comm communicator whose job is aborted (its rank is printed)
 *  \param body the work to run
 *  \param exit_code error code passed to MPI_Abort
 */
template <class F>
void abort_on_error(Communicator const& comm, F&& body, int exit_code = 1) {
  static_assert(std::is_invocable_v<F&>, "telar::abort_on_error: body must be callable with no "
                                         "arguments, e.g. [&] { ... }");
  auto abort_with = [&](const char* message) {
    int rank = -1;
    MPI_Comm c = MPI_COMM_NULL;
    if (comm.valid()) {
      rank = comm.rank();
      c = comm.native();
    }
    std::fprintf(stderr, "telar: rank %d: %s\n", rank, message);
    std::fflush(stderr);
    // MPI_Abort on the library's duplicate: Telar never names the world communicator,
    // and aborting any communicator ends the whole job in practice.
    if (c != MPI_COMM_NULL) {
      auto const& peers = comm.handle_ptr()->peers;
      if (std::size_t(rank) < peers.size()) // so that the launcher's SIGTERM reaches them
        for (auto const& p : peers)
          detail::continue_if_stopped(p, peers[std::size_t(rank)]);
      detail::exit_if_abort_hangs(exit_code);
      MPI_Abort(c, exit_code);
    }
    std::abort();
  };
  try {
    body();
  } catch (std::exception const& e) {
    abort_with(e.what());
  } catch (...) {
    abort_with("unknown exception");
  }
}

} // namespace telar
