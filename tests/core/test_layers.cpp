// Finite-difference gradient checks of every built-in layer and the loss, in
// double precision.
#include "support.hpp"

#include <telar/core/detail/zeroed_grads.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/softmax_cross_entropy.hpp>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

using Catch::Approx;
using telar::test::Exec;
using telar::test::random_matrix;
using telar::test::to_host;
using Mat = telar::Matrix<double>;
using CMat = telar::ConstMatrix<double>;

namespace {

// L(x, params) = sum(y .* R) so that dL/dy = R.
template <class Layer>
double probe_loss(Layer const& layer, Mat x, Mat R) {
  Mat y("y", x.extent(0), R.extent(1));
  typename telar::layer_traits<Layer>::saved_type saved;
  layer.forward(Exec{}, x, y, saved);
  auto hy = to_host(y);
  auto hr = to_host(R);
  double s = 0;
  for (std::size_t i = 0; i < y.extent(0); ++i)
    for (std::size_t j = 0; j < y.extent(1); ++j)
      s += hy(i, j) * hr(i, j);
  return s;
}

// Central differences of f with respect to every entry of v. v may live in
// device memory: entries are perturbed in a host mirror and copied back.
template <class View>
double max_fd_error(View v, std::function<double()> const& f, View analytic, double h = 1e-6) {
  double worst = 0;
  auto hv = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(hv, v);
  auto ha = to_host(analytic);
  auto set = [&](std::size_t i, double value) {
    hv.data()[i] = value;
    Kokkos::deep_copy(v, hv); // a no-op when hv is v
  };
  for (std::size_t i = 0; i < v.size(); ++i) {
    double const old = hv.data()[i];
    set(i, old + h);
    double const up = f();
    set(i, old - h);
    double const down = f();
    set(i, old);
    double const fd = (up - down) / (2 * h);
    // Relative to the gradient, or to 1e-3 for tiny entries whose central
    // difference is dominated by round-off (~1e-16 |f| / h).
    worst = std::max(worst, telar::test::rel_diff(fd, ha.data()[i], 1e-3));
  }
  return worst;
}

template <class Layer>
void check_layer_gradients(Layer& layer, std::size_t n, std::size_t in, double tol = 1e-6) {
  std::size_t const out = layer.output_shape(telar::Shape(in)).size();
  Mat x = random_matrix<double>(n, in, 11);
  Mat R = random_matrix<double>(n, out, 12);
  Mat y("y", n, out), dx("dx", n, in);
  typename telar::layer_traits<Layer>::saved_type saved;
  layer.forward(Exec{}, x, y, saved);
  if constexpr (telar::layer_traits<Layer>::has_parameters)
    layer.parameters([](char const*, auto&, auto& g) { Kokkos::deep_copy(g, 0.0); });
  layer.backward_input(Exec{}, R, dx, saved);
  if constexpr (telar::layer_traits<Layer>::has_backward_weight)
    layer.backward_weight(Exec{}, R, saved);
  Kokkos::fence();
  auto f = [&] { return probe_loss(layer, x, R); };
  CHECK(max_fd_error(x, f, dx) < tol);
  if constexpr (telar::layer_traits<Layer>::has_parameters)
    layer.parameters([&](char const* name, auto& value, auto& grad) {
      INFO("parameter " << name);
      CHECK(max_fd_error(value, f, grad) < tol);
    });
}

} // namespace

TEST_CASE("Dense gradients match finite differences", "[layers][fd]") {
  for (bool bias : {true, false}) {
    telar::Dense<double> dense(7, 5, bias);
    dense.initialize(3);
    INFO("bias " << bias);
    check_layer_gradients(dense, 4, 7);
  }
}

TEST_CASE("Dense with the reference GEMM gives the same gradients", "[layers][fd]") {
  telar::Dense<double, telar::DefaultMemorySpace, telar::ReferenceGemm> dense(6, 3);
  dense.initialize(4);
  check_layer_gradients(dense, 5, 6);
}

