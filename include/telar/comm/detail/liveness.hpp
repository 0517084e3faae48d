#pragma once
// Is a peer still there? MPI has no standard failure notification, so a rank
// waiting on a peer that was killed would wait out the whole timeout. Every
// communicator's ranks exchange host and pid when it is made; a wait that
// has lasted a second asks the operating system about the peers on this host
// (kill(pid, 0), and /proc on Linux for zombies, stopped processes and reused
// pids). Peers on other hosts cannot be asked: for them the timeout remains
// the bound.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

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

// "rank 3 (pid 1234 on host node7)"
inline std::string describe_peer(PeerInfo const& p) {
  return "rank " + std::to_string(p.rank) + " (pid " + std::to_string(p.pid) + " on host " +
         std::string(p.host) + ")";
}

} // namespace telar::detail
