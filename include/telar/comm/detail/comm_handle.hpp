#pragma once
// Shared state behind a telar::Communicator: the duplicated MPI_Comm, its
// name and timeout, the lazily created communicator Telar's own algorithms
// talk on, a tag counter and a scratch pool. Requests and in-flight
// operations hold a shared_ptr to it, so the MPI_Comm outlives them even if
// the Communicator object is destroyed first.

#include <telar/comm/detail/heartbeat.hpp>
#include <telar/comm/detail/liveness.hpp>
#include <telar/comm/detail/progress.hpp>
#include <telar/comm/error.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace telar::detail {

inline bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
    return "unknown MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(len));
}

// "rank 0 of 4 (communicator 'world')"
inline std::string where(int rank, int size, std::string const& name) {
  std::ostringstream os;
  os << "rank " << rank << " of " << size << " (communicator '" << name << "')";
  return os.str();
}

// "MPI_Recv from rank 1 (tag 7)": the operation and its peer.
inline std::string what_op(const char* op, int peer, int tag, const char* direction) {
  std::ostringstream os;
  os << op;
  if (peer >= 0)
    os << ' ' << direction << " rank " << peer;
  if (tag >= 0)
    os << " (tag " << tag << ')';
  return os.str();
}

// Timeout from TELAR_COMM_TIMEOUT, or the default. Every rank reads the same
// environment, so a malformed value raises the same error everywhere.
inline double timeout_from_env() {
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

// 64-byte aligned, reusable scratch storage.
struct ScratchBuffer {
  struct Free {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t(64)); }
  };
  std::unique_ptr<std::byte[], Free> data;
  std::size_t bytes = 0;
};

struct CommHandle {
  MPI_Comm comm = MPI_COMM_NULL; // the dup the user's calls run on
  MPI_Comm coll = MPI_COMM_NULL; // Telar's algorithms' point-to-point traffic
  int rank = -1;
  int size = 0;
  std::string name;
  double timeout = default_timeout_seconds;
  unsigned tag_seq = 0;
  std::vector<ScratchBuffer> scratch;
  // Sub-communicators made for HierarchicalAllreduce, keyed by group size.
  std::map<int, std::pair<std::shared_ptr<CommHandle>, std::shared_ptr<CommHandle>>> hier;
  int auto_group_size = 0;
  // Ranks per node if a two-level allreduce fits, else 1; 0 until detected.
  int node_group = 0;
  // Every rank's host and pid (see liveness.hpp), by rank; empty until exchanged.
  std::vector<PeerInfo> peers;
  // Seconds a peer on this host may stay stopped (TELAR_STOPPED_TIMEOUT), and
  // how long each has been (the watch's record, updated by const waits).
  double stop_timeout = 30.0;
  mutable StoppedPeers stopped;
  // Every rank's heartbeat endpoint (see heartbeat.hpp), by rank.
  std::vector<HeartbeatEndpoint> beats;
  // Bytes this rank handed to MPI to send (see Communicator::bytes_sent).
  std::uint64_t bytes_sent = 0;
  // Ring-equivalent bytes this rank sends in a collective moving `total`
  // bytes over the group in all: (size - 1) / size of them.
  void count_collective(double total) {
    if (size > 1)
      bytes_sent += static_cast<std::uint64_t>(total * double(size - 1) / double(size));
  }

  CommHandle() = default;
  CommHandle(CommHandle const&) = delete;
  CommHandle& operator=(CommHandle const&) = delete;
  ~CommHandle() {
    // MPI_Comm_free after MPI_Finalize is erroneous; the comms die with MPI.
    if (mpi_finalized())
      return;
    if (coll != MPI_COMM_NULL)
      MPI_Comm_free(&coll);
    if (comm != MPI_COMM_NULL)
      MPI_Comm_free(&comm);
  }

  std::string where() const { return detail::where(rank, size, name); }

  [[noreturn]] void fail(int code, const char* op, int peer = -1, int tag = -1,
                         const char* direction = "with") const {
    throw CommError(what_op(op, peer, tag, direction) + " failed on " + where() + ": " +
                        mpi_error_string(code),
                    rank, op, peer, code);
  }
  void check(int code, const char* op, int peer = -1, int tag = -1,
             const char* direction = "with") const {
    if (code != MPI_SUCCESS)
      fail(code, op, peer, tag, direction);
  }
  [[noreturn]] void timed_out(double waited, std::string const& what, const char* op,
                              int peer) const {
    std::ostringstream os;
    os.precision(3);
    os << what << " timed out after " << waited << " s on " << where()
       << "; the peer may have failed, be stuck, or call the operations in a different "
          "order (raise the bound with TELAR_COMM_TIMEOUT=<seconds> or "
          "Communicator::set_timeout, 0 = no bound)";
    os << stopped_peers();
    throw CommTimeout(os.str(), rank, op, peer, waited);
  }

