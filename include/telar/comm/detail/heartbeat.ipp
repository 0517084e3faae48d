// What telar/comm/detail/heartbeat.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/comm/detail/heartbeat.hpp>

namespace telar::detail {

TELAR_DECL double heartbeat_timeout_from_env() {
  const char* s = std::getenv("TELAR_HEARTBEAT_TIMEOUT");
  if (s == nullptr || *s == '\0')
    return 10.0;
  char* end = nullptr;
  double const v = std::strtod(s, &end);
  if (end == s || *end != '\0' || !(v >= 0) || v > 1e6) {
    throw CommError(std::string("telar::Communicator: TELAR_HEARTBEAT_TIMEOUT='") + s +
                        "' is not a number of seconds from 0 to 1e6 (0 turns heartbeats off)",
                    -1, "TELAR_HEARTBEAT_TIMEOUT");
  }
  return v;
}

TELAR_DECL std::vector<int> silent_remote_peers(std::vector<PeerInfo> const& peers,
                                                std::vector<HeartbeatEndpoint> const& beats,
                                                int self, double& longest, bool& never,
                                                HeartbeatMonitor const* monitor) {
  std::vector<int> out;
  longest = 0;
  never = false;
  if (monitor == nullptr || beats.size() != peers.size())
    return out;
  std::vector<int> remote;
  bool heard_one = false;
  for (int r = 0; r < int(peers.size()); ++r)
    if (r != self &&
        peer_state(peers[std::size_t(r)], peers[std::size_t(self)]) == PeerState::unknown) {
      remote.push_back(r);
      heard_one = heard_one || monitor->silence(beats[std::size_t(r)].token) >= 0;
    }
  for (int r : remote) {
    double const s = monitor->silence(beats[std::size_t(r)].token);
    double const u = heard_one ? monitor->unheard(beats[std::size_t(r)].token) : -1;
    if (std::max(s, u) > monitor->timeout()) {
      out.push_back(r);
      longest = std::max(longest, std::max(s, u));
      never = never || u > monitor->timeout();
    }
  }
  return out;
}

TELAR_DECL std::string describe_hosts(std::vector<PeerInfo> const& peers,
                                      std::vector<int> const& ranks) {
  std::vector<std::string> hosts;
  std::map<std::string, std::pair<std::string, std::string>> lists; // host -> ranks, pids
  for (int r : ranks) {
    PeerInfo const& p = peers[std::size_t(r)];
    auto [it, fresh] = lists.emplace(p.host, std::pair<std::string, std::string>{});
    if (fresh)
      hosts.push_back(p.host);
    it->second.first += (fresh ? "" : ", ") + std::to_string(r);
    it->second.second += (fresh ? "" : ", ") + std::to_string(p.pid);
  }
  std::string out;
  for (auto const& h : hosts) {
    auto const& l = lists[h];
    bool const several = l.first.find(',') != std::string::npos;
    out += (out.empty() ? "host " : " and host ") + h + (several ? " (ranks " : " (rank ") +
           l.first + (several ? ", pids " : ", pid ") + l.second + ")";
  }
  return out;
}

TELAR_DECL void exit_if_abort_hangs(int code, double seconds) {
  std::thread([code, seconds] {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    std::fprintf(stderr, "telar: MPI_Abort did not end this process within %g s; exiting\n",
                 seconds);
    std::_Exit(code);
  }).detach();
}

} // namespace telar::detail
