// BatchNorm: values and running statistics against PyTorch 1.13
// (batch_norm_reference.py), gradients by finite differences in double
// (telar::check_gradients) for every input rank, evaluation mode, Recompute's
// replay, buffers through blocks, and the errors.
#include "support.hpp"

#include <telar/core/recompute.hpp>
#include <telar/core/residual.hpp>
#include <telar/core/sequential.hpp>
#include <telar/layers/batch_norm.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/dropout.hpp>
#include <telar/testing/check_gradients.hpp>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using telar::test::Exec;
using telar::test::to_host;
using Mat = telar::Matrix<double>;
using BN = telar::BatchNorm<double>;

namespace {

// The inputs of batch_norm_reference.py: 4 samples [2, 3].
Mat reference_batch(int step) {
  std::size_t const n = 4, k = 6;
  Mat x("x", n, k);
  auto h = Kokkos::create_mirror_view(x);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t f = 0; f < k; ++f)
      h(i, f) = std::sin(0.7 * double(i * k + f) + 0.3 * step) * 2 + double(f % 3);
  Kokkos::deep_copy(x, h);
  return x;
}

template <class V>
void set_values(V const& v, std::vector<double> const& values) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < values.size(); ++i)
    h(i) = values[i];
  Kokkos::deep_copy(v, h);
}

template <class V>
double max_diff(V const& v, std::vector<double> const& want) {
  auto h = to_host(v);
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(h.data()[i] - want[i]));
  return worst;
}

Mat run_forward(BN& bn, Mat x) {
  Mat y("y", x.extent(0), x.extent(1));
  BN::saved_type saved;
  bn.forward(Exec{}, x, y, saved);
  return y;
}

} // namespace

TEST_CASE("BatchNorm matches PyTorch in training and evaluation", "[batch_norm]") {
  // Printed by batch_norm_reference.py (PyTorch 1.13, float64).
  std::vector<double> const train_y0 = {
      -0.876090247023935, 1.1462927994835,   2.63315446961301,  0.793584029276097,
      0.813223511776256,  0.942504038189306, -2.41658388345004, -1.72881608354737,
      -0.224361027517655, 1.3826007695748,   0.589140935562549, 0.0107116824433383,
      0.634397103904833,  0.571650563063031, 0.243645868664492, 2.00649257778712,
      1.72776728402615,   1.12855880794832,  -0.81666214917998, 1.19110211082569,
      2.64227047516442,   0.805736416844604, 0.835402082644003, 0.964277863927462};
  std::vector<double> const running_mean = {0.250178806986175, 0.203021640163272};
  std::vector<double> const running_var = {1.40549571103952, 1.23247892597047};
  std::vector<double> const eval_y2 = {
      1.36228547254728,  3.63698437921122,  4.7649239085006,    0.706470594376849,
      0.871238268773118, 0.927748277533596, -2.58732416935916,  -0.586655843426569,
      2.25369709803699,  0.570402082721814, -0.230804722497221, -0.621961154660862,
      0.976324759599221, 0.511020161358508, 0.369146001937638,  1.98728869997386,
      1.26575617135985,  0.250418043011234, 1.43169949974358,   3.65836530465248,
      4.72821594886562,  0.734069218187628, 0.900388816612709,  0.944740791263167};

  BN bn(2);
  bn.initialize(0);
  CHECK(max_diff(bn.running_mean, {0, 0}) == 0);
  CHECK(max_diff(bn.running_var, {1, 1}) == 0);
  set_values(bn.weight, {1.5, -0.5});
  set_values(bn.bias, {0.25, 1.0});
  CHECK(max_diff(run_forward(bn, reference_batch(0)), train_y0) < 1e-12);
  run_forward(bn, reference_batch(1));
  CHECK(bn.batches_tracked() == 2);
  CHECK(max_diff(bn.running_mean, running_mean) < 1e-12);
  CHECK(max_diff(bn.running_var, running_var) < 1e-12);

  telar::set_training(bn, false);
  CHECK(max_diff(run_forward(bn, reference_batch(2)), eval_y2) < 1e-12);
  CHECK(max_diff(bn.running_mean, running_mean) < 1e-12); // evaluation leaves them alone
  CHECK(bn.batches_tracked() == 2);
}

