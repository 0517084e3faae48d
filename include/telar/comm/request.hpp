#pragma once
/*! \file
 *  \brief telar::Request: a move-only handle to a non-blocking MPI operation.
 */

#include <telar/comm/detail/comm_handle.hpp>
#include <telar/comm/detail/progress.hpp>
#include <telar/core/detail/decl.hpp>

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
    Request(std::move(other)).swap(*this); // the temporary releases what this held
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
  TELAR_DECL bool test();

  /*! \brief Waits for completion, bounded by the communicator's timeout.
   *  \throws telar::CommTimeout when the bound expires (the request stays pending)
   *  \throws telar::CommError when MPI reports an error
   */
  TELAR_DECL void wait();

  /*! \brief The MPI request, for interoperation with plain MPI code. */
  MPI_Request& native() noexcept { return req_; }

private:
  template <class Backend>
  friend class BasicCommunicator;
  friend void wait_all(std::vector<Request>& requests);

  Request(MPI_Request req, detail::RequestKind kind, const char* op, int peer, int tag,
          std::shared_ptr<detail::CommHandle> comm)
      : req_(req), kind_(kind), op_(op), peer_(peer), tag_(tag), comm_(std::move(comm)) {}

  TELAR_DECL const char* direction() const noexcept;

  TELAR_DECL void swap(Request& o) noexcept;

  TELAR_DECL void release() noexcept;

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
TELAR_DECL void wait_all(std::vector<Request>& requests);

} // namespace telar

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/comm/request.ipp>
#endif
