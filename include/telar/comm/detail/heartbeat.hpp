#pragma once
// Is a peer on another host still there? liveness.hpp asks the operating
// system about peers on this host; a peer elsewhere cannot be asked, and MPI
// notices neither a stopped process nor a link that went down (its TCP
// connection just stops delivering), so a wait would last until the
// communication timeout (300 s). Here every process sends a small UDP
// datagram to every peer once a second from a thread of its own, and a wait
// that has lasted a second (the liveness watch) declares a remote peer lost
// after TELAR_HEARTBEAT_TIMEOUT seconds (default 10) without one.
//
// Why UDP from a thread and not messages on a duplicated communicator: the
// heartbeats must flow while a rank computes for minutes without calling
// MPI (a forward pass, a checkpoint), which a thread sending on MPI would
// only do under MPI_THREAD_MULTIPLE (slower locks on every MPI call of the
// run); and over a link that went down a datagram is simply not delivered,
// where an MPI send can sit in the library's TCP buffers. One process-wide
// monitor serves every communicator; its thread wakes once a second.
//
// A peer never heard (it died or lost its link before its first heartbeat)
// counts as lost once the bound has passed since its address was exchanged,
// but only if some other remote peer has been heard: where datagrams cannot
// pass at all (a firewall, an address that does not route), no heartbeat
// ever arrives and the communication timeout remains the bound, rather than
// a healthy job being ended.
#include <telar/comm/detail/liveness.hpp>
#include <telar/comm/error.hpp>
#include <telar/core/detail/decl.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__) || defined(__APPLE__)
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#define TELAR_HAS_HEARTBEAT 1
#endif

namespace telar::detail {

// Where a process listens for heartbeats (exchanged as bytes with PeerInfo).
// token identifies the process (0: it sends none); addrs are IPv4 addresses
// in network byte order, every non-loopback one the host has (up to 4), or
// 127.0.0.1 when it has none.
struct HeartbeatEndpoint {
  std::uint64_t token = 0;
  std::uint32_t addrs[4] = {};
  std::uint16_t port = 0; // network byte order
  std::uint16_t naddrs = 0;
};

// Seconds of silence after which a remote peer is lost, from
// TELAR_HEARTBEAT_TIMEOUT (0: no heartbeats). Every rank reads the same
// environment, so a malformed value raises the same error everywhere.
TELAR_DECL double heartbeat_timeout_from_env();

#ifdef TELAR_HAS_HEARTBEAT

// The datagram: a magic word (so a stray packet is ignored) and the token.
struct HeartbeatPacket {
  char magic[8] = {'t', 'e', 'l', 'a', 'r', 'h', 'b', '1'};
  std::uint64_t token = 0;
};

class HeartbeatMonitor {
public:
  using clock = std::chrono::steady_clock;

  // Binds the socket and starts the thread; token 0 (endpoint()) if the
  // socket cannot be made, and then no peer is ever judged.
  explicit HeartbeatMonitor(double timeout_s)
      : timeout_(timeout_s), interval_(std::min(1.0, timeout_s / 4)) {
    if (!open_socket())
      return;
    last_tick_ = clock::now();
    // The thread takes no signals: they stay with the application's threads.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    thread_ = std::thread([this] { run(); });
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  HeartbeatMonitor(HeartbeatMonitor const&) = delete;
  HeartbeatMonitor& operator=(HeartbeatMonitor const&) = delete;
  ~HeartbeatMonitor() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable())
      thread_.join();
    if (fd_ >= 0)
      ::close(fd_);
  }

  HeartbeatEndpoint const& endpoint() const { return self_; }
  double timeout() const { return timeout_; }

  // Starts sending to these peers too (a communicator's members; repeats
  // and this process itself are skipped).
  void add_peers(std::vector<HeartbeatEndpoint> const& peers) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto const now = clock::now();
    for (auto const& p : peers)
      if (p.token != 0 && p.token != self_.token && known_.emplace(p.token, p).second) {
        targets_.push_back(p);
        added_[p.token] = now;
      }
  }

  // Seconds since the peer was last heard; negative if never heard, or if
  // this process's own thread has not run for a while (this process was
  // stopped or starved: its record is stale, so nobody is judged from it).
  double silence(std::uint64_t token) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto const now = clock::now();
    if (seconds(now - last_tick_) > 2 * interval_ + 1.0)
      return -1;
    auto const it = heard_.find(token);
    return it == heard_.end() ? -1 : seconds(now - it->second);
  }

  // Seconds since a peer never heard was added (its address exchanged);
  // negative once it has been heard, if unknown, or if this process's own
  // record is stale (as silence).
  double unheard(std::uint64_t token) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto const now = clock::now();
    auto const it = added_.find(token);
    if (seconds(now - last_tick_) > 2 * interval_ + 1.0 || it == added_.end() ||
        heard_.count(token) != 0)
      return -1;
    return seconds(now - it->second);
  }