TEST_CASE("BatchNorm gradients match finite differences", "[batch_norm][fd]") {
  telar::GradientCheckOptions o;
  o.input_scale = 2.0;
  for (telar::Shape in :
       {telar::Shape(3), telar::Shape{3, 4}, telar::Shape{2, 3, 2}, telar::Shape{2, 2, 2, 3},
        telar::Shape{2, 3, 7}}) { // 21 values a plane: chunks of 8 and a remainder
    INFO("input " << in.str());
    BN bn(in[0]);
    bn.initialize(0);
    set_values(bn.weight, std::vector<double>(in[0], 0.0));
    for (std::size_t c = 0; c < in[0]; ++c) // gamma, beta away from 1 and 0
      set_values(Kokkos::subview(bn.weight, std::make_pair(c, c + 1)), {1.0 + 0.3 * double(c)});
    set_values(bn.bias, std::vector<double>(in[0], -0.2));
    o.initialize = false;
    auto const report = telar::check_gradients(bn, in, 3, o);
    INFO(report.str());
    CHECK(report.passed(1e-6));
  }
  SECTION("evaluation: fixed statistics") {
    BN bn(3);
    bn.initialize(0);
    set_values(bn.running_mean, {0.5, -0.25, 1.0});
    set_values(bn.running_var, {2.0, 0.5, 1.5});
    bn.set_training(false);
    o.initialize = false;
    auto const report = telar::check_gradients(bn, telar::Shape{3, 2}, 2, o);
    INFO(report.str());
    CHECK(report.passed(1e-6));
  }
}

TEST_CASE("BatchNorm's statistics equal a direct computation over long planes", "[batch_norm]") {
  // [5, 2 * 21]: each plane of 21 values is summed in chunks of 8 and a
  // remainder, then the 5 planes of a channel are added.
  std::size_t const n = 5, C = 2, S = 21;
  Mat x("x", n, C * S);
  auto hx = Kokkos::create_mirror_view(x);
  std::vector<double> sum(C, 0), sq(C, 0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t f = 0; f < C * S; ++f) {
      hx(i, f) = std::cos(1.3 * double(i * C * S + f)) * 3 + double(f / S);
      sum[f / S] += hx(i, f);
    }
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t f = 0; f < C * S; ++f)
      sq[f / S] += std::pow(hx(i, f) - sum[f / S] / double(n * S), 2);
  Kokkos::deep_copy(x, hx);
  BN bn(C, 1e-5, 1.0); // momentum 1: the running statistics are the batch's
  bn.initialize(0);
  Mat const y = run_forward(bn, x);
  std::vector<double> mean(C), var(C);
  for (std::size_t c = 0; c < C; ++c) {
    mean[c] = sum[c] / double(n * S);
    var[c] = sq[c] / double(n * S - 1);
  }
  CHECK(max_diff(bn.running_mean, mean) < 1e-12);
  CHECK(max_diff(bn.running_var, var) < 1e-12);
  auto hy = to_host(y);
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t f = 0; f < C * S; ++f) {
      std::size_t const c = f / S;
      double const want = (hx(i, f) - mean[c]) / std::sqrt(sq[c] / double(n * S) + 1e-5);
      worst = std::max(worst, std::abs(hy(i, f) - want));
    }
  CHECK(worst < 1e-12);
}

