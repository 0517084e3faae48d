// BatchNorm under data parallelism: with SyncStats a dp run trains to the
// serial parameters and running statistics (one micro-batch per rank, the
// same global batch); with LocalStats every replica ends a step with the same
// running statistics (the Trainer averages them). Double precision, a small
// CNN: Conv2D -> BatchNorm -> ReLU -> Flatten -> Dense.
#include "support.hpp"

#include <telar/data/synthetic.hpp>
#include <telar/io/gather.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/batch_norm.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_test_macros.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace {

using T = double;
telar::Shape const image{2, 6, 6};
std::size_t const features = 2 * 6 * 6, classes = 3;

template <class Stats>
using Cnn =
    telar::Sequential<telar::Conv2D<T>, telar::BatchNorm<T, telar::DefaultMemorySpace, Stats>,
                      telar::ReLU<T>, telar::Flatten<T>, telar::Dense<T>>;
template <class Stats>
Cnn<Stats> make_cnn() {
  return Cnn<Stats>(telar::Conv2D<T>(2, 4, 3, 1, 1),
                    telar::BatchNorm<T, telar::DefaultMemorySpace, Stats>(4), {}, {},
                    telar::Dense<T>(4 * 6 * 6, classes));
}
using DP = telar::Strategy<telar::DataParallel<>>;

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

struct Data {
  telar::Matrix<T> x;
  telar::Labels<> y;
};
Data make_data(std::size_t n) {
  auto ds = telar::make_synthetic(n, features, classes, 7);
  Data d{telar::Matrix<T>("x", n, features), telar::Labels<>("y", n)};
  auto hx = Kokkos::create_mirror_view(d.x);
  auto hy = Kokkos::create_mirror_view(d.y);
  for (std::size_t i = 0; i < n; ++i) {
    hy(i) = ds.y[i];
    for (std::size_t j = 0; j < features; ++j)
      hx(i, j) = T(ds.x[i * features + j]);
  }
  Kokkos::deep_copy(d.x, hx);
  Kokkos::deep_copy(d.y, hy);
  return d;
}

struct Result {
  telar::GatheredModel<T> model; // parameters and buffers, on every rank
  double eval_loss = 0;
  std::vector<T> local_buffers; // this rank's own copy of every buffer
};

template <class Stats>
Result train(MPI_Comm comm, Data const& data, std::size_t batch, int steps) {
  telar::SGD<T> sgd;
  sgd.momentum = T(0.9);
  telar::TrainerOptions opts;
  opts.seed = 3;
  opts.lr = telar::constant_lr(0.1);
  telar::Trainer<Cnn<Stats>, DP, telar::SGD<T>> trainer(comm, make_cnn<Stats>(), sgd, opts, image);
  int const dp = trainer.grid_shape().dp, d = trainer.grid_coords().dp;
  std::size_t const local = batch / std::size_t(dp);
  for (int s = 0; s < steps; ++s) {
    std::size_t const b = std::size_t(s) * batch + std::size_t(d) * local;
    trainer.step(telar::rows(data.x, b, b + local), telar::rows(data.y, b, b + local));
  }
  Result r;
  r.eval_loss = trainer.evaluate(telar::rows(data.x, 0, batch), telar::rows(data.y, 0, batch)).loss;
  r.model = telar::gather_model(trainer, -1);
  trainer.model().buffers([&](char const*, auto& v) {
    auto h = telar::test::to_host(v);
    r.local_buffers.insert(r.local_buffers.end(), h.data(), h.data() + h.extent(0));
  });
  return r;
}

// Largest relative difference over every gathered tensor, agreed over ranks.
double worst_difference(telar::GatheredModel<T> const& got, telar::GatheredModel<T> const& want) {
  double worst = got.tensors.size() == want.tensors.size() ? 0.0 : 1.0;
  for (auto const& [name, v] : want.tensors) {
    auto it = got.tensors.find(name);
    if (it == got.tensors.end() || it->second.size() != v.size()) {
      worst = 1.0;
      continue;
    }
    for (std::size_t i = 0; i < v.size(); ++i)
      worst = std::max(worst, telar::test::rel_diff(it->second[i], v[i], 1e-8));
  }
  double all = worst;
  MPI_Allreduce(&worst, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return all;
}

} // namespace

TEST_CASE("BatchNorm with SyncStats: data parallel equals serial", "[batch_norm][equivalence]") {
  std::size_t const batch = 8;
  int const steps = 3;
  auto const data = make_data(batch * steps);
  Result const want = train<telar::SyncStats>(MPI_COMM_SELF, data, batch, steps);
  Result const got = train<telar::SyncStats>(MPI_COMM_WORLD, data, batch, steps);
  // The running statistics were updated and gathered with the parameters.
  REQUIRE(want.model.tensors.count("buffers/layer1.running_mean") == 1);
  REQUIRE(want.model.tensors.count("buffers/layer1.running_var") == 1);
  CHECK(want.model.tensors.at("buffers/layer1.running_var")[0] != 1.0);
  double const worst = worst_difference(got.model, want.model);
  INFO("dp=" << world_size() << ": worst relative difference " << worst);
  CHECK(worst <= 1e-11);
  CHECK(std::abs(got.eval_loss - want.eval_loss) <= 1e-11 * std::abs(want.eval_loss));
}

TEST_CASE("BatchNorm with LocalStats: running statistics equal on every replica",
          "[batch_norm][equivalence]") {
  std::size_t const batch = 8;
  auto const data = make_data(batch * 2);
  Result const r = train<telar::LocalStats>(MPI_COMM_WORLD, data, batch, 2);
  REQUIRE(r.local_buffers.size() == 8);
  // Rank 0's copy against every rank's.
  std::vector<T> root = r.local_buffers;
  MPI_Bcast(root.data(), int(root.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD);
  double worst = 0;
  for (std::size_t i = 0; i < root.size(); ++i)
    worst = std::max(worst, std::abs(root[i] - r.local_buffers[i]));
  double all = worst;
  MPI_Allreduce(&worst, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  CHECK(all == 0.0);
  CHECK(r.model.tensors.at("buffers/layer1.running_mean") ==
        std::vector<T>(r.local_buffers.begin(), r.local_buffers.begin() + 4));
}
