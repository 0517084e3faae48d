// Nested blocks: Sequential in Sequential, Residual and ProjectedResidual,
// and the joins of branches (Concat, DenseConcat, Add, Mul). Shapes and their
// error messages, parameter names, gradients by finite differences (double),
// backward_weight without backward_input, saved state reused across steps,
// and saved_bytes() against the bytes the meter sees allocated; a two-level
// U-Net with BatchNorm by finite differences; the branching guide's blocks.
#include "support.hpp"
#include "unet.hpp"

#include <telar/core/branches.hpp>
#include <telar/core/residual.hpp>
#include <telar/core/sequential.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/batch_norm.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/conv_transpose.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/normalization.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/profile/memory.hpp>
#include <telar/testing/check_gradients.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using telar::test::Exec;
using telar::test::random_matrix;
using telar::test::to_host;

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

// backward_weight on its own gives the gradients of backward_input then
// backward_weight, on fresh and on reused saved states.
template <class M>
void check_weight_alone(M a, M b, telar::Shape in, std::size_t n) {
  a.build(in);
  b.build(in);
  a.initialize(4);
  b.initialize(4);
  std::size_t const out = a.output_shape(in).size();
  auto x = random_matrix<double>(n, in.size(), 1), dy = random_matrix<double>(n, out, 2);
  typename M::saved_type sa, sb;
  Pass const full = run(a, sa, x, dy, true);
  Pass const alone = run(b, sb, x, dy, false); // a fresh saved: backward_weight first
  CHECK(max_abs_diff(full.grads, alone.grads) == 0.0);
  // And again on the same saved states, swapped roles.
  Pass const alone2 = run(a, sa, x, dy, false);
  Pass const full2 = run(b, sb, x, dy, true);
  CHECK(max_abs_diff(full.grads, alone2.grads) == 0.0);
  CHECK(max_abs_diff(full.grads, full2.grads) == 0.0);
  CHECK(max_abs_diff(full.dx, full2.dx) == 0.0);
}

