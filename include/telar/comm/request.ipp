// What telar/comm/request.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/comm/request.hpp>

namespace telar {

TELAR_DECL bool Request::test() {
  if (!active())
    return true;
  detail::progress_all();
  int flag = 0;
  int const rc = MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS)
    comm_->fail(rc, op_, peer_, tag_, direction());
  return flag != 0;
}

TELAR_DECL void Request::wait() {
  if (!active())
    return;
  detail::wait_request(*comm_, req_, MPI_STATUS_IGNORE, op_, peer_, tag_, direction());
}

TELAR_DECL const char* Request::direction() const noexcept {
  return kind_ == detail::RequestKind::send   ? "to"
         : kind_ == detail::RequestKind::recv ? "from"
                                              : "with";
}

TELAR_DECL void Request::swap(Request& o) noexcept {
  std::swap(req_, o.req_);
  std::swap(kind_, o.kind_);
  std::swap(op_, o.op_);
  std::swap(peer_, o.peer_);
  std::swap(tag_, o.tag_);
  std::swap(comm_, o.comm_);
}

TELAR_DECL void Request::release() noexcept {
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

TELAR_DECL void wait_all(std::vector<Request>& requests) {
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
