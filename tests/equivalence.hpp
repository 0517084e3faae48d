#pragma once
// The equivalence tests' harness (tests/parallel/test_*equivalence.cpp): a
// run's parameter norms against the serial run's, with one verdict that every
// rank reaches, so a failure on one rank cannot leave the others waiting.
#include "support.hpp"

#include <catch2/catch_test_macros.hpp>

#include <mpi.h>

#include <map>
#include <string>

namespace telar::test {

inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// What a training run leaves to compare: the L2 norm of all parameters and of
// each tensor by name (a test's Result may add more).
struct NormResult {
  double l2 = 0;
  std::map<std::string, double> norms;
};

// The largest relative difference of the norms (all parameters, then each
// tensor) on this rank, and which one it is.
inline double local_worst(NormResult const& got, NormResult const& want, std::string& worst_name) {
  double worst = rel_diff(got.l2, want.l2);
  worst_name = "param_l2";
  for (auto const& [name, v] : want.norms) {
    auto it = got.norms.find(name);
    double const d = it == got.norms.end() ? 1.0 : rel_diff(it->second, v);
    if (d > worst) {
      worst = d;
      worst_name = name;
    }
  }
  return worst;
}

// The same over every rank: one verdict, so one failing rank cannot leave
// the others waiting.
inline double worst_difference(NormResult const& got, NormResult const& want) {
  std::string name;
  double worst = local_worst(got, want, name), worst_all = worst;
  MPI_Allreduce(&worst, &worst_all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst_all;
}

// The largest relative difference of the norms over all ranks is at most tol.
inline void require_same(NormResult const& got, NormResult const& want, double tol,
                         std::string const& what) {
  std::string worst_name;
  double const worst = local_worst(got, want, worst_name);
  double const worst_all = worst_difference(got, want);
  INFO(what << ": worst relative difference " << worst_all << " (here: " << worst_name << " "
            << worst << "), param_l2 " << got.l2 << " vs serial " << want.l2);
  CHECK(worst_all <= tol);
  CHECK(got.norms.size() == want.norms.size());
}

} // namespace telar::test