TEST_CASE("Nested blocks: backward_weight alone computes the inner gradients", "[blocks]") {
  SECTION("blocks inside the chain") {
    check_weight_alone(make_net<double>(), make_net<double>(), {3, 4}, 4);
  }
  SECTION("blocks first, fused shortcut") {
    check_weight_alone(make_block_first<double>(), make_block_first<double>(), {6}, 5);
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

// Joins of branches over samples [C, H, W] = [2, 3, 4] (Dense acts on W).
namespace joins {

template <class T>
using Gap = telar::GlobalAvgPool<T>;
template <class T>
using Id = telar::Identity<T>;
// Inception-like: three branches, channels concatenated: [2, 3, 4] -> [6, 3, 4].
template <class T>
using Inception = telar::Concat<D<T>, telar::Sequential<D<T>, telar::GELU<T>>, Id<T>>;
// Squeeze-excitation: x times a weight per channel.
template <class T>
using Excite = telar::Sequential<Gap<T>, D<T>, telar::ReLU<T>, D<T>, telar::Sigmoid<T>>;
template <class T>
using SE = telar::Mul<Id<T>, Excite<T>>;
// A full branch plus a per-channel one.
template <class T>
using ChannelBias = telar::Add<D<T>, telar::Sequential<Gap<T>, D<T>>>;
// Three factors: full, full and fused, per channel.
template <class T>
using Product = telar::Mul<D<T>, Twice<T>, telar::Sequential<Gap<T>, D<T>, telar::Tanh<T>>>;
// Channel means kept as [C, 1, 1] (torch.mean(x, (2, 3), keepdim=True)):
// the same values as GlobalAvgPool's [C].
template <class T>
struct KeepDimsMean : Gap<T> {
  telar::Shape output_shape(telar::Shape const& in) const {
    return telar::Shape{Gap<T>::output_shape(in)[0], 1, 1};
  }
};
// x plus a function of its channel means, broadcast from [C, 1, 1].
template <class T>
using Centre = telar::Add<Id<T>, telar::Sequential<KeepDimsMean<T>, telar::Tanh<T>>>;
// A Concat inside a DenseConcat inside a Sequential, then an SE block:
// [2, 3, 4] -> [6, 3, 4] -> [6, 3, 4] -> [6, 3, 2].
template <class T>
using Dense2 = telar::DenseConcat<telar::Concat<D<T>, D<T>>, telar::GELU<T>>;
template <class T>
using Branchy = telar::Sequential<Dense2<T>, SE<T>, D<T>>;

template <class T>
Inception<T> make_inception() {
  return Inception<T>(D<T>(4, 4), telar::Sequential<D<T>, telar::GELU<T>>(D<T>(4, 4), {}), {});
}
template <class T>
SE<T> make_se(std::size_t channels) {
  return SE<T>({}, Excite<T>({}, D<T>(channels, 3), {}, D<T>(3, channels), {}));
}
template <class T>
ChannelBias<T> make_bias() {
  return ChannelBias<T>(D<T>(4, 4), telar::Sequential<Gap<T>, D<T>>({}, D<T>(2, 2)));
}
template <class T>
Product<T> make_product() {
  return Product<T>(D<T>(4, 4), {},
                    telar::Sequential<Gap<T>, D<T>, telar::Tanh<T>>({}, D<T>(2, 2), {}));
}
template <class T>
Branchy<T> make_branchy() {
  return Branchy<T>(Dense2<T>(telar::Concat<D<T>, D<T>>(D<T>(4, 4), D<T>(4, 4)), {}), make_se<T>(6),
                    D<T>(4, 2));
}

telar::Shape const image{2, 3, 4};

// Bytes the saved state allocates in one forward and backward, as the
// memory meter counts them.
template <class M>
std::size_t measured_saved_bytes(M m, std::size_t n, telar::Shape const& in = image) {
  telar::MemoryMeterInstall install;
  m.build(in);
  m.initialize(3);
  std::size_t const out = m.output_shape(in).size();
  auto x = random_matrix<double>(n, in.size(), 1), dy = random_matrix<double>(n, out, 2);
  telar::Matrix<double> y("y", n, out), dx("dx", n, in.size());
  telar::MemoryMeter::Scope scope(telar::MemoryCategory::activations);
  auto& meter = telar::MemoryMeter::instance();
  std::size_t const before = meter.current().total();
  typename M::saved_type saved;
  m.forward(Exec{}, x, y, saved);
  m.backward_input(Exec{}, dy, dx, saved);
  m.backward_weight(Exec{}, dy, saved);
  Kokkos::fence();
  std::size_t const used = meter.current().total() - before;
  CHECK(used == m.saved_bytes(n, in));
  return used;
}

} // namespace joins

TEST_CASE("Joins of branches: shapes and parameter names", "[blocks][joins]") {
  using namespace joins;
  CHECK(make_inception<float>().output_shape(image) == telar::Shape{6, 3, 4});
  CHECK(make_se<float>(2).output_shape(image) == image);
  CHECK(make_bias<float>().output_shape(image) == image);
  CHECK(Centre<float>().output_shape(image) == image); // [2, 1, 1] against [2, 3, 4]
  auto net = make_branchy<float>();
  CHECK(net.shapes(image) == std::vector<telar::Shape>{image, telar::Shape{6, 3, 4},
                                                       telar::Shape{6, 3, 4},
                                                       telar::Shape{6, 3, 2}});
  CHECK(net.layer_names() == std::vector<std::string>{"DenseConcat", "Mul", "Dense"});
  net.build(image);
  net.initialize(1);
  // DenseConcat: its body's names; Concat and Mul: the branch index first.
  CHECK(names(net) == std::vector<std::string>{"0.0.0.weight", "0.0.0.bias", "0.0.1.weight",
                                               "0.0.1.bias", "1.1.1.weight", "1.1.1.bias",
                                               "1.1.3.weight", "1.1.3.bias", "2.weight", "2.bias"});
  CHECK(net.parameter_count() == 2 * (16 + 4) + (6 * 3 + 3) + (3 * 6 + 6) + (4 * 2 + 2));
  // Branch i draws from stream i: equal branches get different values.
  auto c = telar::Concat<D<float>, D<float>>(D<float>(4, 4), D<float>(4, 4));
  c.build(image);
  c.initialize(1);
  CHECK(values(c.branch<0>().weight) != values(c.branch<1>().weight));
}

TEST_CASE("Joins of branches: shape errors name the block, the branch and both shapes",
          "[blocks][joins]") {
  using namespace joins;
  using C2 = telar::Concat<D<float>, D<float>>;
  CHECK(message_of([] { C2(D<float>(4, 4), D<float>(4, 5)).output_shape(image); }) ==
        "telar::Concat: branch 1 (Dense) gives [2, 3, 5] but branch 0 (Dense) gives [2, 3, 4]; "
        "to concatenate along channels all dimensions but the first must agree");
  using A2 = telar::Add<D<float>, D<float>>;
  CHECK(message_of([] { A2(D<float>(4, 4), D<float>(4, 3)).output_shape(image); }) ==
        "telar::Add: branch 1 (Dense) gives [2, 3, 3] but branch 0 (Dense) gives [2, 3, 4]; a "
        "branch must give the same shape or one value per channel ([2] or [2, 1, ...])");
  CHECK(message_of([] { A2(D<float>(4, 4), D<float>(5, 4)).output_shape(image); }) ==
        "telar::Add: branch 1 (Dense) cannot take input [2, 3, 4]: Dense expects inputs [..., 5]");
  CHECK(message_of([] { make_se<float>(3).output_shape(image); }) ==
        "telar::Mul: branch 1 (Sequential) cannot take input [2, 3, 4]: telar::Sequential: layer "
        "1 (Dense) cannot take input [2] from layer 0 (GlobalAvgPool): Dense expects inputs "
        "[..., 3]");
  using M2 = telar::Mul<Id<float>, telar::Sequential<Gap<float>, D<float>>>;
  CHECK(message_of([] {
          M2({}, telar::Sequential<Gap<float>, D<float>>({}, D<float>(2, 3))).output_shape(image);
        }) == "telar::Mul: branch 1 (Sequential) gives [3] but branch 0 (Identity) gives [2, 3, "
              "4]; a branch must give the same shape or one value per channel ([2] or [2, 1, "
              "...])");
  // Inside a chain, the chain names the block's position too.
  telar::Sequential<telar::ReLU<float>, telar::DenseConcat<D<float>>> chain(
      {}, telar::DenseConcat<D<float>>(D<float>(4, 5)));
  CHECK(message_of([&] { chain.shapes(image); }) ==
        "telar::Sequential: layer 1 (DenseConcat) cannot take input [2, 3, 4] from layer 0 "
        "(ReLU): telar::DenseConcat: the body gives [2, 3, 5] but the input gives [2, 3, 4]; to "
        "concatenate along channels all dimensions but the first must agree");
  // A block run before build() says so.
  auto unbuilt = make_inception<double>();
  typename Inception<double>::saved_type saved;
  CHECK_THROWS_WITH(unbuilt.forward(Exec{}, random_matrix<double>(2, 24, 1),
                                    telar::Matrix<double>("y", 2, 72), saved),
                    ContainsSubstring("telar::Concat: run before build"));
}

TEST_CASE("Joins of branches: gradients match finite differences", "[blocks][joins][fd]") {
  using namespace joins;
  auto check = [](auto block, std::size_t tensors) {
    auto const report = telar::check_gradients(block, image, 3);
    INFO(report.str());
    CHECK(report.tensors.size() == tensors);
    CHECK(report.passed(1e-6));
  };
  SECTION("Concat: a layer, a chain and the input") {
    check(make_inception<double>(), 5);
  }
  SECTION("Mul: squeeze-excitation") {
    check(make_se<double>(2), 5);
  }
  SECTION("Add: a per-channel branch") {
    check(make_bias<double>(), 5);
  }
  SECTION("Mul: three factors, one fused, one per channel") {
    check(make_product<double>(), 5);
  }
  SECTION("Add: a [C, 1, 1] branch") {
    check(Centre<double>(), 1);
  }
  SECTION("A Concat in a DenseConcat in a Sequential, then SE") {
    check(make_branchy<double>(), 11);
  }
}

TEST_CASE("Joins of branches: backward_weight alone computes the inner gradients",
          "[blocks][joins]") {
  using namespace joins;
  check_weight_alone(make_inception<double>(), make_inception<double>(), image, 3);
  check_weight_alone(make_product<double>(), make_product<double>(), image, 2);
  check_weight_alone(make_branchy<double>(), make_branchy<double>(), image, 4);
}

TEST_CASE("Blocks: saved_bytes() is what the saved state allocates", "[blocks][joins][memory]") {
  using namespace joins;
  CHECK(measured_saved_bytes(make_inception<double>(), 3) > 0);
  CHECK(measured_saved_bytes(make_se<double>(2), 3) > 0);
  CHECK(measured_saved_bytes(make_bias<double>(), 2) > 0);
  CHECK(measured_saved_bytes(make_product<double>(), 2) > 0);
  CHECK(measured_saved_bytes(make_branchy<double>(), 4) > 0);
  // The residual blocks of make_net (no new instantiations).
  auto const net = make_net<double>();
  CHECK(measured_saved_bytes(net.layer<3>(), 3, telar::Shape{2, 6}) > 0);
  CHECK(measured_saved_bytes(net.layer<4>(), 3, telar::Shape{2, 6}) > 0);
}

// A two-level U-Net (tests/unet.hpp: DenseConcat skips around MaxPool2D,
// conv-BN-ReLU and a stride-2 ConvTranspose2D; a 1x1 head flattened into a
// classifier), BatchNorm in training mode: every input and parameter gradient
// against central differences.
TEST_CASE("A two-level U-Net with BatchNorm: gradients match finite differences",
          "[blocks][joins][unet][fd]") {
  auto net = telar::test::unet::make_net<double, telar::SyncStats>(2, 8, 2, 3);
  auto const report = telar::check_gradients(net, telar::Shape{2, 8, 8}, 2);
  INFO(report.str());
  CHECK(report.tensors.size() == 1 + names(net).size());
  CHECK(report.passed(1e-6));
}

// The blocks of docs/writing_networks_that_branch.md, as written there:
// their shapes and parameter names.
namespace branch_guide {
template <class T>
using Conv = telar::Conv2D<T>;
template <class T>
using BN = telar::BatchNorm<T>; // LocalStats; telar::SyncStats normalises over the dp group
template <class T>
using ConvBN = telar::Sequential<Conv<T>, BN<T>>;
template <class T>
using Basic = telar::ProjectedResidual<ConvBN<T>,                                       // shortcut
                                       Conv<T>, BN<T>, telar::ReLU<T>, Conv<T>, BN<T>>; // body
template <class T>
using Relu = telar::ReLU<T>;
template <class T>
using Inception = telar::Concat<telar::Sequential<Conv<T>, Relu<T>>,                   // 1x1
                                telar::Sequential<Conv<T>, Relu<T>, Conv<T>, Relu<T>>, // 1x1 -> 3x3
                                telar::Sequential<Conv<T>, Relu<T>, Conv<T>, Relu<T>>, // 1x1 -> 5x5
                                telar::Sequential<telar::MaxPool2D<T>, Conv<T>, Relu<T>>>; // pool
template <class T>
using DenseLayer = telar::DenseConcat<BN<T>, Relu<T>, Conv<T>, BN<T>, Relu<T>, Conv<T>>;
template <class T>
using Pool = telar::MaxPool2D<T>;
template <class T>
using Up = telar::ConvTranspose2D<T>; // kernel 2, stride 2: doubles H and W
template <class T>
using Level2 = telar::DenseConcat<Pool<T>, Conv<T>, BN<T>, Relu<T>, Up<T>>;
template <class T>
using Level1 = telar::DenseConcat<Pool<T>, Conv<T>, BN<T>, Relu<T>, // down
                                  Level2<T>,                        // inner level
                                  Conv<T>, BN<T>, Relu<T>, Up<T>>;  // reduce, up
template <class T>
using UNet = telar::Sequential<Conv<T>, BN<T>, Relu<T>, // stem: [3, H, W] -> [8, H, W]
                               Level1<T>,               // [16, H, W]
                               Conv<T>, BN<T>, Relu<T>, // reduce: [8, H, W]
                               Conv<T>>;                // per-pixel head: [2, H, W]
template <class T>
using Excite = telar::Sequential<telar::GlobalAvgPool<T>, telar::Dense<T>, Relu<T>, telar::Dense<T>,
                                 telar::Sigmoid<T>>;
template <class T>
using SE = telar::Mul<telar::Identity<T>, Excite<T>>;
} // namespace branch_guide

TEST_CASE("The branching guide's blocks have the shapes and names it shows", "[blocks][doc]") {
  using namespace branch_guide;
  Basic<float> block(ConvBN<float>(Conv<float>(64, 128, 1, 2, 0, false), BN<float>(128)),
                     Conv<float>(64, 128, 3, 2, 1, false), BN<float>(128), {},
                     Conv<float>(128, 128, 3, 1, 1, false), BN<float>(128));
  block.build(telar::Shape{64, 8, 8});
  CHECK(block.output_shape(telar::Shape{64, 8, 8}) == telar::Shape{128, 4, 4});
  CHECK(names(block) == std::vector<std::string>{"0.weight", "1.weight", "1.bias", "3.weight",
                                                 "4.weight", "4.bias", "shortcut.0.weight",
                                                 "shortcut.1.weight", "shortcut.1.bias"});
  std::vector<std::string> buffers;
  block.buffers([&](char const* n, auto&) { buffers.emplace_back(n); });
  CHECK(buffers == std::vector<std::string>{"1.running_mean", "1.running_var", "4.running_mean",
                                            "4.running_var", "shortcut.1.running_mean",
                                            "shortcut.1.running_var"});

  using S = telar::Sequential<Conv<float>, Relu<float>>;
  using S2 = telar::Sequential<Conv<float>, Relu<float>, Conv<float>, Relu<float>>;
  using P = telar::Sequential<telar::MaxPool2D<float>, Conv<float>, Relu<float>>;
  Inception<float> inception(S(Conv<float>(192, 64, 1), {}),
                             S2(Conv<float>(192, 96, 1), {}, Conv<float>(96, 128, 3, 1, 1), {}),
                             S2(Conv<float>(192, 16, 1), {}, Conv<float>(16, 32, 5, 1, 2), {}),
                             P(telar::MaxPool2D<float>(3, 1, 1), Conv<float>(192, 32, 1), {}));
  CHECK(inception.output_shape(telar::Shape{192, 28, 28}) == telar::Shape{256, 28, 28});
  inception.build(telar::Shape{192, 28, 28});
  CHECK(names(inception)[2] == "1.0.weight");
  CHECK(names(inception)[4] == "1.2.weight");

  DenseLayer<float> layer(BN<float>(64), {}, Conv<float>(64, 128, 1, 1, 0, false), BN<float>(128),
                          {}, Conv<float>(128, 32, 3, 1, 1, false));
  CHECK(layer.output_shape(telar::Shape{64, 8, 8}) == telar::Shape{96, 8, 8});
  layer.build(telar::Shape{64, 8, 8});
  CHECK(names(layer) == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "3.weight",
                                                 "3.bias", "5.weight"});

  Level2<float> level2(Pool<float>(2), Conv<float>(16, 16, 3, 1, 1), BN<float>(16), {},
                       Up<float>(16, 16, 2, 2));
  Level1<float> level1(Pool<float>(2), Conv<float>(8, 16, 3, 1, 1), BN<float>(16), {},
                       std::move(level2), Conv<float>(32, 16, 3, 1, 1), BN<float>(16), {},
                       Up<float>(16, 8, 2, 2));
  UNet<float> unet(Conv<float>(3, 8, 3, 1, 1), BN<float>(8), {}, std::move(level1),
                   Conv<float>(16, 8, 3, 1, 1), BN<float>(8), {}, Conv<float>(8, 2, 1));
  CHECK(unet.output_shape(telar::Shape{3, 16, 16}) == telar::Shape{2, 16, 16});
  unet.build(telar::Shape{3, 16, 16});
  auto const unet_names = names(unet);
  CHECK(std::count(unet_names.begin(), unet_names.end(), "3.1.weight") == 1);
  CHECK(std::count(unet_names.begin(), unet_names.end(), "3.4.1.weight") == 1);
  CHECK(unet_names.back() == "7.bias");

  SE<float> se(
      {}, Excite<float>({}, telar::Dense<float>(256, 16), {}, telar::Dense<float>(16, 256), {}));
  se.build(telar::Shape{256, 4, 4});
  CHECK(se.output_shape(telar::Shape{256, 4, 4}) == telar::Shape{256, 4, 4});
  CHECK(names(se) == std::vector<std::string>{"1.1.weight", "1.1.bias", "1.3.weight", "1.3.bias"});
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

namespace {
// Two residual blocks in a chain: the first a transformer's MLP sublayer,
// the second with a dead inner tensor and a ReLU that keeps its signs.
using F = double;
using Mlp = telar::Residual<telar::LayerNorm<F>, telar::Dense<F>, telar::GELU<F>, telar::Dense<F>>;
using Signs = telar::Residual<telar::Dense<F>, telar::ReLU<F>, telar::ReLU<F>, telar::Dense<F>>;
using Pair = telar::Sequential<Mlp, Signs>;
Pair make_pair_block() {
  return Pair(Mlp(telar::LayerNorm<F>(8), telar::Dense<F>(8, 32), {}, telar::Dense<F>(32, 8)),
              Signs(telar::Dense<F>(8, 16), {}, {}, telar::Dense<F>(16, 8)));
}
std::vector<double> gradients_of(Pair& m) {
  std::vector<double> all;
  m.parameters([&](char const*, auto&, auto& grad) {
    auto const h = to_host(grad);
    all.insert(all.end(), h.data(), h.data() + h.size());
  });
  return all;
}
} // namespace

// A stage runner hands its blocks a pool (core/detail/shared_pool.hpp): their
// dead inner tensors and the inner gradients of a fused backward live there,
// shared by the micro-batches, and inner layers keep compact copies. Two
// micro-batches run forward, then backward last first (so the second's
// forward overwrote everything the pool held for the first): outputs, input
// gradients and parameter gradients equal the block's alone, bit for bit.
TEST_CASE("Blocks in a stage's shared pool compute what they compute alone", "[blocks][pool]") {
  telar::Shape const in{8};
  std::size_t const n = 5;
  Pair alone = make_pair_block(), pooled = make_pair_block();
  for (Pair* m : {&alone, &pooled}) {
    m->build(in);
    m->initialize(3);
  }
  auto pool = std::make_shared<telar::detail::SharedPool<F, telar::DefaultMemorySpace>>();
  pooled.set_shared_pool(pool, 0);
  telar::Matrix<F> x[2] = {random_matrix<F>(n, 8, 1), random_matrix<F>(n, 8, 2)};
  telar::Matrix<F> dy[2] = {random_matrix<F>(n, 8, 3), random_matrix<F>(n, 8, 4)};
  auto run = [&](Pair& m, bool fused) {
    Pair::saved_type saved[2];
    std::vector<std::vector<double>> out;
    using M = telar::Matrix<F>;
    M y[2] = {M("y0", n, 8), M("y1", n, 8)}, dx[2] = {M("dx0", n, 8), M("dx1", n, 8)};
    for (int b = 0; b < 2; ++b)
      m.forward(Exec{}, x[b], y[b], saved[b]);
    for (int b = 1; b >= 0; --b)
      if (fused) {
        m.backward(Exec{}, dy[b], dx[b], saved[b]);
      } else {
        m.backward_input(Exec{}, dy[b], dx[b], saved[b]);
        m.backward_weight(Exec{}, dy[b], saved[b]);
      }
    for (int b = 0; b < 2; ++b) {
      auto const hy = to_host(y[b]), hdx = to_host(dx[b]);
      out.emplace_back(hy.data(), hy.data() + hy.size());
      out.emplace_back(hdx.data(), hdx.data() + hdx.size());
    }
    out.push_back(gradients_of(m));
    return out;
  };
  auto const want = run(alone, false);
  CHECK(run(pooled, true) == want);
  // What the pool kept away from the micro-batches: the blocks' inner
  // gradients and the Signs body's dead tensors (its first ReLU's input and
  // output, the latter as signs).
  CHECK(pooled.pooled_saved_bytes(n, in, false) < alone.saved_bytes(n, in));
  CHECK(pooled.pooled_saved_bytes(n, in, true) < alone.saved_bytes(n, in));
}
