// Nested blocks: Sequential in Sequential, Residual and ProjectedResidual.
// Shapes and their error messages, parameter names, gradients by finite
// differences (double), backward_weight without backward_input, and saved
// state reused across steps.
#include "support.hpp"

#include <telar/core/residual.hpp>
#include <telar/core/sequential.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/normalization.hpp>
#include <telar/testing/check_gradients.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using telar::test::random_matrix;
using telar::test::to_host;
using Exec = telar::DefaultMemorySpace::execution_space;

namespace {

// y = 2 x with a fused backward: a shortcut that is not split.
template <class T>
struct Twice {
  using value_type = T;
  using memory_space = telar::DefaultMemorySpace;
  static constexpr char const* name() { return "Twice"; }
  telar::Shape output_shape(telar::Shape const& in) const { return in; }
  template <class E>
  void forward(E const& exec, telar::ConstMatrix<T> x, telar::Matrix<T> y, telar::NoSaved&) const {
    Kokkos::parallel_for(
        Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {x.extent(0), x.extent(1)}),
        KOKKOS_LAMBDA(int i, int j) { y(i, j) = 2 * x(i, j); });
  }
  template <class E>
  void backward(E const& exec, telar::ConstMatrix<T> dy, telar::Matrix<T> dx,
                telar::NoSaved const&) const {
    Kokkos::parallel_for(
        Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {dy.extent(0), dy.extent(1)}),
        KOKKOS_LAMBDA(int i, int j) { dx(i, j) = 2 * dy(i, j); });
  }
};

// Accepts only [1, 28, 28] (a layer built for MNIST).
struct MnistOnly {
  using value_type = float;
  using memory_space = telar::DefaultMemorySpace;
  static constexpr char const* name() { return "MnistOnly"; }
  telar::Shape input_shape() const { return telar::Shape{1, 28, 28}; }
  telar::Shape output_shape(telar::Shape const& in) const { return in; }
  template <class E>
  void forward(E const&, telar::ConstMatrix<float>, telar::Matrix<float>, telar::NoSaved&) const {}
  template <class E>
  void backward_input(E const&, telar::ConstMatrix<float>, telar::Matrix<float>,
                      telar::NoSaved const&) const {}
};

template <class T>
using D = telar::Dense<T>;
template <class T>
using Inner = telar::Sequential<D<T>, telar::GELU<T>>;
template <class T>
using PreNorm = telar::Residual<telar::LayerNorm<T>, D<T>, telar::GELU<T>, D<T>>;
template <class T>
using Down = telar::ProjectedResidual<D<T>, D<T>, telar::ReLU<T>>;
// [P, 4] -> Dense -> [P, 6] -> ReLU -> (Dense, GELU) -> PreNorm -> Down -> [P, 3]
template <class T>
using Net = telar::Sequential<D<T>, telar::ReLU<T>, Inner<T>, PreNorm<T>, Down<T>>;

template <class T>
Net<T> make_net() {
  return Net<T>(D<T>(4, 6), {}, Inner<T>(D<T>(6, 6), {}),
                PreNorm<T>(telar::LayerNorm<T>(6), D<T>(6, 8), {}, D<T>(8, 6)),
                Down<T>(D<T>(6, 3), D<T>(6, 3), {}));
}

// Blocks first (the outer chain never asks them for dx), and a fused shortcut.
template <class T>
using Twice2 = telar::ProjectedResidual<Twice<T>, D<T>, telar::GELU<T>>;
template <class T>
using BlockFirst = telar::Sequential<PreNorm<T>, Twice2<T>, telar::Sequential<Down<T>>>;
template <class T>
BlockFirst<T> make_block_first() {
  return BlockFirst<T>(PreNorm<T>(telar::LayerNorm<T>(6), D<T>(6, 8), {}, D<T>(8, 6)),
                       Twice2<T>(Twice<T>{}, D<T>(6, 6), {}),
                       telar::Sequential<Down<T>>(Down<T>(D<T>(6, 3), D<T>(6, 3), {})));
}

template <class M>
std::vector<std::string> names(M& m) {
  std::vector<std::string> out;
  m.parameters([&](char const* n, auto&, auto&) { out.emplace_back(n); });
  return out;
}

template <class M>
void zero_grads(M& m) {
  m.parameters([](char const*, auto&, auto& g) { Kokkos::deep_copy(g, 0.0); });
}

template <class M>
std::vector<double> grads(M& m) {
  std::vector<double> out;
  m.parameters([&](char const*, auto&, auto& g) {
    auto h = to_host(g);
    out.insert(out.end(), h.data(), h.data() + h.size());
  });
  return out;
}

