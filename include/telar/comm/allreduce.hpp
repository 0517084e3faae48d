#pragma once
/*! \file
 *  \brief Allreduce algorithms as policies, with a non-blocking interface so
 *         that a gradient bucket's reduction runs while backward continues.
 *
 *  Buffers are host pointers. Device buffers are staged by the caller through
 *  telar::AllreduceBuffer, which passes device pointers as they are only to
 *  an algorithm that leaves the arithmetic to MPI (MpiAllreduce) and only when
 *  `TELAR_ENABLE_GPU_AWARE_MPI` is set in telar/config.hpp: Telar's
 *  point-to-point algorithms add received segments on the host.
 */

#include <telar/comm/communicator.hpp>
#include <telar/comm/detail/comm_handle.hpp>
#include <telar/comm/detail/progress.hpp>
#include <telar/comm/detail/schedule.hpp>
#include <telar/comm/detail/topology.hpp>
#include <telar/comm/device_buffer.hpp>
#include <telar/comm/error.hpp>
#include <telar/config.hpp>
#include <telar/core/detail/decl.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace telar {

namespace detail {

// An allreduce in flight. Host-only, so a virtual interface is fine; it lets
// one AllreduceOp<T> type hold any algorithm (gradient buckets keep a list).
class AllreduceState : public Progressable {
public:
  AllreduceState(std::shared_ptr<CommHandle> comm, const char* algorithm)
      : comm_(std::move(comm)), algorithm_(algorithm) {}
  // What the operation waits for, for timeout messages.
  virtual std::string describe() const = 0;
  virtual int pending_peer() const = 0;
  // Gives up: frees MPI requests after at most `bound` seconds.
  virtual void release(double bound) noexcept = 0;
  CommHandle const& comm() const { return *comm_; }
  const char* algorithm() const { return algorithm_; }

protected:
  std::shared_ptr<CommHandle> comm_;
  const char* algorithm_;
};

// MPI_Iallreduce behind the AllreduceState interface.
class MpiAllreduceState final : public AllreduceState {
public:
  template <class T>
  MpiAllreduceState(std::shared_ptr<CommHandle> comm, T* data, std::size_t n)
      : AllreduceState(std::move(comm), "telar::MpiAllreduce") {
    if (n == 0)
      return;
    if (n > static_cast<std::size_t>(INT_MAX))
      throw CommError(std::string("MPI_Iallreduce on ") + comm_->where() + ": " +
                          std::to_string(n) + " elements exceed MPI's int count",
                      comm_->rank, "MPI_Iallreduce");
    comm_->check(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), mpi_type<T>(), MPI_SUM,
                                comm_->comm, &req_),
                 "MPI_Iallreduce");
    comm_->count_collective(2.0 * double(n * sizeof(T))); // a ring's reduce-scatter + allgather
  }
  ~MpiAllreduceState() override { release(0.05); }
  TELAR_DECL bool advance() override;
  bool finished() const override { return req_ == MPI_REQUEST_NULL; }
  std::string describe() const override { return "MPI_Iallreduce to complete on every rank"; }
  int pending_peer() const override { return -1; }
  TELAR_DECL void release(double bound) noexcept override;

private:
  MPI_Request req_ = MPI_REQUEST_NULL;
};

// Telar's point-to-point algorithms: a Schedule run by a ScheduleRun.
template <class T>
class ScheduleState final : public AllreduceState {
public:
  ScheduleState(std::shared_ptr<CommHandle> comm, const char* algorithm, T* data, Schedule sched,
                std::vector<typename ScheduleRun<T>::Comm> comms, int max_in_flight)
      : AllreduceState(comm, algorithm),
        run_(data, std::move(sched), std::move(comms), max_in_flight, comm) {}
  bool advance() override { return run_.advance(); }
  bool finished() const override { return run_.finished(); }
  std::string describe() const override { return run_.describe(); }
  int pending_peer() const override { return run_.pending_peer(); }
  void release(double bound) noexcept override { run_.release(bound); }

private:
  ScheduleRun<T> run_;
};

// Telar's point-to-point algorithms also sum bf16 words (Bf16Wire).
template <class T>
inline constexpr bool summable_v =
    (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) || std::is_same_v<T, Bf16Word>;

} // namespace detail

