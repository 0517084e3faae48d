// MeanSquaredError and PositionwiseCrossEntropy: values by hand, gradients by
// finite differences (double), the ignore index, and training with each.
#include "support.hpp"

#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/losses.hpp>
#include <telar/optim/adam.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <functional>
#include <vector>

using Catch::Approx;
using Catch::Matchers::ContainsSubstring;
using telar::test::Exec;
using telar::test::random_matrix;
using telar::test::to_host;
using Mat = telar::Matrix<double>;
using PosLabels = telar::PositionwiseCrossEntropy<double>::target_type;

namespace {

Mat matrix(std::size_t r, std::size_t c, std::vector<double> const& v) {
  Mat m("m", r, c);
  auto h = Kokkos::create_mirror_view(m);
  for (std::size_t i = 0; i < r * c; ++i)
    h.data()[i] = v[i];
  Kokkos::deep_copy(m, h);
  return m;
}

Kokkos::View<int**, Kokkos::LayoutRight, telar::DefaultMemorySpace>
labels(std::size_t n, std::size_t p, std::vector<int> const& v) {
  Kokkos::View<int**, Kokkos::LayoutRight, telar::DefaultMemorySpace> l("labels", n, p);
  auto h = Kokkos::create_mirror_view(l);
  for (std::size_t i = 0; i < n * p; ++i)
    h.data()[i] = v[i];
  Kokkos::deep_copy(l, h);
  return l;
}

// Largest relative difference between central differences of f over every
// entry of v and `analytic`.
double max_fd_error(Mat v, std::function<double()> const& f, Mat analytic, double h = 1e-6) {
  double worst = 0;
  auto hv = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(hv, v);
  auto ha = to_host(analytic);
  for (std::size_t i = 0; i < v.size(); ++i) {
    double const old = hv.data()[i];
    hv.data()[i] = old + h;
    Kokkos::deep_copy(v, hv);
    double const up = f();
    hv.data()[i] = old - h;
    Kokkos::deep_copy(v, hv);
    double const down = f();
    hv.data()[i] = old;
    Kokkos::deep_copy(v, hv);
    worst = std::max(worst, telar::test::rel_diff((up - down) / (2 * h), ha.data()[i], 1e-3));
  }
  return worst;
}

} // namespace

TEST_CASE("MeanSquaredError: value, count and gradient", "[losses][fd]") {
  telar::MeanSquaredError<double> mse;
  Mat y = matrix(2, 2, {1, 2, 3, 4}), t = matrix(2, 2, {0, 2, 1, 1}), dy("dy", 2, 2);
  CHECK(mse.count(Exec{}, t) == 4);
  auto r = mse.forward_backward(Exec{}, y, t, dy, 0.25);
  CHECK(r.loss == Approx(1 + 0 + 4 + 9));
  CHECK(r.count == 4);
  CHECK(r.samples == 2);
  CHECK(r.correct == 0);
  auto hd = to_host(dy); // 0.25 * 2 * (y - t)
  CHECK(hd(0, 0) == Approx(0.5));
  CHECK(hd(0, 1) == Approx(0.0));
  CHECK(hd(1, 0) == Approx(1.0));
  CHECK(hd(1, 1) == Approx(1.5));
  STATIC_CHECK(!telar::loss_traits<telar::MeanSquaredError<double>>::has_accuracy);
  STATIC_CHECK(telar::loss_traits<telar::MeanSquaredError<double>>::has_count);

  // The gradient of scale * loss by central differences.
  Mat yr = random_matrix<double>(5, 3, 1), tr = random_matrix<double>(5, 3, 2), g("g", 5, 3),
      scratch("s", 5, 3);
  double const scale = 1.0 / 15;
  mse.forward_backward(Exec{}, yr, tr, g, scale);
  auto f = [&] { return scale * mse.forward_backward(Exec{}, yr, tr, scratch, 0.0).loss; };
  CHECK(max_fd_error(yr, f, g) < 1e-6);

  Mat bad("bad", 5, 2);
  CHECK_THROWS_WITH(mse.forward_backward(Exec{}, yr, bad, g, scale),
                    "telar::MeanSquaredError: outputs [5, 3], targets [5, 2], gradient [5, 3] do "
                    "not match");
}

