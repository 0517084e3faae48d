// A job in which one rank fails mid-run, for failure_exit.sh and
// scripts/failure_exit_times.sh: every rank sums a value over and over
// (sleeping `ms` between sums) and, at iteration 3, rank `victim` fails:
//   kill  — SIGKILL (the peers find its process gone: telar::PeerLost)
//   stop  — SIGSTOP (alive but silent: telar::CommTimeout names who waits for what)
//   throw — a telar::Error on that rank only (abort_on_error ends the job)
// Any other mode (with victim -1) runs until killed: tests/cluster's
// node-loss test fails a node from outside. Rank 0 says when the first sum
// is done (every rank is then running and its heartbeats are flowing).
// Usage: test_comm_failure MODE [victim=1] [ms=1]
#include <telar/comm/communicator.hpp>

#include <mpi.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  std::string const mode = argc > 1 ? argv[1] : "kill";
  int const victim = argc > 2 ? std::atoi(argv[2]) : 1;
  int const ms = argc > 3 ? std::atoi(argv[3]) : 1;
  {
    telar::Communicator comm(MPI_COMM_WORLD, "world");
    telar::abort_on_error(comm, [&] {
      for (int i = 0;; ++i) {
        if (comm.rank() == victim && i == 3) {
          if (mode == "kill")
            std::raise(SIGKILL);
          else if (mode == "stop")
            std::raise(SIGSTOP);
          else
            throw telar::Error("rank " + std::to_string(victim) +
                               " alone failed (e.g. a file only it reads)");
        }
        double v = 1;
        comm.allreduce(&v, 1);
        if (i == 0 && comm.rank() == 0) {
          std::printf("test_comm_failure: %d ranks running\n", comm.size());
          std::fflush(stdout);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      }
    });
  }
  MPI_Finalize();
  return 0; // not reached: the loop ends only through an error
}
