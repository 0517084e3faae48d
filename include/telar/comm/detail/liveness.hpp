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
inline void read_line(char const* path, char* out, std::size_t n) {
  out[0] = 0;
  if (std::FILE* f = std::fopen(path, "r")) {
    if (std::fgets(out, int(n), f) == nullptr)
      out[0] = 0;
    std::fclose(f);
    out[std::strcspn(out, "\n")] = 0;
  }
}

enum class PeerState { alive, gone, stopped, unknown };

// Fields of /proc/<pid>/stat after the command name: state (3) and start time (22).
inline bool read_proc_stat(long long pid, char& state, unsigned long long& start) {
#if defined(__linux__)
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%lld/stat", pid);
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr)
    return false;
  char buf[1024];
  std::size_t const n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  char const* p = std::strrchr(buf, ')'); // the command name may hold spaces
  if (p == nullptr)
    return false;
  unsigned long long field = 0;
  // After ')': " S ppid pgrp ... starttime": state is field 3, starttime 22.
  return std::sscanf(p + 1,
                     " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d "
                     "%*d %*d %llu",
                     &state, &field) == 2 &&
         (start = field, true);
#else
  (void)pid, (void)state, (void)start;
  return false;
#endif
}

inline PeerInfo self_peer_info(int rank) {
  PeerInfo me;
  me.rank = rank;
#ifdef TELAR_HAS_POSIX_PROCESSES
  me.pid = static_cast<long long>(::getpid());
  if (::gethostname(me.host, sizeof me.host - 1) != 0)
    me.host[0] = 0;
  char state = 0;
  read_proc_stat(me.pid, state, me.start);
#if defined(__linux__)
  read_line("/proc/sys/kernel/random/boot_id", me.boot_id, sizeof me.boot_id);
  ssize_t const len = ::readlink("/proc/self/ns/pid", me.pid_ns, sizeof me.pid_ns - 1);
  me.pid_ns[len > 0 ? len : 0] = 0;
#endif
#endif
  return me;
}

// The state of a peer on this host; unknown for one elsewhere (or without POSIX).
inline PeerState peer_state(PeerInfo const& peer, PeerInfo const& self) {
#ifdef TELAR_HAS_POSIX_PROCESSES
  if (peer.pid <= 0 || std::strncmp(peer.host, self.host, sizeof peer.host) != 0 ||
      std::strncmp(peer.boot_id, self.boot_id, sizeof peer.boot_id) != 0 ||
      std::strncmp(peer.pid_ns, self.pid_ns, sizeof peer.pid_ns) != 0)
    return PeerState::unknown; // another machine or pid namespace: cannot be asked
  if (::kill(static_cast<pid_t>(peer.pid), 0) != 0 && errno == ESRCH)
    return PeerState::gone;
  char state = 0;
  unsigned long long start = 0;
  if (read_proc_stat(peer.pid, state, start)) {
    if (state == 'Z' || state == 'X' || (peer.start != 0 && start != peer.start))
      return PeerState::gone; // killed and not yet reaped, or the pid was reused
    if (state == 'T' || state == 't')
      return PeerState::stopped;
  }
  return PeerState::alive;
#else
  (void)peer, (void)self;
  return PeerState::unknown;
#endif
}

// Lets a stopped peer run again (SIGCONT), for a job being aborted: a
// launcher may end processes with SIGTERM (MPICH's hydra does), which a
// stopped process never acts on, so the job would outlive MPI_Abort.
inline void continue_if_stopped(PeerInfo const& peer, PeerInfo const& self) {
#ifdef TELAR_HAS_POSIX_PROCESSES
  if (peer_state(peer, self) == PeerState::stopped)
    ::kill(static_cast<pid_t>(peer.pid), SIGCONT);
#else
  (void)peer, (void)self;
#endif
}

// Whether a stopped peer on this host (PeerState::stopped) is stopped by a
// signal (state 'T': SIGSTOP, SIGTSTP), not held by a debugger ('t': a rank
// at a breakpoint must not end the job).
inline bool signal_stopped(PeerInfo const& peer) {
  char state = 0;
  unsigned long long start = 0;
  return read_proc_stat(peer.pid, state, start) && state == 'T';
}

// Seconds a wait lets a peer on this host stay stopped by a signal before it
// gives up on it: TELAR_STOPPED_TIMEOUT (default 30; 0: only the
// communication timeout bounds it). Every rank reads the same environment,
// so a malformed value raises the same error everywhere.
inline double stopped_timeout_from_env() {
  char const* s = std::getenv("TELAR_STOPPED_TIMEOUT");
  if (s == nullptr || *s == '\0')
    return 30.0;
  char* end = nullptr;
  double const v = std::strtod(s, &end);
  if (end == s || *end != '\0' || !(v >= 0))
    throw CommError(std::string("telar::Communicator: TELAR_STOPPED_TIMEOUT='") + s +
                        "' is not a number of seconds >= 0 (0: wait for the communication timeout)",
                    -1, "TELAR_STOPPED_TIMEOUT");
  return v;
}

// How long each peer has been seen stopped by a signal, over the checks of
// the waits (once a second while one lasts). A gap between checks longer
// than `gap` seconds starts the count again: the peer may have run then.
class StoppedPeers {
public:
  // Seconds rank r has been seen stopped without a break, now included (0
  // when `stopped` is false).
  double seconds(int r, bool stopped, double gap = 2.5) {
    using clock = std::chrono::steady_clock;
    double const now = std::chrono::duration<double>(clock::now().time_since_epoch()).count();
    if (std::size_t(r) >= since_.size())
      since_.resize(std::size_t(r) + 1, Seen{});
    Seen& s = since_[std::size_t(r)];
    if (!stopped || now - s.last > gap)
      s.first = now;
    s.last = stopped ? now : -1e300;
    return stopped ? now - s.first : 0.0;
  }

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
