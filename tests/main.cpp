// The one main of every Telar test binary: MPI starts first and stops last,
// Kokkos lives inside it, Catch2 runs in between.
#include <catch2/catch_session.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int result = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    result = Catch::Session().run(argc, argv);
  }
  // A test that failed on one rank only must fail the whole job.
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
