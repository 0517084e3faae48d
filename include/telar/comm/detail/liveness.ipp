// What telar/comm/detail/liveness.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/comm/detail/liveness.hpp>

namespace telar::detail {

TELAR_DECL void read_line(char const* path, char* out, std::size_t n) {
  out[0] = 0;
  if (std::FILE* f = std::fopen(path, "r")) {
    if (std::fgets(out, int(n), f) == nullptr)
      out[0] = 0;
    std::fclose(f);
    out[std::strcspn(out, "\n")] = 0;
  }
}

TELAR_DECL bool read_proc_stat(long long pid, char& state, unsigned long long& start) {
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

TELAR_DECL PeerInfo self_peer_info(int rank) {
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

TELAR_DECL PeerState peer_state(PeerInfo const& peer, PeerInfo const& self) {
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

TELAR_DECL void continue_if_stopped(PeerInfo const& peer, PeerInfo const& self) {
#ifdef TELAR_HAS_POSIX_PROCESSES
  if (peer_state(peer, self) == PeerState::stopped)
    ::kill(static_cast<pid_t>(peer.pid), SIGCONT);
#else
  (void)peer, (void)self;
#endif
}

TELAR_DECL bool signal_stopped(PeerInfo const& peer) {
  char state = 0;
  unsigned long long start = 0;
  return read_proc_stat(peer.pid, state, start) && state == 'T';
}

TELAR_DECL double stopped_timeout_from_env() {
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

TELAR_DECL double StoppedPeers::seconds(int r, bool stopped, double gap) {
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

} // namespace telar::detail
