// Bounded waits: a peer that never sends gives CommTimeout with a message
// naming rank, operation, peer, tag and duration; the job then cleans up and
// finalizes normally.
#include <telar/comm/allreduce.hpp>
#include <telar/comm/communicator.hpp>

#include "mpi_check.hpp"

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

using telar::Communicator;

namespace {
bool contains(std::string const& s, std::string const& part) {
  return s.find(part) != std::string::npos;
}
} // namespace

TEST_CASE("blocking recv from a silent peer times out", "[comm][timeout]") {
  Communicator comm(MPI_COMM_WORLD, "world");
  REQUIRE(comm.size() >= 2);
  std::string msg;
  double waited = 0;
  bool fields = false;
  if (comm.rank() == 0) {
    comm.set_timeout(1.0);
    int x = 0;
    try {
      comm.recv(&x, 1, 1, 7); // rank 1 never sends
    } catch (telar::CommTimeout const& e) {
      msg = e.what();
      waited = e.seconds();
      fields = e.rank() == 0 && e.peer() == 1 && e.operation() == "MPI_Recv";
    }
    // The receive was cancelled when its request went out of scope.
    comm.set_timeout(30.0);
  }
  comm.barrier();
  INFO(msg);
  TELAR_REQUIRE_ALL(comm.rank() != 0 ||
                    (fields && contains(msg, "MPI_Recv from rank 1 (tag 7) timed out after ") &&
                     contains(msg, " s on rank 0 of ") && contains(msg, "(communicator 'world')") &&
                     contains(msg, "TELAR_COMM_TIMEOUT") && waited >= 1.0 && waited < 10.0));
}

TEST_CASE("a timed-out request stays pending and completes later", "[comm][timeout]") {
  Communicator comm(MPI_COMM_WORLD, "world");
  int x = -1;
  bool timed_out = false;
  telar::Request req;
  if (comm.rank() == 0) {
    comm.set_timeout(1.0);
    req = comm.irecv(&x, 1, 1, 8);
    try {
      req.wait();
    } catch (telar::CommTimeout const&) {
      timed_out = true;
    }
    comm.set_timeout(30.0);
  }
  comm.barrier();
  if (comm.rank() == 1) {
    int const v = 42;
    comm.send(&v, 1, 0, 8); // the late send, drained by the pending receive
  }
  if (comm.rank() == 0)
    req.wait();
  TELAR_REQUIRE_ALL(comm.rank() != 0 || (timed_out && x == 42 && !req.active()));
}

TEST_CASE("an allreduce algorithm reports the peer it waits for", "[comm][timeout]") {
  Communicator comm(MPI_COMM_WORLD, "world"); // used by this test only: left inconsistent
  std::vector<float> v(4, 1.f);
  telar::RingAllreduce::allreduce(comm, v.data(), v.size()); // both ranks: sets up the ring
  std::string msg;
  if (comm.rank() == 0) {
    comm.set_timeout(1.0);
    try {
      telar::RingAllreduce{}.start(comm, v.data(), v.size()).wait(); // rank 1 does not join
    } catch (telar::CommTimeout const& e) {
      msg = e.what();
    }
  }
  Communicator other(MPI_COMM_WORLD, "other");
  other.barrier();
  INFO(msg);
  TELAR_REQUIRE_ALL(comm.rank() != 0 ||
                    (contains(msg, "telar::RingAllreduce (waiting for MPI_Recv from rank ") &&
                     contains(msg, "timed out after") && contains(msg, "on rank 0 of")));
}

TEST_CASE("a timed-out MpiAllreduce completes when the peer arrives", "[comm][timeout]") {
  Communicator comm(MPI_COMM_WORLD, "world");
  Communicator side(MPI_COMM_WORLD, "side");
  std::vector<double> v(3, 1.0);
  telar::AllreduceOp<double> op;
  bool timed_out = false;
  if (comm.rank() == 0) {
    comm.set_timeout(1.0);
    op = telar::MpiAllreduce{}.start(comm, v.data(), v.size());
    try {
      op.wait();
    } catch (telar::CommTimeout const& e) {
      timed_out = std::string(e.what()).find("MPI_Iallreduce") != std::string::npos;
    }
    comm.set_timeout(30.0);
  }
  side.barrier();
  if (comm.rank() != 0)
    op = telar::MpiAllreduce{}.start(comm, v.data(), v.size());
  op.wait();
  TELAR_REQUIRE_ALL(v == std::vector<double>(3, double(comm.size())));
  TELAR_REQUIRE_ALL(comm.rank() != 0 || timed_out);
}