  // A wait's watch: throws PeerLost when `peer` (every rank for -1) is on
  // this host and its process is gone, or has been stopped by a signal for
  // stop_timeout seconds.
  void check_peers(std::string const& what, const char* op, int peer) const {
    if (peers.empty())
      return;
    PeerInfo const& self = peers[static_cast<std::size_t>(rank)];
    int const lo = peer >= 0 ? peer : 0, hi = peer >= 0 ? peer + 1 : size;
    for (int r = lo; r < hi && r < int(peers.size()); ++r) {
      if (r == rank)
        continue;
      PeerInfo const& p = peers[std::size_t(r)];
      auto const waiting = [&] {
        return "; rank " + std::to_string(rank) + " was waiting for it in " + what + " on " +
               where();
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

  // A wait's watch for peers on other hosts: throws PeerLost naming their
  // hosts when any rank of the communicator there has been silent past the
  // heartbeat bound (none of the communicator's operations can then finish).
  void check_heartbeats(std::string const& what, const char* op) const {
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

  // "; rank 3 (pid 1234 on host x) is stopped": peers on this host that are
  // alive but do not run (SIGSTOP, a debugger), for the timeout message.
  std::string stopped_peers() const {
    std::string out;
    if (peers.empty())
      return out;
    for (int r = 0; r < int(peers.size()); ++r)
      if (r != rank &&
          peer_state(peers[std::size_t(r)], peers[std::size_t(rank)]) == PeerState::stopped)
        out += "; " + describe_peer(peers[std::size_t(r)]) + " is stopped (SIGSTOP or a debugger)";
    return out;
  }

  // Next tag for one of Telar's own operations on `coll`. All ranks start
  // operations in the same order (as with MPI collectives), so they agree on
  // it; distinct tags keep concurrent operations' messages apart.
  int next_tag() {
    int const t = 1 + static_cast<int>(tag_seq % 32000u);
    ++tag_seq;
    return t;
  }

  // Takes a buffer of at least `bytes` out of the pool (or allocates one).
  ScratchBuffer take_scratch(std::size_t bytes) {
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
  // Returns a buffer to the pool; keeps a few so repeated calls reuse memory
  // (no page faults on the second call) without hoarding.
  void give_scratch(ScratchBuffer&& b) {
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
};

// Waits for one request with the communicator's bound. `what` describes the
// operation for the timeout message.
inline void wait_request(CommHandle const& h, MPI_Request& req, MPI_Status* status, const char* op,
                         int peer, int tag, const char* direction) {
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

// A barrier that throws CommTimeout instead of hanging; put before blocking
// collectives that have no non-blocking form (MPI_Comm_split...).
inline void bounded_barrier(CommHandle const& h) {
  MPI_Request req = MPI_REQUEST_NULL;
  h.check(MPI_Ibarrier(h.comm, &req), "MPI_Ibarrier");
  wait_request(h, req, MPI_STATUS_IGNORE, "MPI_Barrier", -1, -1, "with");
}

// Every rank's pair (a, b), by rank: [a0, b0, a1, b1, ...] (bounded
// collective; `what` names it in a timeout message).
inline std::vector<int> allgather_pairs(CommHandle const& h, int a, int b, const char* what) {
  int const mine[2] = {a, b};
  std::vector<int> all(2 * static_cast<std::size_t>(h.size));
  MPI_Request req = MPI_REQUEST_NULL;
  h.check(MPI_Iallgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, h.comm, &req), "MPI_Iallgather");
  wait_request(h, req, MPI_STATUS_IGNORE, what, -1, -1, "with");
  return all;
}

// Every rank's host and pid, for the liveness watch (bounded collective).
// The heartbeat endpoints travel in the same message; the monitor sends to
// the members from then on.
inline void exchange_peers(CommHandle& h) {
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

// Makes a fresh handle owning `comm` (already a private communicator).
inline std::shared_ptr<CommHandle> adopt(MPI_Comm comm, std::string name, double timeout) {
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

// MPI_Comm_dup, but bounded: a missing rank gives a CommTimeout, not a hang.
inline MPI_Comm bounded_dup(MPI_Comm parent, CommHandle const& errors) {
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

// The communicator Telar's algorithms use, created on first use (collective:
// every rank reaches it in the same operation).
inline MPI_Comm coll_comm(CommHandle& h) {
  if (h.coll == MPI_COMM_NULL) {
    h.coll = bounded_dup(h.comm, h);
    MPI_Comm_set_errhandler(h.coll, MPI_ERRORS_RETURN);
  }
  return h.coll;
}

} // namespace telar::detail