private:
  static double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }

  bool open_socket() {
    fd_ = ::socket(AF_INET, SOCK_DGRAM, 0);
    if (fd_ < 0)
      return false;
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
    ::fcntl(fd_, F_SETFD, FD_CLOEXEC);
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof any;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&any), sizeof any) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&any), &len) != 0) {
      ::close(fd_);
      fd_ = -1;
      return false;
    }
    self_.port = any.sin_port;
    self_.naddrs = 0;
    list_addresses(self_);
    std::random_device rd;
    self_.token = (std::uint64_t(rd()) << 32 ^ rd() ^ std::uint64_t(::getpid()) << 16) | 1;
    return true;
  }

  // The host's up, non-loopback IPv4 addresses (a peer on another host
  // reaches one of them), or the loopback address alone.
  static void list_addresses(HeartbeatEndpoint& e) {
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) == 0) {
      for (ifaddrs* i = list; i != nullptr && e.naddrs < 4; i = i->ifa_next)
        if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET &&
            (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK))
          e.addrs[e.naddrs++] = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
      ::freeifaddrs(list);
    }
    if (e.naddrs == 0)
      e.addrs[e.naddrs++] = htonl(INADDR_LOOPBACK);
  }

  // Once per interval: note what arrived, send to every peer.
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      receive();
      last_tick_ = clock::now();
      std::vector<HeartbeatEndpoint> const targets = targets_;
      lock.unlock();
      send(targets);
      lock.lock();
      wake_.wait_for(lock, std::chrono::duration<double>(interval_), [this] { return stop_; });
    }
  }

  // Drains the socket (mutex held); a datagram's time is when it is read,
  // at most one interval late.
  void receive() {
    HeartbeatPacket p;
    auto const now = clock::now();
    while (::recv(fd_, &p, sizeof p, 0) == ssize_t(sizeof p))
      if (std::memcmp(p.magic, HeartbeatPacket{}.magic, sizeof p.magic) == 0)
        heard_[p.token] = now;
  }

  // Errors are ignored: an unreachable peer is what the silence measures.
  void send(std::vector<HeartbeatEndpoint> const& targets) const {
    HeartbeatPacket p;
    p.token = self_.token;
    for (auto const& t : targets)
      for (int a = 0; a < t.naddrs && a < 4; ++a) {
        sockaddr_in to{};
        to.sin_family = AF_INET;
        to.sin_port = t.port;
        to.sin_addr.s_addr = t.addrs[a];
        ::sendto(fd_, &p, sizeof p, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&to), sizeof to);
      }
  }

  double timeout_, interval_;
  int fd_ = -1;
  HeartbeatEndpoint self_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  clock::time_point last_tick_;
  std::map<std::uint64_t, HeartbeatEndpoint> known_;
  std::vector<HeartbeatEndpoint> targets_;
  std::map<std::uint64_t, clock::time_point> heard_, added_;
  std::thread thread_;
};

// The process's monitor, started on first use; null when heartbeats are off
// (TELAR_HEARTBEAT_TIMEOUT=0).
inline HeartbeatMonitor* heartbeat_monitor() {
  static double const timeout = heartbeat_timeout_from_env();
  if (timeout <= 0)
    return nullptr;
  static HeartbeatMonitor monitor(timeout);
  return &monitor;
}

#else

// Without POSIX sockets: no heartbeats, the communication timeout is the bound.
class HeartbeatMonitor {
public:
  HeartbeatEndpoint const& endpoint() const { return self_; }
  double timeout() const { return 0; }
  void add_peers(std::vector<HeartbeatEndpoint> const&) {}
  double silence(std::uint64_t) const { return -1; }
  double unheard(std::uint64_t) const { return -1; }

private:
  HeartbeatEndpoint self_;
};

inline HeartbeatMonitor* heartbeat_monitor() {
  (void)heartbeat_timeout_from_env();
  return nullptr;
}

#endif

// The ranks of a communicator on other hosts (or pid namespaces: those
// liveness.hpp cannot ask the OS about) silent for longer than the bound:
// since their last heartbeat, or, never heard while another remote rank
// was, since their address was exchanged. `longest` gets the longest
// silence among them, `never` whether one was never heard.
TELAR_DECL std::vector<int>
silent_remote_peers(std::vector<PeerInfo> const& peers, std::vector<HeartbeatEndpoint> const& beats,
                    int self, double& longest, bool& never,
                    HeartbeatMonitor const* monitor = heartbeat_monitor());

// "host node4 (rank 3, pid 1234)" for every host of `ranks`, in rank order,
// joined by " and ".
TELAR_DECL std::string describe_hosts(std::vector<PeerInfo> const& peers,
                                      std::vector<int> const& ranks);

// Ends this process with `code` if it still runs `seconds` from now: for a
// job being aborted after a lost host, where MPI_Abort can wait on that host
// for good (MPICH 4.0 over UCX with a node whose link is down did).
TELAR_DECL void exit_if_abort_hangs(int code, double seconds = 5.0);

} // namespace telar::detail

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/comm/detail/heartbeat.ipp>
#endif
