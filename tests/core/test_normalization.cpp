// LayerNorm and GroupNorm: values against a direct host computation,
// gradients by finite differences in double (telar::check_gradients) over
// several shapes, with and without affine parameters.
#include "support.hpp"

#include <telar/layers/normalization.hpp>
#include <telar/testing/check_gradients.hpp>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <vector>

using Catch::Approx;
using Catch::Matchers::ContainsSubstring;
using telar::test::Exec;
using telar::test::random_matrix;
using telar::test::to_host;
using Mat = telar::Matrix<double>;

namespace {

// gamma, beta away from 1 and 0, so the checks see where each is used.
template <class L>
void randomize_affine(L& layer, std::uint64_t seed) {
  layer.parameters([&](char const*, auto& v, auto&) {
    auto h = Kokkos::create_mirror_view(v);
    for (std::size_t i = 0; i < h.extent(0); ++i)
      h(i) = 1.0 + 0.5 * telar::test::hash_uniform(seed++, i);
    Kokkos::deep_copy(v, h);
  });
}

template <class L>
void check_fd(L& layer, telar::Shape const& in, std::size_t samples) {
  layer.initialize(0);
  randomize_affine(layer, 5);
  telar::GradientCheckOptions o;
  o.initialize = false;
  o.input_scale = 2.0;
  auto const report = telar::check_gradients(layer, in, samples, o);
  INFO(report.str());
  CHECK(report.passed(1e-6));
}

// Host reference: normalise rows of `row` values; value f of a sample uses
// parameter (f / stride) % params.
std::vector<double> reference(Mat x, std::size_t row, std::size_t stride, std::vector<double> gamma,
                              std::vector<double> beta, double eps) {
  auto hx = to_host(x);
  std::size_t const n = x.extent(0), k = x.extent(1);
  std::vector<double> y(n * k);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t f0 = 0; f0 < k; f0 += row) {
      double mu = 0, var = 0;
      for (std::size_t j = 0; j < row; ++j)
        mu += hx(i, f0 + j) / double(row);
      for (std::size_t j = 0; j < row; ++j)
        var += (hx(i, f0 + j) - mu) * (hx(i, f0 + j) - mu) / double(row);
      for (std::size_t j = 0; j < row; ++j) {
        std::size_t const f = f0 + j, p = f / stride % gamma.size();
        y[i * k + f] = (hx(i, f) - mu) / std::sqrt(var + eps) * gamma[p] + beta[p];
      }
    }
  return y;
}

template <class L>
std::vector<double> host_param(L& layer, char const* which) {
  std::vector<double> out;
  layer.parameters([&](char const* name, auto& v, auto&) {
    if (std::string(name) == which) {
      auto h = to_host(v);
      out.assign(h.data(), h.data() + h.extent(0));
    }
  });
  return out;
}

template <class L>
double max_diff_to_reference(L& layer, std::size_t n, std::size_t k, std::size_t row,
                             std::size_t stride, std::vector<double> gamma,
                             std::vector<double> beta) {
  Mat x = random_matrix<double>(n, k, 3, 4.0), y("y", n, k);
  typename L::saved_type saved;
  layer.forward(Exec{}, x, y, saved);
  auto const want = reference(x, row, stride, gamma, beta, layer.eps());
  auto hy = to_host(y);
  double worst = 0;
  for (std::size_t i = 0; i < n * k; ++i)
    worst = std::max(worst, std::abs(hy.data()[i] - want[i]));
  return worst;
}

} // namespace

TEST_CASE("LayerNorm matches its definition", "[normalization]") {
  telar::LayerNorm<double> ln(6);
  ln.initialize(0);
  // Fresh parameters: gamma 1, beta 0.
  CHECK(host_param(ln, "weight") == std::vector<double>(6, 1.0));
  CHECK(host_param(ln, "bias") == std::vector<double>(6, 0.0));
  randomize_affine(ln, 9);
  auto const g = host_param(ln, "weight"), b = host_param(ln, "bias");
  CHECK(max_diff_to_reference(ln, 3, 6, 6, 1, g, b) < 1e-12);     // [6]
  CHECK(max_diff_to_reference(ln, 3, 4 * 6, 6, 1, g, b) < 1e-12); // [4, 6]: each position
  CHECK(ln.output_shape(telar::Shape{4, 6}) == telar::Shape{4, 6});
  CHECK_THROWS_WITH(ln.output_shape(telar::Shape{6, 4}), "LayerNorm expects inputs [..., 6]");
}

TEST_CASE("LayerNorm gradients match finite differences", "[normalization][fd]") {
  for (telar::Shape in : {telar::Shape(7), telar::Shape{3, 5}, telar::Shape{2, 2, 4}}) {
    INFO("input " << in.str());
    telar::LayerNorm<double> ln(in.back());
    check_fd(ln, in, 3);
  }
}

