// Bounded waits: a peer that never sends gives CommTimeout with a message
// naming rank, operation, peer, tag and duration; the job then cleans up and
// finalizes normally.
#include <telar/comm/allreduce.hpp>
#include <telar/comm/communicator.hpp>

#include "mpi_check.hpp"

#include <catch2/catch_test_macros.hpp>

#include <string>
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
