// What telar/comm/detail/comm_handle.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/comm/detail/comm_handle.hpp>

namespace telar::detail {

TELAR_DECL bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

TELAR_DECL std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
    return "unknown MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(len));
}

TELAR_DECL std::string where(int rank, int size, std::string const& name) {
  std::ostringstream os;
  os << "rank " << rank << " of " << size << " (communicator '" << name << "')";
  return os.str();
}

TELAR_DECL std::string what_op(const char* op, int peer, int tag, const char* direction) {
  std::ostringstream os;
  os << op;
  if (peer >= 0)
    os << ' ' << direction << " rank " << peer;
  if (tag >= 0)
    os << " (tag " << tag << ')';
  return os.str();
}

TELAR_DECL double timeout_from_env() {
  const char* s = std::getenv("TELAR_COMM_TIMEOUT");
  if (s == nullptr || *s == '\0')
    return default_timeout_seconds;
  char* end = nullptr;
  double const v = std::strtod(s, &end);
  if (end == s || *end != '\0' || !(v >= 0)) {
    throw CommError(std::string("telar::Communicator: TELAR_COMM_TIMEOUT='") + s +
                        "' is not a number of seconds >= 0 (0 means no bound)",
                    -1, "TELAR_COMM_TIMEOUT");
  }
  return v;
}

TELAR_DECL CommHandle::~CommHandle() {
  // MPI_Comm_free after MPI_Finalize is erroneous; the comms die with MPI.
  if (mpi_finalized())
    return;
  if (coll != MPI_COMM_NULL)
    MPI_Comm_free(&coll);
  if (comm != MPI_COMM_NULL)
    MPI_Comm_free(&comm);
}

TELAR_DECL void CommHandle::check_peers(std::string const& what, const char* op, int peer) const {
  if (peers.empty())
    return;
  PeerInfo const& self = peers[static_cast<std::size_t>(rank)];
  int const lo = peer >= 0 ? peer : 0, hi = peer >= 0 ? peer + 1 : size;
  for (int r = lo; r < hi && r < int(peers.size()); ++r) {
    if (r == rank)
      continue;
    PeerInfo const& p = peers[std::size_t(r)];
    auto const waiting = [&] {
      return "; rank " + std::to_string(rank) + " was waiting for it in " + what + " on " + where();
    };
    PeerState const state = peer_state(p, self);
    if (state == PeerState::gone)
      throw PeerLost(describe_peer(p) + " is gone" + waiting(), rank, op, r);
    bool const by_signal = state == PeerState::stopped && signal_stopped(p);
    double const s = stop_timeout > 0 ? stopped.seconds(r, by_signal) : 0;
    if (stop_timeout > 0 && s >= stop_timeout)
      throw PeerLost(describe_peer(p) + " has been stopped (SIGSTOP) for " +
                         std::to_string(int(s)) + " s" + waiting() +
                         " (TELAR_STOPPED_TIMEOUT=" + std::to_string(int(stop_timeout)) +
                         "; 0 waits for the communication timeout)",
                     rank, op, r);
  }
  check_heartbeats(what, op);
}

TELAR_DECL void CommHandle::check_heartbeats(std::string const& what, const char* op) const {
  double silence = 0;
  bool never = false;
  std::vector<int> const lost = silent_remote_peers(peers, beats, rank, silence, never);
  if (lost.empty())
    return;
  std::ostringstream os;
  os.precision(3);
  os << "lost " << describe_hosts(peers, lost) << ": no heartbeat for " << silence << " s"
     << (never ? " (none since the addresses were exchanged)" : "")
     << " (the processes died or were stopped, or the link is down); rank " << rank
     << " was waiting in " << what << " on " << where();
  throw PeerLost(os.str(), rank, op, lost.front());
}

TELAR_DECL std::string CommHandle::stopped_peers() const {
  std::string out;
  if (peers.empty())
    return out;
  for (int r = 0; r < int(peers.size()); ++r)
    if (r != rank &&
        peer_state(peers[std::size_t(r)], peers[std::size_t(rank)]) == PeerState::stopped)
      out += "; " + describe_peer(peers[std::size_t(r)]) + " is stopped (SIGSTOP or a debugger)";
  return out;
}

TELAR_DECL int CommHandle::next_tag() {
  int const t = 1 + static_cast<int>(tag_seq % 32000u);
  ++tag_seq;
  return t;
}

TELAR_DECL ScratchBuffer CommHandle::take_scratch(std::size_t bytes) {
  std::size_t best = scratch.size();
  for (std::size_t i = 0; i < scratch.size(); ++i) {
    if (scratch[i].bytes >= bytes &&
        (best == scratch.size() || scratch[i].bytes < scratch[best].bytes))
      best = i;
  }
  if (best != scratch.size()) {
    ScratchBuffer b = std::move(scratch[best]);
    scratch.erase(scratch.begin() + static_cast<std::ptrdiff_t>(best));
    return b;
  }
  ScratchBuffer b;
  std::size_t const rounded = (bytes + 63) / 64 * 64;
  b.data.reset(static_cast<std::byte*>(::operator new[](rounded, std::align_val_t(64))));
  b.bytes = rounded;
  return b;
}