TEST_CASE("PositionwiseCrossEntropy: values by hand, ignore_index and accuracy", "[losses][fd]") {
  telar::PositionwiseCrossEntropy<double> ce; // ignore_index -100
  ce.build(telar::Shape{3, 2});
  // 2 samples x 3 positions x 2 classes.
  Mat y = matrix(2, 6,
                 {0, 0, /**/ 2, 0, /**/ 0, 1, //
                  1, 3, /**/ 5, 5, /**/ 0, 0});
  auto l = labels(2, 3,
                  {0, 0, -100, //
                   1, -100, 1});
  CHECK(ce.count(Exec{}, l) == 4);
  Mat dy("dy", 2, 6);
  auto r = ce.forward_backward(Exec{}, y, l, dy, 0.25);
  // log(1 + e^(other - label)) per position that counts.
  double const expect =
      std::log(2.0) + std::log(1 + std::exp(-2.0)) + std::log(1 + std::exp(-2.0)) + std::log(2.0);
  CHECK(r.loss == Approx(expect).epsilon(1e-12));
  CHECK(r.count == 4);
  CHECK(r.samples == 2);
  // Ties go to the first class: (0,0) label 0 right; (2,0) label 0 right;
  // (1,3) label 1 right; (0,0) label 1 wrong.
  CHECK(r.correct == 3);
  auto hd = to_host(dy);
  CHECK(hd(0, 4) == 0.0); // ignored
  CHECK(hd(0, 5) == 0.0);
  CHECK(hd(1, 2) == 0.0);
  CHECK(hd(1, 3) == 0.0);
  CHECK(hd(0, 0) == Approx(0.25 * (0.5 - 1)));
  CHECK(hd(0, 1) == Approx(0.25 * 0.5));
  STATIC_CHECK(telar::loss_traits<telar::PositionwiseCrossEntropy<double>>::has_accuracy);

  // Another ignore index: -100 is now a bad label, 1 is ignored.
  telar::PositionwiseCrossEntropy<double> ce1(1);
  CHECK(ce1.count(Exec{}, l) == 4);
  CHECK_THROWS_WITH(ce1.forward_backward(Exec{}, y, l, dy, 0.25),
                    "telar::PositionwiseCrossEntropy: 2 of 6 labels are outside [0, 2) and not "
                    "the ignore_index 1");
}

TEST_CASE("PositionwiseCrossEntropy gradient matches finite differences", "[losses][fd]") {
  telar::PositionwiseCrossEntropy<double> ce(-1);
  std::size_t const n = 3, P = 4, C = 5;
  ce.build(telar::Shape{P, C});
  Mat y = random_matrix<double>(n, P * C, 31, 3.0), g("g", n, P * C), scratch("s", n, P * C);
  auto l = labels(n, P, {0, 4, -1, 2, /**/ -1, -1, 3, 1, /**/ 2, 2, 0, -1});
  double const scale = 1.0 / double(ce.count(Exec{}, l));
  CHECK(ce.count(Exec{}, l) == 8);
  ce.forward_backward(Exec{}, y, l, g, scale);
  auto f = [&] { return scale * ce.forward_backward(Exec{}, y, l, scratch, 0.0).loss; };
  CHECK(max_fd_error(y, f, g) < 1e-6);
}

TEST_CASE("PositionwiseCrossEntropy rejects shapes it cannot take", "[losses]") {
  telar::PositionwiseCrossEntropy<double> ce;
  CHECK_THROWS_WITH(ce.build(telar::Shape{10}),
                    ContainsSubstring("the model's output is [10], expected [positions, classes]"));
  ce.build(telar::Shape{3, 4});
  Mat y("y", 2, 12), dy("dy", 2, 12);
  PosLabels l("l", 2, 4);
  CHECK_THROWS_WITH(ce.forward_backward(Exec{}, y, l, dy, 1.0),
                    ContainsSubstring("logits [2, 12], labels [2, 4], gradient [2, 12] do not "
                                      "match [n, 3 * 4] and [n, 3]"));
}

namespace {

template <class T>
using Regressor = telar::Sequential<telar::Dense<T>, telar::GELU<T>, telar::Dense<T>>;

// y = A x (+ a little curvature), 4 -> 2.
std::pair<telar::Matrix<float>, telar::Matrix<float>> regression_data(std::size_t n) {
  telar::Matrix<float> x("x", n, 4), t("t", n, 2);
  auto hx = Kokkos::create_mirror_view(x);
  auto ht = Kokkos::create_mirror_view(t);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < 4; ++j)
      hx(i, j) = float(telar::test::hash_uniform(5, i * 4 + j));
    ht(i, 0) = 0.5f * hx(i, 0) - hx(i, 1) + 0.3f * hx(i, 2) * hx(i, 2);
    ht(i, 1) = hx(i, 3) + 0.2f * hx(i, 0);
  }
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(t, ht);
  return {x, t};
}

// Per position: class = arg-max of three fixed projections of its 6
// features; every fifth position is padding (label -100, random features).
template <class T>
std::pair<telar::Matrix<T>, PosLabels> positions_data(std::size_t n, std::size_t P,
                                                      std::uint64_t seed) {
  std::size_t const F = 6;
  telar::Matrix<T> x("x", n, P * F);
  PosLabels y("y", n, P);
  auto hx = Kokkos::create_mirror_view(x);
  auto hy = Kokkos::create_mirror_view(y);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t p = 0; p < P; ++p) {
      double score[3] = {0, 0, 0};
      for (std::size_t f = 0; f < F; ++f) {
        double const v = telar::test::hash_uniform(seed, (i * P + p) * F + f);
        hx(i, p * F + f) = T(v);
        for (int c = 0; c < 3; ++c)
          score[c] += v * telar::test::hash_uniform(99, c * F + f);
      }
      int best = 0;
      for (int c = 1; c < 3; ++c)
        if (score[c] > score[best])
          best = c;
      hy(i, p) = (i * P + p) % 5 == 4 ? -100 : best;
    }
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(y, hy);
  return {x, y};
}

