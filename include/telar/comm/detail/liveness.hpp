#pragma once
// Is a peer still there? MPI has no standard failure notification, so a rank
// waiting on a peer that was killed would wait out the whole timeout. Every
// communicator's ranks exchange host and pid when it is made; a wait that
// has lasted a second asks the operating system about the peers on this host
// (kill(pid, 0), and /proc on Linux for zombies, stopped processes and reused
// pids). Peers on other hosts cannot be asked: for them the timeout remains
// the bound. A peer stopped by a signal (SIGSTOP, Ctrl-Z) ends the wait
// after TELAR_STOPPED_TIMEOUT seconds of being seen stopped (StoppedPeers).
#include <telar/comm/error.hpp>
#include <telar/core/detail/decl.hpp>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>
#define TELAR_HAS_POSIX_PROCESSES 1
#endif

namespace telar::detail {

// What a rank tells the others about itself (exchanged as bytes).
struct PeerInfo {
  long long pid = -1;
  unsigned long long start = 0; // process start time (Linux /proc), 0 if unknown
  int rank = -1;                // rank in the communicator that exchanged it
  char host[64] = {};
  // The same host for certain: the kernel's boot id and the pid namespace
  // (Linux; empty elsewhere), so equal host names on different machines or
  // containers never make a stranger's pid look like the peer's.
  char boot_id[40] = {};
  char pid_ns[40] = {};
};

// The first line of a small file, or "" (Linux /proc and /proc/sys).
TELAR_DECL void read_line(char const* path, char* out, std::size_t n);

enum class PeerState { alive, gone, stopped, unknown };

// Fields of /proc/<pid>/stat after the command name: state (3) and start time (22).
TELAR_DECL bool read_proc_stat(long long pid, char& state, unsigned long long& start);

TELAR_DECL PeerInfo self_peer_info(int rank);

// The state of a peer on this host; unknown for one elsewhere (or without POSIX).
TELAR_DECL PeerState peer_state(PeerInfo const& peer, PeerInfo const& self);

// Lets a stopped peer run again (SIGCONT), for a job being aborted: a
// launcher may end processes with SIGTERM (MPICH's hydra does), which a
// stopped process never acts on, so the job would outlive MPI_Abort.
TELAR_DECL void continue_if_stopped(PeerInfo const& peer, PeerInfo const& self);

// Whether a stopped peer on this host (PeerState::stopped) is stopped by a
// signal (state 'T': SIGSTOP, SIGTSTP), not held by a debugger ('t': a rank
// at a breakpoint must not end the job).
TELAR_DECL bool signal_stopped(PeerInfo const& peer);

// Seconds a wait lets a peer on this host stay stopped by a signal before it
// gives up on it: TELAR_STOPPED_TIMEOUT (default 30; 0: only the
// communication timeout bounds it). Every rank reads the same environment,
// so a malformed value raises the same error everywhere.
TELAR_DECL double stopped_timeout_from_env();

// How long each peer has been seen stopped by a signal, over the checks of
// the waits (once a second while one lasts). A gap between checks longer
// than `gap` seconds starts the count again: the peer may have run then.
class StoppedPeers {
public:
  // Seconds rank r has been seen stopped without a break, now included (0
  // when `stopped` is false).
  TELAR_DECL double seconds(int r, bool stopped, double gap = 2.5);

private:
  struct Seen {
    double first = 0, last = -1e300;
  };
  std::vector<Seen> since_;
};

// "rank 3 (pid 1234 on host node7)"
inline std::string describe_peer(PeerInfo const& p) {
  return "rank " + std::to_string(p.rank) + " (pid " + std::to_string(p.pid) + " on host " +
         std::string(p.host) + ")";
}

} // namespace telar::detail

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/comm/detail/liveness.ipp>
#endif