template <class V>
std::vector<double> values(V const& v) {
  auto h = to_host(v);
  return std::vector<double>(h.data(), h.data() + h.size());
}

struct Pass {
  std::vector<double> y, dx, grads;
};

// forward, then backward_input (if asked) and backward_weight, on `saved`.
template <class M>
Pass run(M& m, typename M::saved_type& saved, telar::Matrix<double> x, telar::Matrix<double> dy,
         bool with_input = true) {
  telar::Matrix<double> y("y", x.extent(0), dy.extent(1)), dx("dx", x.extent(0), x.extent(1));
  m.forward(Exec{}, x, y, saved);
  zero_grads(m);
  if (with_input)
    m.backward_input(Exec{}, dy, dx, saved);
  m.backward_weight(Exec{}, dy, saved);
  Kokkos::fence();
  return {values(y), values(dx), grads(m)};
}

double max_abs_diff(std::vector<double> const& a, std::vector<double> const& b) {
  if (a.size() != b.size())
    return 1e300;
  double w = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    w = std::max(w, std::abs(a[i] - b[i]));
  return w;
}

template <class E>
std::string message_of(E&& e) {
  try {
    e();
  } catch (telar::ShapeError const& err) {
    return err.what();
  }
  return "no exception";
}

} // namespace

TEST_CASE("Nested blocks: shapes along the chain and parameter names", "[blocks]") {
  auto net = make_net<float>();
  auto const s = net.shapes(telar::Shape{5, 4});
  CHECK(s == std::vector<telar::Shape>{telar::Shape{5, 4}, telar::Shape{5, 6}, telar::Shape{5, 6},
                                       telar::Shape{5, 6}, telar::Shape{5, 6}, telar::Shape{5, 3}});
  CHECK(net.layer_names() ==
        std::vector<std::string>{"Dense", "ReLU", "Sequential", "Residual", "ProjectedResidual"});
  CHECK(net.output_shape(telar::Shape(4)) == telar::Shape(3));
  net.build(telar::Shape{5, 4});
  net.initialize(1);
  CHECK(names(net) == std::vector<std::string>{"0.weight", "0.bias", "2.0.weight", "2.0.bias",
                                               "3.0.weight", "3.0.bias", "3.1.weight", "3.1.bias",
                                               "3.3.weight", "3.3.bias", "4.0.weight", "4.0.bias",
                                               "4.shortcut.weight", "4.shortcut.bias"});
  auto bf = make_block_first<float>();
  bf.build(telar::Shape(6));
  bf.initialize(1);
  CHECK(names(bf) == std::vector<std::string>{"0.0.weight", "0.0.bias", "0.1.weight", "0.1.bias",
                                              "0.3.weight", "0.3.bias", "1.0.weight", "1.0.bias",
                                              "2.0.0.weight", "2.0.0.bias", "2.0.shortcut.weight",
                                              "2.0.shortcut.bias"});
}

TEST_CASE("Nested blocks: run-time shape errors name the layer and both shapes", "[blocks]") {
  // A declared input shape, at the top and inside a block.
  telar::Sequential<MnistOnly> mnist;
  CHECK(message_of([&] {
          mnist.shapes(telar::Shape{3, 32, 32});
        }) ==
        "telar::Sequential: layer 0 (MnistOnly) expects input [1, 28, 28] but the model input "
        "produces [3, 32, 32]");
  telar::Sequential<telar::ReLU<float>, telar::Sequential<MnistOnly>> nested;
  CHECK(message_of([&] {
          nested.build(telar::Shape{3, 32, 32});
        }) ==
        "telar::Sequential: layer 1 (Sequential) expects input [1, 28, 28] but layer 0 (ReLU) "
        "produces [3, 32, 32]");
  CHECK(nested.output_shape(telar::Shape{1, 28, 28}) == telar::Shape{1, 28, 28});

  // A mismatch inside an inner chain: the outer and the inner layer named.
  using Bad = telar::Sequential<telar::ReLU<float>, telar::Sequential<D<float>, D<float>>>;
  Bad bad({}, telar::Sequential<D<float>, D<float>>(D<float>(4, 3), D<float>(5, 2)));
  CHECK(message_of([&] { bad.shapes(telar::Shape(4)); }) ==
        "telar::Sequential: layer 1 (Sequential) cannot take input [4] from layer 0 (ReLU): "
        "telar::Sequential: layer 1 (Dense) cannot take input [3] from layer 0 (Dense): Dense "
        "expects inputs [..., 5]");

  // Residual bodies that change the shape.
  telar::Sequential<telar::Residual<D<float>>> res(telar::Residual<D<float>>(D<float>(4, 3)));
  CHECK(message_of([&] {
          res.shapes(telar::Shape{2, 4});
        }) ==
        "telar::Sequential: layer 0 (Residual) cannot take input [2, 4] from the model input: the "
        "body turns [2, 4] into [2, 3]; use telar::ProjectedResidual to add a projection of the "
        "input");
  telar::Sequential<D<float>, Down<float>> proj(D<float>(3, 6),
                                                Down<float>(D<float>(6, 2), D<float>(6, 3), {}));
  CHECK(message_of([&] { proj.shapes(telar::Shape(3)); }) ==
        "telar::Sequential: layer 1 (ProjectedResidual) cannot take input [6] from layer 0 "
        "(Dense): the body gives [3] but the projection [2]");
}