/*! \brief An allreduce in flight, returned by an algorithm's `start()`.
 *
 *  Move-only. test() advances it (and every other Telar operation in flight:
 *  operations progress whichever one a rank waits on, so ranks may wait on
 *  them in different orders without deadlock); wait() completes it, bounded by
 *  the communicator's timeout. The buffer passed to `start()` must stay
 *  valid and untouched until the operation has completed.
 *
 *  Destroying an unfinished operation waits for it with the communicator's
 *  bound (briefly during stack unwinding), then cancels or frees its
 *  requests, so nothing writes into freed memory and nothing crashes.
 *
 *  \tparam T element type
 */
template <class T>
class AllreduceOp {
public:
  /*! \brief An empty, finished operation. */
  AllreduceOp() = default;
  /*! \brief Takes over a started algorithm state (used by the algorithms).
   *  \param state the in-flight state, already started
   */
  explicit AllreduceOp(std::unique_ptr<detail::AllreduceState> state) : state_(std::move(state)) {
    if (state_ && !state_->finished())
      detail::register_progress(state_.get());
  }
  /*! \brief Takes over the operation of another (left empty). */
  AllreduceOp(AllreduceOp&&) noexcept = default;
  /*! \brief Finishes this operation (see the class description), then takes over \p other.
   *  \param other operation left empty
   */
  AllreduceOp& operator=(AllreduceOp&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  AllreduceOp(AllreduceOp const&) = delete;
  AllreduceOp& operator=(AllreduceOp const&) = delete;
  /*! \brief Completes or releases the operation (see the class description). */
  ~AllreduceOp() { finish_quietly(); }

  /*! \brief True once the reduction has completed (the buffer holds the sum). */
  bool done() const noexcept { return !state_ || state_->finished(); }

  /*! \brief Advances this and every other operation in flight.
   *  \return true when this operation has completed
   */
  bool test() {
    if (done())
      return true;
    detail::progress_all(state_.get());
    return done();
  }

  /*! \brief Completes the operation, bounded by the communicator's timeout.
   *  \throws telar::CommTimeout naming the rank, the algorithm and the peer it waits for
   *  \throws telar::CommError when MPI reports an error
   */
  void wait() {
    if (done())
      return;
    auto& s = *state_;
    // Kokkos Tools users see where ranks wait for gradients.
    Kokkos::Profiling::pushRegion(std::string(s.algorithm()) + "::wait");
    struct Pop {
      ~Pop() { Kokkos::Profiling::popRegion(); }
    } pop;
    detail::wait_until(
        [&] { return s.finished(); }, s.comm().timeout,
        [&](double waited) {
          s.comm().timed_out(waited,
                             std::string(s.algorithm()) + " (waiting for " + s.describe() + ")",
                             s.algorithm(), s.pending_peer());
        },
        &s,
        [&](double) {
          s.comm().check_peers(std::string(s.algorithm()) + " (waiting for " + s.describe() + ")",
                               s.algorithm(), s.pending_peer());
        });
  }

private:
  void finish_quietly() noexcept {
    if (!state_)
      return;
    if (!state_->finished()) {
      if (std::uncaught_exceptions() == 0 && !detail::mpi_finalized()) {
        try {
          wait();
        } catch (std::exception const& e) {
          std::fprintf(stderr, "telar: warning: unfinished allreduce destroyed: %s\n", e.what());
        } catch (...) {
        }
      }
      state_->release(0.05);
    }
    detail::unregister_progress(state_.get());
    state_.reset();
  }

  std::unique_ptr<detail::AllreduceState> state_;
};

/*! \brief Completes every operation in \p ops (bounded by the timeout of the
 *         first unfinished one's communicator).
 *  \tparam T element type
 *  \param ops operations to complete
 */
template <class T>
void wait_all(std::vector<AllreduceOp<T>>& ops) {
  for (auto& op : ops)
    op.wait(); // each wait advances all of them
}

/*! \brief Trait: true for types usable as an allreduce algorithm policy.
 *
 *  Specialise it (and provide `name()`, `start()`) to add an algorithm.
 *  \tparam T candidate policy type
 */
template <class T>
struct is_allreduce_algorithm : std::false_type {};

/*! \brief `is_allreduce_algorithm<T>::value`.
 *  \tparam T candidate policy type
 */
template <class T>
inline constexpr bool is_allreduce_algorithm_v = is_allreduce_algorithm<std::remove_cv_t<T>>::value;

/*! \brief MPI's own allreduce (MPI_Iallreduce, in place).
 *
 *  Cost depends on the MPI library's choice; with the usual algorithms it is
 *  close to the best of the others below.
 */
struct MpiAllreduce {
  /*! \brief Name for logs and traces. */
  static constexpr const char* name() { return "mpi"; }
  /*! \brief MPI does the arithmetic: with a GPU-aware MPI the buffer may be
   *  device memory. */
  static constexpr bool reduces_on_host = false;

