// Expected to end through MPI_Abort: rank 1 waits 1 s for a message that never
// comes; abort_on_error prints the error and aborts, which also ends rank 0.
#include <telar/comm/communicator.hpp>

#include <mpi.h>

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  {
    telar::Communicator comm(MPI_COMM_WORLD, "world");
    telar::abort_on_error(comm, [&] {
      int x = 0;
      if (comm.rank() == 1) {
        comm.set_timeout(1.0);
        comm.recv(&x, 1, 0, 3);
      } else {
        comm.set_timeout(50.0);
        comm.barrier(); // never completes: rank 1 aborts first
      }
    });
  }
  MPI_Finalize();
  return 0; // reaching this is a failure: the regex is not printed
}
