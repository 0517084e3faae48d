#pragma once
/*! \file
 *  \brief telar::Request: a move-only handle to a non-blocking MPI operation.
 */

#include <telar/comm/detail/comm_handle.hpp>
#include <telar/comm/detail/progress.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <utility>
#include <vector>

namespace telar {

template <class Backend>
class BasicCommunicator;

namespace detail {
enum class RequestKind : unsigned char { send, recv, collective };
} // namespace detail

/*! \brief A pending non-blocking operation (isend, irecv, iallreduce...).
 *
 *  Move-only. Complete it with test() / wait() (or Communicator::test,
 *  Communicator::wait, Communicator::wait_all); wait() is bounded by the
 *  timeout of the communicator that created it and throws telar::CommTimeout
 *  when the bound expires, leaving the request pending.
 *
 *  Destroying a request that has not completed does not leak and does not
 *  crash: a receive is cancelled (MPI_Cancel), a send is given a bounded time
 *  to complete and then released with MPI_Request_free. A collective cannot
 *  be cancelled or freed under the MPI standard, so after a bounded wait its
 *  handle is abandoned (the job is expected to end through
 *  telar::abort_on_error). During stack unwinding the bound is short, so an
 *  error path does not wait a second time.
 */
class Request {
public:
  /*! \brief An empty (completed) request. */
  Request() = default;
  /*! \brief Takes over the pending operation of another request.
   *  \param other request left empty
   */
  Request(Request&& other) noexcept { swap(other); }
  /*! \brief Finishes (see the class description) the operation held, then
   *         takes over the one of \p other.
   *  \param other request left empty
   */
  Request& operator=(Request&& other) noexcept {
    if (this != &other) {
      release();
      swap(other);
    }
    return *this;
  }
  Request(Request const&) = delete;
  Request& operator=(Request const&) = delete;
  /*! \brief Releases the operation if still pending (see the class description). */
  ~Request() { release(); }

  /*! \brief True while the operation has not been completed by test() or wait(). */
  bool active() const noexcept { return req_ != MPI_REQUEST_NULL; }

  /*! \brief Advances Telar's in-flight operations and tests this one.
   *  \return true when the operation has completed (the request is then empty)
   */
  bool test() {
    if (!active())
      return true;
    detail::progress_all();
    int flag = 0;
    int const rc = MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
      comm_->fail(rc, op_, peer_, tag_, direction());
    return flag != 0;
  }

  /*! \brief Waits for completion, bounded by the communicator's timeout.
   *  \throws telar::CommTimeout when the bound expires (the request stays pending)
   *  \throws telar::CommError when MPI reports an error
   */
  void wait() {
    if (!active())
      return;
    detail::wait_request(*comm_, req_, MPI_STATUS_IGNORE, op_, peer_, tag_, direction());
  }

  /*! \brief The MPI request, for interoperation with plain MPI code. */
  MPI_Request& native() noexcept { return req_; }

private:
  template <class Backend>
  friend class BasicCommunicator;
  friend void wait_all(std::vector<Request>& requests);

  Request(MPI_Request req, detail::RequestKind kind, const char* op, int peer, int tag,
          std::shared_ptr<detail::CommHandle> comm)
      : req_(req), kind_(kind), op_(op), peer_(peer), tag_(tag), comm_(std::move(comm)) {}

  const char* direction() const noexcept {
    return kind_ == detail::RequestKind::send   ? "to"
           : kind_ == detail::RequestKind::recv ? "from"
                                                : "with";
  }

  void swap(Request& o) noexcept {
    std::swap(req_, o.req_);
    std::swap(kind_, o.kind_);
    std::swap(op_, o.op_);
    std::swap(peer_, o.peer_);
    std::swap(tag_, o.tag_);
    std::swap(comm_, o.comm_);
  }

  void release() noexcept {
    if (req_ == MPI_REQUEST_NULL || detail::mpi_finalized()) {
      req_ = MPI_REQUEST_NULL;
      return;
    }
    if (kind_ == detail::RequestKind::recv)
      MPI_Cancel(&req_);
    double const bound =
        std::uncaught_exceptions() > 0 ? 0.05 : (comm_->timeout > 0 ? comm_->timeout : 60.0);
    bool completed = false;
    try {
      detail::wait_until(
          [&] {
            int flag = 0;
            MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
            return flag != 0;
          },
          bound, [](double) { throw 0; });
      completed = true;
    } catch (...) {
    }
    if (!completed && req_ != MPI_REQUEST_NULL) {
      if (kind_ == detail::RequestKind::collective) {
        // Unwinding from an error (a timeout, a lost peer): that error is
        // the news, not the request it leaves behind.
        if (std::uncaught_exceptions() == 0)
          std::fprintf(stderr,
                       "telar: warning: %s: pending %s abandoned by a destroyed telar::Request\n",
                       comm_->where().c_str(), op_);
      } else {
        MPI_Request_free(&req_);
      }
    }
    req_ = MPI_REQUEST_NULL;
  }

  MPI_Request req_ = MPI_REQUEST_NULL;
  detail::RequestKind kind_ = detail::RequestKind::collective;
  const char* op_ = "";
  int peer_ = -1;
  int tag_ = -1;
  std::shared_ptr<detail::CommHandle> comm_;
};

/*! \brief Waits for every request in \p requests, bounded by the timeout of
 *         the communicator of the first pending one.
 *  \param requests requests to complete; all are empty on return
 *  \throws telar::CommTimeout naming the first request still pending when the bound expires
 */
inline void wait_all(std::vector<Request>& requests) {
  Request* first = nullptr;
  for (auto& r : requests)
    if (r.active()) {
      first = &r;
      break;
    }
  if (first == nullptr)
    return;
  detail::wait_until(
      [&] {
        bool all = true;
        for (auto& r : requests) {
          if (!r.active())
            continue;
          int flag = 0;
          int const rc = MPI_Test(&r.req_, &flag, MPI_STATUS_IGNORE);
          if (rc != MPI_SUCCESS)
            r.comm_->fail(rc, r.op_, r.peer_, r.tag_, r.direction());
          all &= flag != 0;
        }
        return all;
      },
      first->comm_->timeout,
      [&](double waited) {
        auto it = std::find_if(requests.begin(), requests.end(),
                               [](Request const& r) { return r.active(); });
        Request& r = *it;
        r.comm_->timed_out(waited, detail::what_op(r.op_, r.peer_, r.tag_, r.direction()), r.op_,
                           r.peer_);
      },
      nullptr,
      [&](double) {
        for (auto& r : requests)
          if (r.active())
            r.comm_->check_peers(detail::what_op(r.op_, r.peer_, r.tag_, r.direction()), r.op_,
                                 r.peer_);
      });
}

} // namespace telar