  /*! \brief Starts a sum-allreduce of \p n elements in place.
   *  \tparam T element type with an MPI datatype
   *  \param comm communicator (every rank calls start in the same order)
   *  \param data buffer, untouched until the operation completes
   *  \param n    number of elements
   */
  template <class T>
  AllreduceOp<T> start(Communicator const& comm, T* data, std::size_t n) const {
    static_assert(detail::summable_v<T> && !std::is_same_v<T, detail::Bf16Word>,
                  "telar::MpiAllreduce: element type must be arithmetic (MPI cannot sum bf16)");
    return AllreduceOp<T>(std::make_unique<detail::MpiAllreduceState>(comm.handle_ptr(), data, n));
  }

  /*! \brief Blocking sum-allreduce in place (bounded).
   *  \tparam T element type with an MPI datatype
   *  \param comm communicator
   *  \param data buffer
   *  \param n    number of elements
   */
  template <class T>
  static void allreduce(Communicator const& comm, T* data, std::size_t n) {
    MpiAllreduce{}.start(comm, data, n).wait();
  }
};

/*! \brief Settings shared by Telar's point-to-point algorithms. */
struct SegmentedSettings {
  /*! \brief Received segments are added into the buffer on the host, so it
   *  must be host memory (telar::AllreduceBuffer stages device views). */
  static constexpr bool reduces_on_host = true;
  /*! \brief Default largest message, in bytes. */
  static constexpr std::size_t default_segment_bytes = std::size_t(2) << 20;
  /*! \brief Default messages in flight per direction. */
  static constexpr int default_max_in_flight = 2;

  /*! \brief Largest message; transfers are cut into segments of this size so
   *         the sum of one overlaps the transfer of the next. Must be the same
   *         on every rank. */
  std::size_t segment_bytes = default_segment_bytes;
  /*! \brief Messages in flight per direction (also the number of scratch
   *         segments held for incoming data). */
  int max_in_flight = default_max_in_flight;

