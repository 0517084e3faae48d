// What a step checks on every rank alike: a loss or gradient that is not
// finite (stop with the step and the first such tensor, or skip the update
// and count it) and targets out of range (one message with the count over
// the global batch), under dp, pp, tp and ZeRO 1/2/3.
#include "support.hpp"

#include <telar/data/synthetic.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/adam.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_test_macros.hpp>

#include <mpi.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>

namespace {

using Mlp = telar::Sequential<telar::ColumnParallel<telar::Dense<float>>, telar::ReLU<float>,
                              telar::RowParallel<telar::Dense<float>>, telar::ReLU<float>,
                              telar::Dense<float>>;
Mlp make_mlp() {
  return Mlp(telar::ColumnParallel<telar::Dense<float>>(6, 8), {},
             telar::RowParallel<telar::Dense<float>>(8, 8), {}, telar::Dense<float>(8, 3));
}
using Full =
    telar::Strategy<telar::DataParallel<>, telar::PipelineParallel<>, telar::TensorParallel<>>;
template <int Stage>
using Zero = telar::Strategy<telar::DataParallel<telar::RingAllreduce, telar::ZeRO<Stage>>>;

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// A local batch of 4 samples; `poison` puts a NaN into the first input.
struct Batch {
  telar::Matrix<float> x{"x", 4, 6};
  telar::Labels<> y{"y", 4};
};
Batch make_batch(std::uint64_t seed, bool poison, int bad_labels = 0) {
  Batch b;
  auto hx = Kokkos::create_mirror_view(b.x);
  auto hy = Kokkos::create_mirror_view(b.y);
  for (std::size_t i = 0; i < 4; ++i) {
    hy(i) = i < std::size_t(bad_labels) ? 7 : int(i % 3);
    for (std::size_t j = 0; j < 6; ++j)
      hx(i, j) = float(telar::test::hash_uniform(seed, i * 6 + j));
  }
  if (poison)
    hx(0, 0) = std::numeric_limits<float>::quiet_NaN();
  Kokkos::deep_copy(b.x, hx);
  Kokkos::deep_copy(b.y, hy);
  return b;
}

// The same text on every rank: compares lengths and a checksum.
bool same_everywhere(std::string const& s) {
  long long v[2] = {(long long)s.size(), 0};
  for (char c : s)
    v[1] = v[1] * 31 + (unsigned char)c;
  long long lo[2], hi[2];
  MPI_Allreduce(v, lo, 2, MPI_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(v, hi, 2, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return lo[0] == hi[0] && lo[1] == hi[1];
}

template <class S>
telar::Trainer<Mlp, S, telar::AdamW<float>> make_trainer(telar::GridShape grid,
                                                         telar::NonFinite mode) {
  telar::TrainerOptions opts;
  opts.grid = grid;
  opts.microbatches = 2;
  opts.nonfinite = mode;
  return telar::Trainer<Mlp, S, telar::AdamW<float>>(MPI_COMM_WORLD, make_mlp(), {}, opts, 6);
}

// Stop: step 2 has a NaN in the last data-parallel share's input; every rank throws the
// same NonFiniteError naming step 2 and layer0.weight, parameters untouched.
template <class S>
void check_stop(telar::GridShape grid, char const* what) {
  INFO(what);
  auto t = make_trainer<S>(grid, telar::NonFinite::stop);
  bool const last = t.grid_coords().dp == t.grid_shape().dp - 1; // a whole data-parallel share
  auto const b1 = make_batch(1, false);
  auto const b2 = make_batch(2, last);
  t.step(b1.x, b1.y);
  auto const before = t.tensor_norms();
  std::string msg;
  try {
    t.step(b2.x, b2.y);
  } catch (telar::NonFiniteError const& e) {
    msg = e.what();
  }
  INFO(msg);
  // ReLU drops the NaN going forward (the loss stays finite), but the first
  // layer's weight gradient x^T dy has it in one row: 8 values, wherever they lie.
  CHECK(msg.rfind("telar::Trainer::step: step 2: the gradient of layer0.weight has 8 values that "
                  "are NaN or infinite (the first such tensor in model order; 8 in all, the loss "
                  "is ",
                  0) == 0);
  CHECK(same_everywhere(msg));
  CHECK(t.tensor_norms() == before);
  CHECK(t.steps() == 1); // the refused step is not counted
}

// Skip: the poisoned step changes nothing and is counted; the run then goes
// on exactly as one that never saw it (AdamW's state and step count untouched).
template <class S>
void check_skip(telar::GridShape grid, char const* what) {
  INFO(what);
  auto a = make_trainer<S>(grid, telar::NonFinite::skip);
  auto b = make_trainer<S>(grid, telar::NonFinite::skip);
  bool const last = a.grid_coords().dp == a.grid_shape().dp - 1;
  auto const b1 = make_batch(1, false), b2 = make_batch(2, last), b3 = make_batch(3, false);
  CHECK_FALSE(a.step(b1.x, b1.y).skipped);
  auto const before = a.tensor_norms();
  auto const r = a.step(b2.x, b2.y);
  CHECK(r.skipped);
  CHECK(a.skipped_steps() == 1);
  CHECK(a.tensor_norms() == before);
  CHECK_FALSE(a.step(b3.x, b3.y).skipped);
  b.step(b1.x, b1.y);
  b.step(b3.x, b3.y);
  CHECK(a.tensor_norms() == b.tensor_norms());
  CHECK(b.skipped_steps() == 0);
}

template <class Check>
void each_layout(Check check) {
  int const n = world_size();
  check(telar::GridShape{0, 1, 1}, "dp", Full{});
  if (n % 2 == 0) {
    check(telar::GridShape{0, 2, 1}, "dp x pp=2", Full{});
    check(telar::GridShape{0, 1, 2}, "dp x tp=2", Full{});
  }
  if (n == 4)
    check(telar::GridShape{1, 2, 2}, "pp=2 x tp=2", Full{});
  check(telar::GridShape{0, 1, 1}, "ZeRO-1", Zero<1>{});
  check(telar::GridShape{0, 1, 1}, "ZeRO-2", Zero<2>{});
  check(telar::GridShape{0, 1, 1}, "ZeRO-3", Zero<3>{});
}

} // namespace

TEST_CASE("A gradient that is not finite stops every rank, naming step and tensor", "[nonfinite]") {
  each_layout(
      [](telar::GridShape g, char const* what, auto s) { check_stop<decltype(s)>(g, what); });
}

TEST_CASE("NonFinite::skip leaves parameters and optimizer state untouched", "[nonfinite]") {
  each_layout(
      [](telar::GridShape g, char const* what, auto s) { check_skip<decltype(s)>(g, what); });
}

TEST_CASE("Labels out of range: one message with the count over the global batch", "[targets]") {
  each_layout([](telar::GridShape g, char const* what, auto s) {
    INFO(what);
    auto t = make_trainer<decltype(s)>(g, telar::NonFinite::stop);
    int const dp = t.grid_shape().dp;
    auto const good = make_batch(1, false), bad = make_batch(2, false, 2);
    t.step(good.x, good.y);
    std::string msg;
    try {
      t.step(bad.x, bad.y);
    } catch (telar::ShapeError const& e) {
      msg = e.what();
    }
    CHECK(msg == "telar::Trainer::step: step 2: " + std::to_string(2 * dp) + " of " +
                     std::to_string(4 * dp) +
                     " targets in the global batch are labels outside [0, 3)");
    // evaluate() gets the whole set on every rank: the same verdict, no message.
    msg.clear();
    try {
      t.evaluate(bad.x, bad.y);
    } catch (telar::ShapeError const& e) {
      msg = e.what();
    }
    CHECK(msg == "telar::Trainer::evaluate: 2 of 4 targets are labels outside [0, 3)");
  });
}