TEST_CASE("Nested blocks: gradients match finite differences", "[blocks][fd]") {
  SECTION("Dense, ReLU, (Dense, GELU), Residual(LayerNorm, ...), ProjectedResidual") {
    auto net = make_net<double>();
    auto const report = telar::check_gradients(net, telar::Shape{3, 4}, 2);
    INFO(report.str());
    CHECK(report.tensors.size() == 15);
    CHECK(report.passed(1e-6));
  }
  SECTION("blocks first, a fused shortcut, a block in a block") {
    auto net = make_block_first<double>();
    auto const report = telar::check_gradients(net, telar::Shape{2, 6}, 3);
    INFO(report.str());
    CHECK(report.tensors.size() == 13);
    CHECK(report.passed(1e-6));
  }
}

TEST_CASE("Nested blocks: backward_weight alone computes the inner gradients", "[blocks]") {
  auto check = [](auto a, auto b, telar::Shape in, std::size_t n) {
    a.build(in);
    b.build(in);
    a.initialize(4);
    b.initialize(4);
    std::size_t const out = a.output_shape(in).size();
    auto x = random_matrix<double>(n, in.size(), 1), dy = random_matrix<double>(n, out, 2);
    typename decltype(a)::saved_type sa, sb;
    Pass const full = run(a, sa, x, dy, true);
    Pass const alone = run(b, sb, x, dy, false); // a fresh saved: backward_weight first
    CHECK(max_abs_diff(full.grads, alone.grads) == 0.0);
    // And again on the same saved states, swapped roles.
    Pass const alone2 = run(a, sa, x, dy, false);
    Pass const full2 = run(b, sb, x, dy, true);
    CHECK(max_abs_diff(full.grads, alone2.grads) == 0.0);
    CHECK(max_abs_diff(full.grads, full2.grads) == 0.0);
    CHECK(max_abs_diff(full.dx, full2.dx) == 0.0);
  };
  SECTION("blocks inside the chain") {
    check(make_net<double>(), make_net<double>(), {3, 4}, 4);
  }
  SECTION("blocks first, fused shortcut") {
    check(make_block_first<double>(), make_block_first<double>(), {6}, 5);
  }
}

TEST_CASE("Nested blocks: a saved state is reused across steps", "[blocks]") {
  auto net = make_block_first<double>();
  net.build(telar::Shape{2, 6});
  net.initialize(8);
  BlockFirst<double>::saved_type saved;
  auto x = random_matrix<double>(3, 12, 5), dy = random_matrix<double>(3, 6, 6);
  auto x2 = random_matrix<double>(5, 12, 7), dy2 = random_matrix<double>(5, 6, 8);
  Pass const first = run(net, saved, x, dy);
  Pass const same = run(net, saved, x, dy);
  CHECK(max_abs_diff(first.y, same.y) == 0.0);
  CHECK(max_abs_diff(first.dx, same.dx) == 0.0);
  CHECK(max_abs_diff(first.grads, same.grads) == 0.0);
  // Another batch size in between (buffers resized), then the first again.
  Pass const other = run(net, saved, x2, dy2);
  CHECK(other.y.size() == 5 * 6);
  Pass const again = run(net, saved, x, dy);
  CHECK(max_abs_diff(first.y, again.y) == 0.0);
  CHECK(max_abs_diff(first.dx, again.dx) == 0.0);
  CHECK(max_abs_diff(first.grads, again.grads) == 0.0);
  // Gradients accumulate over backward_weight calls, as every layer's do.
  net.forward(Exec{}, x, telar::Matrix<double>("y", 3, 6), saved);
  net.backward_weight(Exec{}, dy, saved);
  auto const twice = grads(net);
  double worst = 0;
  for (std::size_t i = 0; i < twice.size(); ++i)
    worst = std::max(worst, std::abs(twice[i] - 2 * first.grads[i]));
  CHECK(worst < 1e-12);
}