  /*! \brief Segment length in elements of \p T.
   *  \tparam T element type
   */
  template <class T>
  std::size_t segment_elements() const {
    std::size_t const e = segment_bytes / sizeof(T);
    std::size_t const int_max = static_cast<std::size_t>(INT_MAX); // MPI counts are int
    return e == 0 ? 1 : (e > int_max ? int_max : e);
  }
};

namespace detail {
template <class T>
AllreduceOp<T> start_schedule(Communicator const& comm, const char* algorithm, T* data,
                              Schedule&& s, SegmentedSettings const& settings,
                              std::vector<typename ScheduleRun<T>::Comm> comms) {
  return AllreduceOp<T>(std::make_unique<ScheduleState<T>>(
      comm.handle_ptr(), algorithm, data, std::move(s), std::move(comms), settings.max_in_flight));
}

template <class T>
typename ScheduleRun<T>::Comm coll_of(CommHandle& h) {
  MPI_Comm const c = coll_comm(h);
  return typename ScheduleRun<T>::Comm{c, h.next_tag(), h.name};
}

// What Telar's point-to-point algorithms share: start() checks the element
// type and returns a completed operation when there is nothing to do (one
// rank, no elements), else Derived::start_segments(comm, data, n) starts
// the work; the blocking allreduce is start() waited for, default settings.
template <class Derived>
struct SegmentedAlgorithm : SegmentedSettings {
  /*! \brief Starts a sum-allreduce of \p n elements in place.
   *  \tparam T arithmetic element type
   *  \param comm communicator (every rank calls start in the same order)
   *  \param data buffer, untouched until the operation completes
   *  \param n    number of elements */
  template <class T>
  AllreduceOp<T> start(Communicator const& comm, T* data, std::size_t n) const {
    static_assert(summable_v<T>, "telar: an allreduce's element type must be arithmetic");
    if (comm.size() == 1 || n == 0)
      return AllreduceOp<T>();
    return static_cast<Derived const&>(*this).start_segments(comm, data, n);
  }
  /*! \brief Blocking sum-allreduce in place (bounded), default settings.
   *  \tparam T arithmetic element type \param comm communicator
   *  \param data buffer \param n number of elements */
  template <class T>
  static void allreduce(Communicator const& comm, T* data, std::size_t n) {
    Derived{}.start(comm, data, n).wait();
  }
};

// A segmented algorithm over the communicator itself: its schedule is
// Derived::plan(s, rank, size, n), whatever the element type (compiled
// once), and Derived::label names it in traces and messages.
template <class Derived>
struct FlatAlgorithm : SegmentedAlgorithm<Derived> {
private:
  friend SegmentedAlgorithm<Derived>;
  template <class T>
  AllreduceOp<T> start_segments(Communicator const& comm, T* data, std::size_t n) const {
    auto& h = *comm.handle_ptr();
    Schedule s;
    s.seg = this->template segment_elements<T>();
    Derived::plan(s, h.rank, h.size, n);
    return start_schedule<T>(comm, Derived::label, data, std::move(s), *this, {coll_of<T>(h)});
  }
};
} // namespace detail

/*! \brief Ring allreduce: reduce-scatter then allgather around a ring,
 *         2(p-1) steps, each transfer cut into segments and pipelined.
 *
 *  Cost: 2(p-1)α + 2(p-1)/p·nβ + (p-1)/p·nγ (bandwidth-optimal; latency grows
 *  with p). Every rank ends with bitwise identical results.
 */
struct RingAllreduce : detail::FlatAlgorithm<RingAllreduce> {
  /*! \brief Name for logs and traces. */
  static constexpr const char* name() { return "ring"; }
  /*! \brief Name in traces and messages. */
  static constexpr const char* label = "telar::RingAllreduce";
  /*! \brief The schedule on rank \p rank of \p size for \p n elements. */
  static void plan(detail::Schedule& s, int rank, int size, std::size_t n) {
    detail::ring_reduce_scatter(s, 0, rank, size, 0, n);
    detail::ring_allgather(s, 0, rank, size, 0, n);
  }
};

/*! \brief Rabenseifner's allreduce: reduce-scatter by recursive halving,
 *         allgather by recursive doubling.
 *
 *  Cost for p a power of two: 2·log2(p)α + 2(p-1)/p·nβ + (p-1)/p·nγ. Other p
 *  fold the extra ranks in first (each even rank among the first 2(p-p')
 *  hands its vector to the next odd rank, p' the largest power of two ≤ p)
 *  and send them the result at the end: + 2α + 2nβ + nγ. Every rank ends with
 *  bitwise identical results.
 */
struct RecursiveHalvingDoubling : detail::FlatAlgorithm<RecursiveHalvingDoubling> {
  /*! \brief Name for logs and traces. */
  static constexpr const char* name() { return "recursive_halving_doubling"; }
  /*! \brief Name in traces and messages. */
  static constexpr const char* label = "telar::RecursiveHalvingDoubling";
  /*! \brief The schedule on rank \p rank of \p size for \p n elements. */
  static void plan(detail::Schedule& s, int rank, int size, std::size_t n) {
    detail::recursive_halving_doubling(s, 0, rank, size, n);
  }
};

/*! \brief Two-level allreduce after IBM's DDL: reduce-scatter inside each
 *         group of consecutive ranks (a node), ring-allreduce each rank's
 *         block across the groups, allgather inside the group.
 *
 *  A communicator of p ranks is viewed as (p / g) groups of g consecutive
 *  ranks: rank = group · g + local. Only 1/g of the data crosses between
 *  groups per rank, so the slow links carry g times less per process. With
 *  `group_size = 0` (default) g is the node size from
 *  MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) when every node holds the same
 *  number of consecutive ranks and there are at least two nodes; otherwise
 *  the divisor of p closest to √p (so a single node of 4 ranks is 2 × 2).
 *
 *  Cost with q = p / g: 2(g-1)α_in + 2(g-1)/g·nβ_in + 2(q-1)α_out +
 *  2(q-1)/(q·g)·nβ_out + (p-1)/p·nγ. Every rank ends with bitwise identical
 *  results. The sub-communicators are created on the first call (collective)
 *  and cached with the communicator.
 */
struct HierarchicalAllreduce : detail::SegmentedAlgorithm<HierarchicalAllreduce> {
  /*! \brief Ranks per group; 0 chooses automatically (see the class description). */
  int group_size = 0;

