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
#include <telar/core/detail/decl.hpp>

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

TELAR_DECL bool mpi_finalized();

TELAR_DECL std::string mpi_error_string(int code);

// "rank 0 of 4 (communicator 'world')"
TELAR_DECL std::string where(int rank, int size, std::string const& name);

// "MPI_Recv from rank 1 (tag 7)": the operation and its peer.
TELAR_DECL std::string what_op(const char* op, int peer, int tag, const char* direction);

// Timeout from TELAR_COMM_TIMEOUT, or the default. Every rank reads the same
// environment, so a malformed value raises the same error everywhere.
TELAR_DECL double timeout_from_env();

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
  TELAR_DECL ~CommHandle();

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
  TELAR_DECL void check_peers(std::string const& what, const char* op, int peer) const;

  // A wait's watch for peers on other hosts: throws PeerLost naming their
  // hosts when any rank of the communicator there has been silent past the
  // heartbeat bound (none of the communicator's operations can then finish).
  TELAR_DECL void check_heartbeats(std::string const& what, const char* op) const;

  // "; rank 3 (pid 1234 on host x) is stopped": peers on this host that are
  // alive but do not run (SIGSTOP, a debugger), for the timeout message.
  TELAR_DECL std::string stopped_peers() const;

  // Next tag for one of Telar's own operations on `coll`. All ranks start
  // operations in the same order (as with MPI collectives), so they agree on
  // it; distinct tags keep concurrent operations' messages apart.
  TELAR_DECL int next_tag();

  // Takes a buffer of at least `bytes` out of the pool (or allocates one).
  TELAR_DECL ScratchBuffer take_scratch(std::size_t bytes);
  // Returns a buffer to the pool; keeps a few so repeated calls reuse memory
  // (no page faults on the second call) without hoarding.
  TELAR_DECL void give_scratch(ScratchBuffer&& b);
};

// Waits for one request with the communicator's bound. `what` describes the
// operation for the timeout message.
TELAR_DECL void wait_request(CommHandle const& h, MPI_Request& req, MPI_Status* status,
                             const char* op, int peer, int tag, const char* direction);

// A barrier that throws CommTimeout instead of hanging; put before blocking
// collectives that have no non-blocking form (MPI_Comm_split...).
TELAR_DECL void bounded_barrier(CommHandle const& h);

// Every rank's pair (a, b), by rank: [a0, b0, a1, b1, ...] (bounded
// collective; `what` names it in a timeout message).
TELAR_DECL std::vector<int> allgather_pairs(CommHandle const& h, int a, int b, const char* what);

// Every rank's host and pid, for the liveness watch (bounded collective).
// The heartbeat endpoints travel in the same message; the monitor sends to
// the members from then on.
TELAR_DECL void exchange_peers(CommHandle& h);

// Makes a fresh handle owning `comm` (already a private communicator).
TELAR_DECL std::shared_ptr<CommHandle> adopt(MPI_Comm comm, std::string name, double timeout);

// MPI_Comm_dup, but bounded: a missing rank gives a CommTimeout, not a hang.
TELAR_DECL MPI_Comm bounded_dup(MPI_Comm parent, CommHandle const& errors);

// The communicator Telar's algorithms use, created on first use (collective:
// every rank reaches it in the same operation).
TELAR_DECL MPI_Comm coll_comm(CommHandle& h);

} // namespace telar::detail

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/comm/detail/comm_handle.ipp>
#endif