// Weight gradients add up over calls. Inside a registered range of zeroed
// gradients (a Trainer's step, core/detail/zeroed_grads.hpp) the first
// product is written instead, once per registration: the values already
// there are not read (here 7s stand for them), the second call adds, the
// bias always adds, and a weight gradient outside the range adds from the
// first call.
TEST_CASE("Dense accumulates weight gradients, writing a step's first into zeroed ones",
          "[layers]") {
  telar::Dense<double> dense(3, 2);
  dense.initialize(1);
  Mat x = random_matrix<double>(4, 3, 1), dy = random_matrix<double>(4, 2, 2), y("y", 4, 2);
  telar::Dense<double>::saved_type saved;
  dense.forward(Exec{}, x, y, saved);
  Kokkos::deep_copy(dense.weight_grad, 0.0);
  Kokkos::deep_copy(dense.bias_grad, 0.0);
  dense.backward_weight(Exec{}, dy, saved);
  auto values = [](auto const& v) { // a copy (to_host of host memory is the view itself)
    auto const h = to_host(v);
    return std::vector<double>(h.data(), h.data() + h.size());
  };
  auto const once = values(dense.weight_grad), bias_once = values(dense.bias_grad);
  auto weight_is = [&](double k, double plus) {
    auto const w = values(dense.weight_grad);
    for (std::size_t i = 0; i < w.size(); ++i)
      CHECK(w[i] == Approx(k * once[i] + plus));
  };
  SECTION("over calls") {
    dense.backward_weight(Exec{}, dy, saved);
    weight_is(2, 0);
  }
  SECTION("the first of a step into zeroed gradients") {
    Kokkos::deep_copy(dense.weight_grad, 7.0);
    Kokkos::deep_copy(dense.bias_grad, 7.0);
    {
      telar::detail::ZeroedGradsScope const zeroed(dense.weight_grad.data(),
                                                   dense.weight_grad.size());
      dense.backward_weight(Exec{}, dy, saved);
      weight_is(1, 0);
      dense.backward_weight(Exec{}, dy, saved);
      weight_is(2, 0);
      auto const b = values(dense.bias_grad);
      for (std::size_t i = 0; i < b.size(); ++i)
        CHECK(b[i] == Approx(2 * bias_once[i] + 7));
    }
    dense.backward_weight(Exec{}, dy, saved); // the scope ended: adds
    weight_is(3, 0);
    Kokkos::deep_copy(dense.weight_grad, 7.0);
    telar::Vector<double> other("other", 6);
    telar::detail::ZeroedGradsScope const zeroed(other.data(), other.size());
    dense.backward_weight(Exec{}, dy, saved);
    weight_is(1, 7);
  }
}

TEST_CASE("Dense initialisation matches PyTorch's bounds and is reproducible", "[layers]") {
  telar::Dense<float> a(100, 50), b(100, 50), c(100, 50);
  a.initialize(7);
  b.initialize(7);
  c.initialize(8);
  auto ha = to_host(a.weight), hb = to_host(b.weight), hc = to_host(c.weight);
  float const bound = 1.f / 10.f;
  bool same = true, differs = false, in_bounds = true;
  double mean = 0;
  for (std::size_t i = 0; i < 50; ++i)
    for (std::size_t j = 0; j < 100; ++j) {
      same &= ha(i, j) == hb(i, j);
      differs |= ha(i, j) != hc(i, j);
      in_bounds &= ha(i, j) >= -bound && ha(i, j) < bound;
      mean += ha(i, j);
    }
  CHECK(same);
  CHECK(differs);
  CHECK(in_bounds);
  CHECK(std::abs(mean / 5000) < 0.005);
}

TEST_CASE("Dense reports shape errors with the shapes", "[layers]") {
  telar::Dense<float> dense(4, 3);
  dense.initialize(0);
  telar::Matrix<float> x("x", 2, 5), y("y", 2, 3);
  telar::Dense<float>::saved_type saved;
  try {
    dense.forward(Exec{}, x, y, saved);
    FAIL("no exception");
  } catch (telar::ShapeError const& e) {
    CHECK(std::string(e.what()) ==
          "telar::Dense::forward: expected [n, 4] -> [n, 3], got [2, 5] -> [2, 3]");
  }
}

TEST_CASE("ReLU gradients match finite differences", "[layers][fd]") {
  telar::ReLU<double> relu;
  check_layer_gradients(relu, 6, 9); // random inputs avoid the kink at 0
}

// ReLU masks bits instead of branching (detail::zero_unless): the values at
// the edges stay those of x > 0 ? x : 0, in float and double.
TEMPLATE_TEST_CASE("ReLU keeps x > 0 ? x : 0 at zero, infinities and NaN", "[layers]", float,
                   double) {
  using T = TestType;
  T const inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> const in{T(-2), T(-0.0), T(0), T(1e-30), T(3.5), -inf, inf, nan, -nan};
  telar::Matrix<T> x("x", 1, in.size()), y("y", 1, in.size()), dy("dy", 1, in.size()),
      dx("dx", 1, in.size());
  auto hx = Kokkos::create_mirror_view(x);
  for (std::size_t j = 0; j < in.size(); ++j)
    hx(0, j) = in[j];
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(dy, T(2));
  telar::ReLU<T> relu;
  typename telar::ReLU<T>::saved_type saved;
  relu.forward(Exec{}, x, y, saved);
  relu.backward_input(Exec{}, dy, dx, saved);
  auto hy = to_host(y);
  auto hdx = to_host(dx);
  for (std::size_t j = 0; j < in.size(); ++j) {
    INFO("x = " << in[j]);
    T const want = in[j] > T(0) ? in[j] : T(0);
    CHECK(hy(0, j) == want);
    CHECK(!std::signbit(hy(0, j))); // +0, never -0
    CHECK(hdx(0, j) == (in[j] > T(0) ? T(2) : T(0)));
  }
}

