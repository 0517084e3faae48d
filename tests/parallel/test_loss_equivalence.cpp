// Losses with their own term count under data (and pipeline) parallelism:
// PositionwiseCrossEntropy with padding spread unevenly over the ranks, and
// MeanSquaredError, train to the serial parameters with the same global
// batch. Checks that the Trainer divides by the global count (summed over the
// data-parallel group), not by each rank's. The model has a LayerNorm, whose
// per-sample statistics must not depend on the split either.
#include "support.hpp"

#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/losses.hpp>
#include <telar/layers/normalization.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_test_macros.hpp>

#include <mpi.h>

#include <map>
#include <string>
#include <vector>

namespace {

using T = double;
using Labels2 = telar::PositionwiseCrossEntropy<T>::target_type;
// [5, 6] -> [5, 3]: Dense works on every position, LayerNorm on each.
using Model =
    telar::Sequential<telar::Dense<T>, telar::LayerNorm<T>, telar::ReLU<T>, telar::Dense<T>>;
Model make_model() {
  return Model(telar::Dense<T>(6, 8), telar::LayerNorm<T>(8), {}, telar::Dense<T>(8, 3));
}
using DpPp = telar::Strategy<telar::DataParallel<>, telar::PipelineParallel<>>;

constexpr std::size_t P = 5, F = 6, C = 3;

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

telar::Matrix<T> inputs(std::size_t n) {
  telar::Matrix<T> x("x", n, P * F);
  auto h = Kokkos::create_mirror_view(x);
  for (std::size_t i = 0; i < h.size(); ++i)
    h.data()[i] = telar::test::hash_uniform(3, i);
  Kokkos::deep_copy(x, h);
  return x;
}

// Labels in [0, C); in the first quarter of every batch of 8 most positions
// are padding, so the ranks' shares hold very different counts.
Labels2 labels(std::size_t n) {
  Labels2 y("y", n, P);
  auto h = Kokkos::create_mirror_view(y);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t p = 0; p < P; ++p) {
      bool const padded = (i % 8 < 2 && p > 0) || (i % 8 == 5 && p == 4);
      h(i, p) = padded ? -100 : int((i * 7 + p * 3) % C);
    }
  Kokkos::deep_copy(y, h);
  return y;
}

telar::Matrix<T> real_targets(std::size_t n) {
  telar::Matrix<T> t("t", n, P * C);
  auto h = Kokkos::create_mirror_view(t);
  for (std::size_t i = 0; i < h.size(); ++i)
    h.data()[i] = telar::test::hash_uniform(4, i);
  Kokkos::deep_copy(t, h);
  return t;
}

struct Result {
  std::vector<double> losses;
  std::vector<double> accuracies;
  std::map<std::string, double> norms;
  double l2 = 0;
};

template <class Strategy, class Loss, class Targets>
Result train(MPI_Comm comm, telar::TrainerOptions opts, telar::Matrix<T> const& x, Targets const& y,
             std::size_t batch, int steps, Loss loss) {
  telar::SGD<T> sgd;
  sgd.momentum = 0.9;
  telar::Trainer<Model, Strategy, telar::SGD<T>, Loss> trainer(comm, make_model(), sgd, opts,
                                                               telar::Shape{P, F}, loss);
  int const dp = trainer.grid_shape().dp, d = trainer.grid_coords().dp;
  std::size_t const local = batch / std::size_t(dp);
  Result r;
  for (int s = 0; s < steps; ++s) {
    std::size_t const b = std::size_t(s) * batch + std::size_t(d) * local;
    auto const step =
        trainer.step(telar::rows(x, b, b + local), Targets(telar::rows(y, b, b + local)));
    r.losses.push_back(step.loss);
    r.accuracies.push_back(step.accuracy);
  }
  r.norms = trainer.tensor_norms();
  r.l2 = trainer.param_l2();
  return r;
}

void require_same(Result const& got, Result const& want, std::string const& what) {
  double worst = telar::test::rel_diff(got.l2, want.l2);
  for (auto const& [name, v] : want.norms) {
    auto it = got.norms.find(name);
    worst = std::max(worst, it == got.norms.end() ? 1.0 : telar::test::rel_diff(it->second, v));
  }
  for (std::size_t s = 0; s < want.losses.size(); ++s) {
    worst = std::max(worst, telar::test::rel_diff(got.losses[s], want.losses[s]));
    worst = std::max(worst, telar::test::rel_diff(got.accuracies[s], want.accuracies[s]));
  }
  double worst_all = worst;
  MPI_Allreduce(&worst, &worst_all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  INFO(what << ": worst relative difference " << worst_all << ", param_l2 " << got.l2
            << " vs serial " << want.l2);
  CHECK(worst_all <= 1e-11);
  CHECK(got.norms.size() == want.norms.size());
}

// dp = world, and dp x pp = 2 where the world allows.
template <class Loss, class Targets>
void compare_layouts(Targets const& y, Loss loss, char const* name) {
  int const n = world_size();
  std::size_t const batch = 8;
  int const steps = 3;
  auto const x = inputs(batch * std::size_t(steps));
  telar::TrainerOptions base;
  base.seed = 11;
  base.lr = telar::constant_lr(0.1);
  telar::TrainerOptions serial_opts = base;
  serial_opts.grid = {1, 1, 1};
  Result const want = train<telar::Serial>(MPI_COMM_SELF, serial_opts, x, y, batch, steps, loss);
  for (int pp : {1, 2})
    for (int m : {1, 2})
      if (n % pp == 0) {
        telar::TrainerOptions opts = base;
        opts.grid = {n / pp, pp, 1};
        opts.microbatches = m;
        std::string const what = std::string(name) + " dp=" + std::to_string(n / pp) +
                                 " pp=" + std::to_string(pp) + " m=" + std::to_string(m);
        require_same(train<DpPp>(MPI_COMM_WORLD, opts, x, y, batch, steps, loss), want, what);
      }
}

} // namespace

TEST_CASE("PositionwiseCrossEntropy with uneven padding matches serial training",
          "[equivalence][losses]") {
  auto const y = labels(24);
  // The shares of one batch really differ in count (else the test proves little).
  auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, y);
  int first = 0, last = 0;
  for (std::size_t i = 0; i < 4; ++i)
    for (std::size_t p = 0; p < P; ++p) {
      first += h(i, p) != -100;
      last += h(i + 4, p) != -100;
    }
  REQUIRE(first != last);
  compare_layouts(y, telar::PositionwiseCrossEntropy<T>(), "positionwise");
}

TEST_CASE("MeanSquaredError matches serial training", "[equivalence][losses]") {
  compare_layouts(real_targets(24), telar::MeanSquaredError<T>(), "mse");
}