// Heartbeats (heartbeat.hpp): the socket path works between the ranks, a
// malformed bound is refused by name, and a lost host is described by host,
// ranks and pids. That a silent remote host ends a wait is checked on the
// emulated cluster (tests/cluster/cluster_node_loss.sh: needs root).
TEST_CASE("every rank hears every other rank's heartbeat", "[comm][heartbeat]") {
  Communicator comm(MPI_COMM_WORLD, "world");
  auto const* monitor = telar::detail::heartbeat_monitor();
  REQUIRE(monitor != nullptr);
  auto const& beats = comm.handle_ptr()->beats;
  REQUIRE(int(beats.size()) == comm.size());
  // The thread sends once a second; allow a loaded machine 15 s.
  auto heard_all = [&] {
    for (int r = 0; r < comm.size(); ++r)
      if (r != comm.rank() && !(monitor->silence(beats[std::size_t(r)].token) >= 0))
        return false;
    return true;
  };
  for (int i = 0; i < 150 && !heard_all(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  bool const heard = heard_all();
  comm.barrier();
  TELAR_REQUIRE_ALL(heard);
}

TEST_CASE("a malformed TELAR_HEARTBEAT_TIMEOUT is refused by name", "[comm][heartbeat]") {
  auto message_for = [](const char* value) {
    ::setenv("TELAR_HEARTBEAT_TIMEOUT", value, 1);
    std::string msg;
    try {
      (void)telar::detail::heartbeat_timeout_from_env();
    } catch (telar::CommError const& e) {
      msg = e.what();
    }
    ::unsetenv("TELAR_HEARTBEAT_TIMEOUT");
    return msg;
  };
  CHECK(message_for("ten") == "telar::Communicator: TELAR_HEARTBEAT_TIMEOUT='ten' is not a number "
                              "of seconds from 0 to 1e6 (0 turns heartbeats off)");
  CHECK(contains(message_for("-1"), "TELAR_HEARTBEAT_TIMEOUT='-1'"));
  CHECK(message_for("2.5").empty());
  CHECK(telar::detail::heartbeat_timeout_from_env() == 10.0);
}

TEST_CASE("a lost host is named with its ranks and pids", "[comm][heartbeat]") {
  std::vector<telar::detail::PeerInfo> peers(4);
  char const* hosts[] = {"node1", "node4", "node2", "node4"};
  for (int r = 0; r < 4; ++r) {
    peers[std::size_t(r)].rank = r;
    peers[std::size_t(r)].pid = 100 + r;
    std::snprintf(peers[std::size_t(r)].host, sizeof peers[0].host, "%s", hosts[r]);
  }
  CHECK(telar::detail::describe_hosts(peers, {1, 3}) == "host node4 (ranks 1, 3, pids 101, 103)");
  CHECK(telar::detail::describe_hosts(peers, {0, 1}) ==
        "host node1 (rank 0, pid 100) and host node4 (rank 1, pid 101)");
}

// A remote peer never heard (dead or cut off before its first heartbeat) is
// lost once the bound has passed since its address was exchanged, but only
// where another remote peer has been heard: with none heard, datagrams may
// not pass at all and nobody is judged. Two monitors of this process stand
// for three hosts; `mute` has b's address but a token nobody sends.
TEST_CASE("a remote peer never heard is lost once the bound has passed", "[comm][heartbeat]") {
  using telar::detail::HeartbeatEndpoint;
  double const bound = 1.5;
  telar::detail::HeartbeatMonitor a(bound), b(bound);
  REQUIRE(a.endpoint().token != 0);
  REQUIRE(b.endpoint().token != 0);
  HeartbeatEndpoint mute = b.endpoint();
  mute.token ^= 2;
  b.add_peers({a.endpoint()});
  a.add_peers({b.endpoint(), mute});
  std::vector<telar::detail::PeerInfo> peers(3);
  for (int r = 0; r < 3; ++r) {
    peers[std::size_t(r)].rank = r;
    peers[std::size_t(r)].pid = 100 + r;
    std::snprintf(peers[std::size_t(r)].host, sizeof peers[0].host, "host%d", r);
  }
  std::vector<HeartbeatEndpoint> const beats{a.endpoint(), b.endpoint(), mute};
  double longest = 0;
  bool never = false;
  CHECK(telar::detail::silent_remote_peers(peers, beats, 0, longest, never, &a).empty());
  for (int i = 0; i < 100 && !(a.silence(b.endpoint().token) >= 0 && a.unheard(mute.token) > bound);
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto const lost = telar::detail::silent_remote_peers(peers, beats, 0, longest, never, &a);
  CHECK(std::find(lost.begin(), lost.end(), 2) != lost.end());
  CHECK(never);
  CHECK(longest > bound);
  // Only the mute peer remote: nobody heard, nobody judged.
  std::vector<telar::detail::PeerInfo> const two(peers.begin(), peers.begin() + 2);
  CHECK(
      telar::detail::silent_remote_peers(two, {a.endpoint(), mute}, 0, longest, never, &a).empty());
}