TEST_CASE("BatchNorm says what it accepts", "[batch_norm]") {
  BN bn(4);
  bn.initialize(0);
  CHECK(bn.output_shape(telar::Shape{4, 5, 5}) == telar::Shape{4, 5, 5});
  CHECK_THROWS_WITH(bn.output_shape(telar::Shape{3, 5}),
                    ContainsSubstring("BatchNorm(4) expects inputs [4, ...spatial]"));
  // One value per channel in training: PyTorch refuses it too.
  Mat x = telar::test::random_matrix<double>(1, 4, 1), y("y", 1, 4);
  BN::saved_type saved;
  CHECK_THROWS_WITH(bn.forward(Exec{}, x, y, saved),
                    ContainsSubstring("BatchNorm::forward: training needs more than 1 value per "
                                      "channel, got input [1, 4]"));
  bn.set_training(false); // evaluation takes a single sample
  CHECK_NOTHROW(bn.forward(Exec{}, x, y, saved));
  // Told the micro-batch (as the Trainer does), the shape pass refuses the
  // same before any forward, naming the sizes; spatial values count.
  bn.set_training(true);
  telar::set_training_batch(bn, 1);
  CHECK_THROWS_WITH(bn.output_shape(telar::Shape{4}),
                    "telar::BatchNorm(4): expected more than 1 value per channel when training, "
                    "got 1 (micro-batches of 1 sample(s) per rank x spatial size 1, input [4], "
                    "LocalStats): use more samples per micro-batch, telar::SyncStats over "
                    "data-parallel ranks or evaluation mode");
  CHECK_THROWS_WITH(bn.output_shape(telar::Shape{4, 1, 1}), ContainsSubstring("spatial size 1"));
  CHECK(bn.output_shape(telar::Shape{4, 2}) == telar::Shape{4, 2});
  telar::set_training_batch(bn, 2);
  CHECK(bn.output_shape(telar::Shape{4}) == telar::Shape{4});
  telar::set_training_batch(bn, 1);
  bn.set_training(false);
  CHECK(bn.output_shape(telar::Shape{4}) == telar::Shape{4});
  Mat wrong("wrong", 2, 6), wy("wy", 2, 6);
  CHECK_THROWS_WITH(bn.forward(Exec{}, wrong, wy, saved),
                    ContainsSubstring("expected [n, 4 * spatial]"));
  CHECK_THROWS_WITH(BN(2, 1e-5, 1.5), ContainsSubstring("momentum in [0, 1]"));
}

TEST_CASE("BatchNorm buffers pass through blocks; Recompute's replay updates them once",
          "[batch_norm][buffers]") {
  using Block = telar::Residual<BN, telar::Dense<double>>;
  using Model = telar::Sequential<telar::Recompute<BN>, Block, telar::Dropout<double>>;
  static_assert(telar::layer_traits<BN>::has_buffers);
  static_assert(telar::layer_traits<Model>::has_buffers);
  static_assert(!telar::layer_traits<telar::Dense<double>>::has_buffers);
  Model model(telar::Recompute<BN>(BN(3)), Block(BN(3), telar::Dense<double>(3, 3)), {});
  model.build(telar::Shape(3));
  model.initialize(1);
  std::vector<std::string> names;
  model.buffers([&](char const* name, auto&) { names.push_back(name); });
  CHECK(names == std::vector<std::string>{"0.running_mean", "0.running_var", "1.0.running_mean",
                                          "1.0.running_var"});
  CHECK(model.buffer_count() == 12);

  // Recompute replays the forward in backward: the running statistics see
  // the batch once (as without recomputation), the counter twice.
  telar::Recompute<BN>& rc = model.template layer<0>();
  Mat x = telar::test::random_matrix<double>(4, 3, 2), y("y", 4, 3), dy("dy", 4, 3), dx("dx", 4, 3);
  Kokkos::deep_copy(dy, 1.0);
  telar::Recompute<BN>::saved_type saved;
  rc.forward(Exec{}, x, y, saved);
  auto const after_forward = to_host(rc.inner().running_mean);
  rc.backward_input(Exec{}, dy, dx, saved);
  rc.backward_weight(Exec{}, dy, saved);
  CHECK(rc.inner().batches_tracked() == 1);
  CHECK(max_diff(rc.inner().running_mean,
                 std::vector<double>(after_forward.data(), after_forward.data() + 3)) == 0);
  telar::set_training(model, false); // reaches the layers inside blocks
  CHECK(!rc.inner().training());
  CHECK(!model.template layer<1>().body().template layer<0>().training());
}