  /*! \brief Name for logs and traces. */
  static constexpr const char* name() { return "hierarchical"; }

  /*! \brief Default: automatic group size. */
  HierarchicalAllreduce() = default;
  /*! \brief Explicit group size.
   *  \param group ranks per group; must divide the communicator size (0: automatic)
   */
  explicit HierarchicalAllreduce(int group) : group_size(group) {}

  /*! \brief The group size start() uses on \p comm (collective on first use).
   *  \param comm communicator
   */
  int group_size_for(Communicator const& comm) const {
    return resolve_group_size(*comm.handle_ptr());
  }

private:
  friend detail::SegmentedAlgorithm<HierarchicalAllreduce>;
  // Throws telar::CommError if group_size does not divide comm.size() (on every rank).
  template <class T>
  AllreduceOp<T> start_segments(Communicator const& comm, T* data, std::size_t n) const {
    auto& h = *comm.handle_ptr();
    int const g = resolve_group_size(h);
    auto& subs = sub_comms(h, g);
    auto& inner = *subs.first;
    auto& outer = *subs.second;
    int const q = h.size / g;
    int const local = h.rank % g, group = h.rank / g;
    detail::Schedule s;
    s.seg = segment_elements<T>();
    int const owned = detail::ring_reduce_scatter(s, 0, local, g, 0, n);
    std::size_t const b0 = detail::block_begin(n, g, owned), bn = detail::block_size(n, g, owned);
    detail::ring_reduce_scatter(s, 1, group, q, b0, bn);
    detail::ring_allgather(s, 1, group, q, b0, bn);
    detail::ring_allgather(s, 0, local, g, 0, n);
    return detail::start_schedule<T>(comm, "telar::HierarchicalAllreduce", data, std::move(s),
                                     *this, {detail::coll_of<T>(inner), detail::coll_of<T>(outer)});
  }

  TELAR_DECL int resolve_group_size(detail::CommHandle& h) const;

  // Node size if nodes form a regular grid of consecutive ranks, else the
  // divisor of p nearest to sqrt(p) (from above, so groups are the larger side).
  TELAR_DECL static int auto_group_size(detail::CommHandle& h);

  TELAR_DECL static std::pair<std::shared_ptr<detail::CommHandle>,
                              std::shared_ptr<detail::CommHandle>>&
  sub_comms(detail::CommHandle& h, int g);
};

/*! \brief How TopologyAwareAllreduce chooses (see there). */
enum class AllreduceMode {
  automatic,   //!< hierarchical when the ranks span several regular nodes, else flat
  flat,        //!< always RingAllreduce
  hierarchical //!< always HierarchicalAllreduce (node size, or √p groups on one node)
};

/*! \brief Ring or hierarchical allreduce, chosen from where the ranks run;
 *         the default of telar::DataParallel.
 *
 *  With AllreduceMode::automatic it runs HierarchicalAllreduce with one group
 *  per node when the communicator spans at least two nodes of the same number
 *  (at least two) of consecutive ranks (telar::node_layout), and RingAllreduce
 *  otherwise, so one node, one rank per node, or an irregular layout keeps the
 *  flat ring. The environment variable `TELAR_ALLREDUCE` (`auto`, `flat` or
 *  `hierarchical`), when set, overrides `mode`: the same binary can be timed
 *  both ways. The node layout is detected on the first call for a
 *  communicator (collective) and cached with it.
 */
struct TopologyAwareAllreduce : detail::SegmentedAlgorithm<TopologyAwareAllreduce> {
  /*! \brief The choice when `TELAR_ALLREDUCE` is unset. */
  AllreduceMode mode = AllreduceMode::automatic;

  /*! \brief Name for logs and traces. */
  static constexpr const char* name() { return "topology_aware"; }

  /*! \brief The mode in effect: `TELAR_ALLREDUCE` if set, else `mode`.
   *  \param comm communicator (names the rank in the error)
   *  \throws telar::CommError if `TELAR_ALLREDUCE` is not auto, flat or hierarchical
   */
  TELAR_DECL AllreduceMode effective_mode(Communicator const& comm) const;

