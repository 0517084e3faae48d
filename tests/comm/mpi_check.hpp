#pragma once
// Agreement helpers for MPI tests: compute a check locally, agree on it
// across ranks, then assert, so a failure on one rank fails every rank
// instead of leaving the others waiting in the next collective.
#include <catch2/catch_test_macros.hpp>

#include <mpi.h>

namespace telar_test {
inline bool all_ranks(bool ok) {
  int v = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&v, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all != 0;
}
inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
} // namespace telar_test

#define TELAR_REQUIRE_ALL(cond)                                                                    \
  do {                                                                                             \
    bool const telar_ok_ = static_cast<bool>(cond);                                                \
    INFO("rank " << telar_test::world_rank() << ": " #cond << (telar_ok_ ? " holds" : " FAILED")); \
    REQUIRE(telar_test::all_ranks(telar_ok_));                                                     \
  } while (0)