TEST_CASE("GroupNorm matches its definition", "[normalization]") {
  // [6, 2, 3]: 3 groups of 2 channels, 6 spatial values per channel.
  telar::GroupNorm<double> gn(3, 6);
  gn.initialize(0);
  randomize_affine(gn, 4);
  auto const g = host_param(gn, "weight"), b = host_param(gn, "bias");
  CHECK(g.size() == 6);
  CHECK(max_diff_to_reference(gn, 2, 36, 12, 6, g, b) < 1e-12);
  // Without affine: no parameters, plain normalisation.
  telar::GroupNorm<double> plain(2, 4, 1e-5, false);
  plain.initialize(0);
  int params = 0;
  plain.parameters([&](char const*, auto&, auto&) { ++params; });
  CHECK(params == 0);
  CHECK(max_diff_to_reference(plain, 3, 4 * 5, 10, 5, {1.0}, {0.0}) < 1e-12);
  // groups == channels is instance normalisation, groups == 1 the whole sample.
  telar::GroupNorm<double> inst(4, 4, 1e-5, false), whole(1, 4, 1e-5, false);
  inst.initialize(0);
  whole.initialize(0);
  CHECK(max_diff_to_reference(inst, 2, 4 * 3, 3, 3, {1.0}, {0.0}) < 1e-12);
  CHECK(max_diff_to_reference(whole, 2, 4 * 3, 12, 3, {1.0}, {0.0}) < 1e-12);
}

TEST_CASE("GroupNorm gradients match finite differences", "[normalization][fd]") {
  struct Case {
    std::size_t groups;
    telar::Shape in;
  };
  for (Case c : {Case{2, {4, 5}}, Case{3, {6, 2, 3}}, Case{1, {4, 3, 2}}, Case{4, {4, 3, 2}},
                 Case{2, {4, 2, 3, 2}}}) {
    for (bool affine : {true, false}) {
      INFO("groups " << c.groups << ", input " << c.in.str() << ", affine " << affine);
      telar::GroupNorm<double> gn(c.groups, c.in[0], 1e-5, affine);
      check_fd(gn, c.in, 2);
    }
  }
}

TEST_CASE("GroupNorm and LayerNorm say what they accept", "[normalization]") {
  CHECK_THROWS_WITH(telar::GroupNorm<float>(4, 6),
                    "telar::GroupNorm: 6 channels cannot be split into 4 groups");
  telar::GroupNorm<float> gn(2, 4);
  CHECK(gn.output_shape(telar::Shape{4, 8, 8}) == telar::Shape{4, 8, 8});
  CHECK_THROWS_WITH(gn.output_shape(telar::Shape(4)),
                    "GroupNorm expects inputs [4, ...spatial] of rank 2 to 4");
  CHECK_THROWS_WITH(gn.output_shape(telar::Shape{3, 8, 8}),
                    "GroupNorm expects inputs [4, ...spatial] of rank 2 to 4");
  telar::Matrix<float> x("x", 2, 16), y("y", 2, 16);
  telar::GroupNorm<float>::saved_type saved;
  CHECK_THROWS_WITH(gn.forward(Exec{}, x, y, saved), ContainsSubstring("(layer not initialised)"));
  telar::LayerNorm<float> ln(5);
  ln.initialize(0);
  telar::LayerNorm<float>::saved_type ls;
  CHECK_THROWS_WITH(
      ln.forward(Exec{}, x, y, ls),
      "telar::LayerNorm::forward: expected [n, k * 5] twice, got [2, 16] and [2, 16]");
}

TEST_CASE("Normalisation in float: zero mean, unit variance per group", "[normalization]") {
  telar::GroupNorm<float> gn(2, 4);
  gn.initialize(0);
  auto x = random_matrix<float>(3, 4 * 9, 8, 10.0);
  telar::Matrix<float> y("y", 3, 36), dx("dx", 3, 36);
  telar::GroupNorm<float>::saved_type saved;
  gn.forward(Exec{}, x, y, saved);
  auto hy = to_host(y);
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t g = 0; g < 2; ++g) {
      double mu = 0, sq = 0;
      for (std::size_t j = 0; j < 18; ++j) {
        mu += hy(i, g * 18 + j) / 18.0;
        sq += double(hy(i, g * 18 + j)) * hy(i, g * 18 + j) / 18.0;
      }
      CHECK(std::abs(mu) < 1e-5);
      CHECK(sq == Approx(1.0).epsilon(1e-4));
    }
  // The saved state is reused: a second forward on it gives the same output.
  float const last = hy(2, 35);
  Kokkos::deep_copy(y, 0.f);
  gn.forward(Exec{}, x, y, saved);
  CHECK(to_host(y)(2, 35) == last);
}