template <class T>
using Tagger = telar::Sequential<telar::Dense<T>, telar::ReLU<T>, telar::Dense<T>>;
template <class T>
Tagger<T> make_tagger() {
  return Tagger<T>(telar::Dense<T>(6, 16), {}, telar::Dense<T>(16, 3));
}

} // namespace

TEST_CASE("A Trainer fits a regression with MeanSquaredError", "[losses][train]") {
  auto const data = regression_data(256);
  auto const& x = data.first;
  auto const& t = data.second;
  telar::TrainerOptions opts;
  opts.seed = 3;
  opts.lr = telar::constant_lr(0.01);
  telar::Trainer<Regressor<float>, telar::Serial, telar::Adam<float>,
                 telar::MeanSquaredError<float>>
      trainer(Regressor<float>(telar::Dense<float>(4, 16), {}, telar::Dense<float>(16, 2)), {},
              opts, 4);
  auto const before = trainer.evaluate(x, t);
  CHECK_FALSE(before.has_accuracy);
  CHECK(before.samples == 256);
  for (int epoch = 0; epoch < 10; ++epoch)
    for (std::size_t b = 0; b + 32 <= 256; b += 32)
      trainer.step(telar::rows(x, b, b + 32), telar::rows(t, b, b + 32));
  auto const after = trainer.evaluate(x, t);
  INFO("MSE " << before.loss << " -> " << after.loss);
  CHECK(after.loss < 0.2 * before.loss);
}

TEST_CASE("A Trainer fits a per-position classifier with PositionwiseCrossEntropy",
          "[losses][train]") {
  auto const data = positions_data<float>(128, 5, 7);
  auto const& x = data.first;
  auto const& y = data.second;
  telar::TrainerOptions opts;
  opts.seed = 1;
  opts.lr = telar::constant_lr(0.01);
  telar::Trainer<Tagger<float>, telar::Serial, telar::Adam<float>,
                 telar::PositionwiseCrossEntropy<float>>
      trainer(make_tagger<float>(), {}, opts, telar::Shape{5, 6});
  CHECK(trainer.shapes().back() == telar::Shape{5, 3});
  auto const before = trainer.evaluate(x, y);
  CHECK(before.has_accuracy);
  for (int epoch = 0; epoch < 15; ++epoch)
    for (std::size_t b = 0; b + 32 <= 128; b += 32)
      trainer.step(telar::rows(x, b, b + 32), telar::rows(y, b, b + 32));
  auto const after = trainer.evaluate(x, y);
  INFO("loss " << before.loss << " -> " << after.loss << ", accuracy " << before.accuracy << " -> "
               << after.accuracy);
  CHECK(after.loss < 0.5 * before.loss);
  CHECK(after.accuracy > 0.85);
}

TEST_CASE("PositionwiseCrossEntropy: micro-batches share the step's count", "[losses][train]") {
  // Padding is uneven across micro-batches: a per-micro-batch mean would differ.
  auto data = positions_data<double>(12, 5, 9);
  auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, data.second);
  for (std::size_t p = 0; p < 5; ++p)
    hy(0, p) = hy(1, p) = -100;
  Kokkos::deep_copy(data.second, hy);
  auto run = [&](int m) {
    telar::TrainerOptions opts;
    opts.seed = 4;
    opts.microbatches = m;
    opts.lr = telar::constant_lr(0.5);
    telar::Trainer<Tagger<double>, telar::Serial, telar::SGD<double>,
                   telar::PositionwiseCrossEntropy<double>>
        t(make_tagger<double>(), {}, opts, telar::Shape{5, 6});
    double loss = 0;
    for (int s = 0; s < 2; ++s)
      loss = t.step(data.first, data.second).loss;
    return std::make_pair(loss, t.parameters());
  };
  auto const one = run(1);
  for (int m : {2, 3}) {
    auto const many = run(m);
    INFO("microbatches " << m);
    CHECK(many.first == Approx(one.first).epsilon(1e-12));
    double worst = 0;
    for (std::size_t i = 0; i < one.second.size(); ++i)
      worst = std::max(worst, std::abs(one.second[i] - many.second[i]));
    CHECK(worst < 1e-12);
  }
}

TEST_CASE("A Trainer rejects a loss that cannot take the model's output", "[losses][train]") {
  telar::TrainerOptions opts;
  using T = telar::Trainer<Tagger<float>, telar::Serial, telar::SGD<float>,
                           telar::PositionwiseCrossEntropy<float>>;
  CHECK_THROWS_WITH(T(make_tagger<float>(), {}, opts, 6),
                    ContainsSubstring("the model's output is [3], expected [positions, classes]"));
}