TELAR_DECL void CommHandle::give_scratch(ScratchBuffer&& b) {
  if (!b.data)
    return;
  scratch.push_back(std::move(b));
  if (scratch.size() > 8) {
    auto smallest = scratch.begin();
    for (auto it = scratch.begin(); it != scratch.end(); ++it)
      if (it->bytes < smallest->bytes)
        smallest = it;
    scratch.erase(smallest);
  }
}

TELAR_DECL void wait_request(CommHandle const& h, MPI_Request& req, MPI_Status* status,
                             const char* op, int peer, int tag, const char* direction) {
  wait_until(
      [&] {
        int flag = 0;
        int const rc = MPI_Test(&req, &flag, status ? status : MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
          h.fail(rc, op, peer, tag, direction);
        return flag != 0;
      },
      h.timeout,
      [&](double waited) { h.timed_out(waited, what_op(op, peer, tag, direction), op, peer); },
      nullptr, [&](double) { h.check_peers(what_op(op, peer, tag, direction), op, peer); });
}

TELAR_DECL void bounded_barrier(CommHandle const& h) {
  MPI_Request req = MPI_REQUEST_NULL;
  h.check(MPI_Ibarrier(h.comm, &req), "MPI_Ibarrier");
  wait_request(h, req, MPI_STATUS_IGNORE, "MPI_Barrier", -1, -1, "with");
}

TELAR_DECL std::vector<int> allgather_pairs(CommHandle const& h, int a, int b, const char* what) {
  int const mine[2] = {a, b};
  std::vector<int> all(2 * static_cast<std::size_t>(h.size));
  MPI_Request req = MPI_REQUEST_NULL;
  h.check(MPI_Iallgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, h.comm, &req), "MPI_Iallgather");
  wait_request(h, req, MPI_STATUS_IGNORE, what, -1, -1, "with");
  return all;
}

TELAR_DECL void exchange_peers(CommHandle& h) {
  struct Record {
    PeerInfo info;
    HeartbeatEndpoint beat;
  };
  HeartbeatMonitor* const monitor = heartbeat_monitor();
  Record const me{self_peer_info(h.rank), monitor ? monitor->endpoint() : HeartbeatEndpoint{}};
  std::vector<Record> all(static_cast<std::size_t>(h.size));
  MPI_Request req = MPI_REQUEST_NULL;
  h.check(MPI_Iallgather(&me, int(sizeof me), MPI_BYTE, all.data(), int(sizeof me), MPI_BYTE,
                         h.comm, &req),
          "MPI_Iallgather");
  wait_request(h, req, MPI_STATUS_IGNORE, "MPI_Allgather (host and pid)", -1, -1, "with");
  for (auto const& r : all) {
    h.peers.push_back(r.info);
    h.beats.push_back(r.beat);
  }
  if (monitor != nullptr)
    monitor->add_peers(h.beats);
}

TELAR_DECL std::shared_ptr<CommHandle> adopt(MPI_Comm comm, std::string name, double timeout) {
  auto h = std::make_shared<CommHandle>();
  h->comm = comm;
  h->name = std::move(name);
  h->timeout = timeout;
  h->stop_timeout = stopped_timeout_from_env();
  if (comm == MPI_COMM_NULL)
    return h;
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  h->check(MPI_Comm_rank(comm, &h->rank), "MPI_Comm_rank");
  h->check(MPI_Comm_size(comm, &h->size), "MPI_Comm_size");
  std::string const mpi_name = "telar:" + h->name;
  MPI_Comm_set_name(comm, mpi_name.c_str());
  exchange_peers(*h);
  return h;
}

TELAR_DECL MPI_Comm bounded_dup(MPI_Comm parent, CommHandle const& errors) {
  // The new handle lives on the heap: when the wait times out, the pending
  // MPI_Comm_idup may still write it after this frame is gone, so it is
  // left allocated then (a few bytes, once, on a job that is ending).
  auto out = std::make_unique<MPI_Comm>(MPI_COMM_NULL);
  MPI_Request req = MPI_REQUEST_NULL;
  errors.check(MPI_Comm_idup(parent, out.get(), &req), "MPI_Comm_idup");
  try {
    wait_request(errors, req, nullptr, "MPI_Comm_idup", -1, -1, "with");
  } catch (...) {
    (void)out.release();
    throw;
  }
  return *out;
}

TELAR_DECL MPI_Comm coll_comm(CommHandle& h) {
  if (h.coll == MPI_COMM_NULL) {
    h.coll = bounded_dup(h.comm, h);
    MPI_Comm_set_errhandler(h.coll, MPI_ERRORS_RETURN);
  }
  return h.coll;
}

} // namespace telar::detail