  /*! \brief What start() runs on \p comm: 0 for the flat ring, else the
   *  hierarchical group size (1: HierarchicalAllreduce's own choice, when
   *  forced on a layout without regular nodes). Collective on first use.
   *  \param comm communicator
   */
  TELAR_DECL int group_size_for(Communicator const& comm) const;

private:
  friend detail::SegmentedAlgorithm<TopologyAwareAllreduce>;
  // Throws telar::CommError if `TELAR_ALLREDUCE` or `TELAR_RANKS_PER_NODE` is invalid.
  template <class T>
  AllreduceOp<T> start_segments(Communicator const& comm, T* data, std::size_t n) const {
    int const g = group_size_for(comm);
    if (g == 0) {
      RingAllreduce ring;
      static_cast<SegmentedSettings&>(ring) = *this;
      return ring.start(comm, data, n);
    }
    HierarchicalAllreduce hier(g == 1 ? 0 : g);
    static_cast<SegmentedSettings&>(hier) = *this;
    return hier.start(comm, data, n);
  }
};

/*! \cond */
template <>
struct is_allreduce_algorithm<MpiAllreduce> : std::true_type {};
template <>
struct is_allreduce_algorithm<RingAllreduce> : std::true_type {};
template <>
struct is_allreduce_algorithm<RecursiveHalvingDoubling> : std::true_type {};
template <>
struct is_allreduce_algorithm<HierarchicalAllreduce> : std::true_type {};
template <>
struct is_allreduce_algorithm<TopologyAwareAllreduce> : std::true_type {};
/*! \endcond */

namespace detail {
template <class A, class = void>
struct reduces_on_host : std::true_type {}; // unknown: assume host arithmetic, stage
template <class A>
struct reduces_on_host<A, std::void_t<decltype(A::reduces_on_host)>>
    : std::bool_constant<A::reduces_on_host> {};
} // namespace detail

/*! \brief Whether \p Algorithm's start() may be given a pointer to device
 *  memory: only when Telar was configured with `TELAR_ENABLE_GPU_AWARE_MPI`
 *  and the algorithm leaves the arithmetic to MPI (`reduces_on_host` false,
 *  as MpiAllreduce). An algorithm without `reduces_on_host` is assumed to
 *  add on the host.
 *  \tparam Algorithm an allreduce algorithm policy */
template <class Algorithm>
inline constexpr bool allreduce_accepts_device_pointers_v =
    TELAR_ENABLE_GPU_AWARE_MPI && !detail::reduces_on_host<std::remove_cv_t<Algorithm>>::value;

/*! \brief A buffer for allreducing a view with \p Algorithm: the view itself
 *  when the algorithm can use its memory, else a host copy (see HostBuffer).
 *  \code
 *  telar::AllreduceBuffer<decltype(grad), telar::RingAllreduce> buf(grad);
 *  telar::RingAllreduce::allreduce(comm, buf.data(), buf.size());
 *  buf.copy_back();
 *  \endcode
 *  \tparam View a contiguous Kokkos::View \tparam Algorithm an allreduce algorithm policy */
template <class View, class Algorithm>
using AllreduceBuffer = HostBuffer<View, allreduce_accepts_device_pointers_v<Algorithm>>;

/*! \brief Blocking sum-allreduce in place with the configured \p algorithm.
 *  \tparam Algorithm a policy with is_allreduce_algorithm_v true
 *  \tparam T arithmetic element type
 *  \param algorithm policy object (carries its settings)
 *  \param comm communicator
 *  \param data buffer
 *  \param n    number of elements
 */
template <class Algorithm, class T>
void allreduce(Algorithm const& algorithm, Communicator const& comm, T* data, std::size_t n) {
  static_assert(is_allreduce_algorithm_v<Algorithm>,
                "telar::allreduce: Algorithm is not an allreduce algorithm; use MpiAllreduce, "
                "RingAllreduce, RecursiveHalvingDoubling, HierarchicalAllreduce or "
                "TopologyAwareAllreduce, or specialise "
                "telar::is_allreduce_algorithm for your own");
  algorithm.start(comm, data, n).wait();
}

} // namespace telar

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/comm/allreduce.ipp>
#endif