TEST_CASE("GELU matches its definition and finite differences", "[layers][fd]") {
  telar::GELU<double> gelu;
  check_layer_gradients(gelu, 6, 9);
  Mat x("x", 1, 3), y("y", 1, 3);
  auto hx = Kokkos::create_mirror_view(x);
  hx(0, 0) = -1;
  hx(0, 1) = 0;
  hx(0, 2) = 2;
  Kokkos::deep_copy(x, hx);
  telar::GELU<double>::saved_type saved;
  gelu.forward(Exec{}, x, y, saved);
  auto hy = to_host(y);
  CHECK(hy(0, 0) == Approx(-0.15865525393145707)); // torch.nn.functional.gelu(-1.)
  CHECK(hy(0, 1) == 0.0);
  CHECK(hy(0, 2) == Approx(1.9544997361036416));
}

TEST_CASE("Softmax cross-entropy: loss, gradient and label checks", "[layers][fd]") {
  telar::SoftmaxCrossEntropy<double> loss;
  std::size_t const n = 5, c = 4;
  Mat logits = random_matrix<double>(n, c, 21, 3.0), dl("dl", n, c);
  telar::Labels<> labels("labels", n);
  auto hl = Kokkos::create_mirror_view(labels);
  for (std::size_t i = 0; i < n; ++i)
    hl(i) = int(i % c);
  Kokkos::deep_copy(labels, hl);
  double const scale = 1.0 / n;
  auto r = loss.forward_backward(Exec{}, logits, labels, dl, scale);
  CHECK(r.samples == 5);

  // Loss against a direct host computation.
  auto hlog = to_host(logits);
  double expect = 0;
  long long correct = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double mx = hlog(i, 0), s = 0;
    std::size_t arg = 0;
    for (std::size_t j = 0; j < c; ++j)
      if (hlog(i, j) > mx) {
        mx = hlog(i, j);
        arg = j;
      }
    for (std::size_t j = 0; j < c; ++j)
      s += std::exp(hlog(i, j) - mx);
    expect += mx + std::log(s) - hlog(i, hl(i));
    correct += arg == std::size_t(hl(i));
  }
  CHECK(r.loss == Approx(expect).epsilon(1e-12));
  CHECK(r.correct == correct);

  // Gradient of scale * loss by central differences.
  Mat scratch("scratch", n, c);
  auto f = [&] { return scale * loss.forward_backward(Exec{}, logits, labels, scratch, 0.0).loss; };
  CHECK(max_fd_error(logits, f, dl) < 1e-6);

  hl(2) = 7;
  Kokkos::deep_copy(labels, hl);
  try {
    loss.forward_backward(Exec{}, logits, labels, dl, scale);
    FAIL("no exception");
  } catch (telar::ShapeError const& e) {
    CHECK(std::string(e.what()) == "telar::SoftmaxCrossEntropy: 1 of 5 labels are outside [0, 4)");
  }
}

TEST_CASE("float erf and exp without library calls stay within a few ulp of libm", "[layers]") {
  using telar::detail::fast_erf;
  using telar::detail::fast_exp;
  double worst_erf = 0, worst_exp = 0;
  for (int i = -200000; i <= 200000; ++i) {
    float const x = float(i) * 5e-5f; // [-10, 10]
    worst_erf = std::max(worst_erf, std::fabs(double(fast_erf(x)) - std::erf(double(x))));
    float const y = float(i) * 4.35e-4f; // [-87, 87]
    worst_exp = std::max(worst_exp, std::fabs(double(fast_exp(y)) / std::exp(double(y)) - 1));
  }
  CHECK(worst_erf < 4e-7);
  CHECK(worst_exp < 2.4e-7); // 2 ulp
  float const nan = std::numeric_limits<float>::quiet_NaN();
  float const inf = std::numeric_limits<float>::infinity();
  CHECK(std::isnan(fast_erf(nan)));
  CHECK(std::isnan(fast_exp(nan)));
  CHECK(fast_erf(inf) == 1.0f);
  CHECK(fast_erf(-inf) == -1.0f);
  CHECK(fast_exp(-inf) < 1e-37f);
  // double keeps the library's functions (the gradient checks run in double)
  CHECK(fast_erf(0.3) == std::erf(0.3));
  CHECK(fast_exp(-2.5) == std::exp(-2.5));
}