// The layer of docs/writing_a_layer.md, verbatim: it compiles, and its
// gradients pass the checker the guide shows.
namespace doc_example {

// y[c, h, w] = x[c, h, w] * scale[c] over samples [C, H, W].
template <class T, class MemorySpace = telar::DefaultMemorySpace>
struct ChannelScale {
  using value_type = T;
  using memory_space = MemorySpace;
  struct saved_type {
    telar::ConstMatrix<T, MemorySpace> x;
  }; // per micro-batch

  explicit ChannelScale(std::size_t channels = 0) : c(channels) {}
  static constexpr char const* name() { return "ChannelScale"; }

  telar::Shape output_shape(telar::Shape const& in) const { // checked before allocation
    if (in.rank != 3 || in[0] != c)
      throw telar::ShapeError("ChannelScale expects [" + std::to_string(c) + ", H, W]");
    return in;
  }
  void build(telar::Shape const& in) { shape = in; } // remember H and W

  void initialize(std::uint64_t) { // only on owning ranks
    scale = telar::Vector<T, MemorySpace>("scale", c);
    scale_grad = telar::Vector<T, MemorySpace>("scale_grad", c);
    Kokkos::deep_copy(scale, T(1));
  }
  template <class F>
  void parameters(F&& f) {
    f("scale", scale, scale_grad);
  }

  template <class Exec>
  void forward(Exec const& exec, telar::ConstMatrix<T, MemorySpace> x,
               telar::Matrix<T, MemorySpace> y, saved_type& saved) const {
    saved.x = x;                             // a view: no copy
    auto xi = telar::as_tensor<3>(x, shape); // xi(n, c, h, w)
    auto yi = telar::as_tensor<3>(y, shape);
    auto s = scale; // capture views, never `this`
    Kokkos::parallel_for(
        "ChannelScale::forward",
        Kokkos::MDRangePolicy<Exec, Kokkos::Rank<4>>(
            exec, {0, 0, 0, 0}, {xi.extent(0), xi.extent(1), xi.extent(2), xi.extent(3)}),
        KOKKOS_LAMBDA(int n, int ch, int h, int w) { yi(n, ch, h, w) = xi(n, ch, h, w) * s(ch); });
  }
  template <class Exec> // dL/dx: on the pipeline's critical path
  void backward_input(Exec const& exec, telar::ConstMatrix<T, MemorySpace> dy,
                      telar::Matrix<T, MemorySpace> dx, saved_type const&) const {
    auto dyi = telar::as_tensor<3>(dy, shape);
    auto dxi = telar::as_tensor<3>(dx, shape);
    auto s = scale;
    Kokkos::parallel_for(
        "ChannelScale::backward_input",
        Kokkos::MDRangePolicy<Exec, Kokkos::Rank<4>>(
            exec, {0, 0, 0, 0}, {dyi.extent(0), dyi.extent(1), dyi.extent(2), dyi.extent(3)}),
        KOKKOS_LAMBDA(int n, int ch, int h, int w) {
          dxi(n, ch, h, w) = dyi(n, ch, h, w) * s(ch);
        });
  }
  template <class Exec> // dL/dW: accumulate (+=), several micro-batches add up
  void backward_weight(Exec const& exec, telar::ConstMatrix<T, MemorySpace> dy,
                       saved_type const& saved) const {
    auto dyi = telar::as_tensor<3>(dy, shape);
    auto xi = telar::as_tensor<3>(saved.x, shape);
    auto g = scale_grad;
    Kokkos::parallel_for(
        "ChannelScale::backward_weight", Kokkos::RangePolicy<Exec>(exec, 0, c),
        KOKKOS_LAMBDA(int ch) {
          T acc = 0;
          for (std::size_t n = 0; n < dyi.extent(0); ++n)
            for (std::size_t h = 0; h < dyi.extent(2); ++h)
              for (std::size_t w = 0; w < dyi.extent(3); ++w)
                acc += dyi(n, ch, h, w) * xi(n, ch, h, w);
          g(ch) += acc;
        });
  }

  std::size_t c;
  telar::Shape shape;
  telar::Vector<T, MemorySpace> scale, scale_grad;
};
} // namespace doc_example

TEST_CASE("The guide's ChannelScale layer trains through check_gradients", "[blocks][doc]") {
  doc_example::ChannelScale<double> layer(3);
  auto report = telar::check_gradients(layer, telar::Shape{3, 5, 4}, 2);
  INFO(report.str());
  CHECK(report.passed(1e-6));
  CHECK_THROWS_AS(layer.output_shape(telar::Shape{2, 5, 4}), telar::ShapeError);
}
