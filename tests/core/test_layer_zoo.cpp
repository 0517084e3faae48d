// Element-wise, softmax, pooling, resampling and rearranging layers, Bias,
// Multiplier (and the graph's batched MatMul, Sub, Div and broadcast Add
// joins): values against PyTorch 1.13 (numbers printed by reference/layer_zoo_reference.py),
// gradients against finite differences in double, and shape errors.
#include "support.hpp"

#include <telar/core/dynamic_graph.hpp>
#include <telar/core/sequential.hpp>

#include <telar/layers/activation.hpp>
#include <telar/layers/bias.hpp>
#include <telar/layers/masked_fill.hpp>
#include <telar/layers/multiplier.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/layers/rearrange.hpp>
#include <telar/layers/softmax.hpp>
#include <telar/layers/upsample.hpp>
#include <telar/testing/check_gradients.hpp>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <string>
#include <variant>
#include <vector>

using Catch::Approx;
using telar::test::Exec;
using telar::test::to_host;
using Mat = telar::Matrix<double>;

namespace {

using Values = std::vector<double>;

Mat from_values(Values const& v, std::size_t rows = 1) {
  Mat m("x", rows, v.size() / rows);
  auto h = Kokkos::create_mirror_view(m);
  for (std::size_t i = 0; i < v.size(); ++i)
    h.data()[i] = v[i];
  Kokkos::deep_copy(m, h);
  return m;
}

Values values(Mat const& m) {
  auto h = to_host(m);
  return Values(h.data(), h.data() + h.size());
}

void check_close(Values const& got, Values const& expect, double eps = 1e-12) {
  REQUIRE(got.size() == expect.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("entry " << i);
    CHECK(got[i] == Approx(expect[i]).epsilon(eps).margin(eps));
  }
}

// Forward of \p layer on one sample \p x of shape \p in; returns y, and in
// dx the input gradient for the output gradient \p dy (all ones if empty).
template <class Layer>
Values run(Layer& layer, telar::Shape const& in, Values const& x, Values* dx = nullptr,
           Values dy = {}) {
  telar::Shape const out = layer.output_shape(in);
  if constexpr (telar::layer_traits<Layer>::has_build)
    layer.build(in);
  Mat X = from_values(x), Y("y", 1, out.size()), DX("dx", 1, in.size());
  typename telar::layer_traits<Layer>::saved_type saved;
  layer.forward(Exec{}, X, Y, saved);
  if (dx) {
    if (dy.empty())
      dy.assign(out.size(), 1.0);
    layer.backward_input(Exec{}, from_values(dy), DX, saved);
    *dx = values(DX);
  }
  return values(Y);
}

// Values and slopes at the points of layer_zoo_reference.py's activations().
template <class Layer>
void check_activation(Layer layer, Values const& y, Values const& slope, double eps = 1e-12) {
  Values const x{-4.0, -3.0, -1.5, -1.0, 0.0, 0.5, 2.0, 3.0, 6.0, 7.0};
  Values dx;
  INFO(layer.name());
  check_close(run(layer, telar::Shape(x.size()), x, &dx), y);
  check_close(dx, slope, eps);
  telar::GradientCheckOptions o;
  o.input_scale = 5; // across the kinks at -3, 0, 3 and 6 (never within h of one)
  auto const report = telar::check_gradients(layer, telar::Shape{3, 8}, 4, o);
  INFO(report.str());
  CHECK(report.passed(1e-6));
}

// One sample x[i] = 3 sin(1.7 i), as layer_zoo_reference.py's sample().
Values sample(telar::Shape const& in) {
  Values x(in.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = 3 * std::sin(1.7 * double(i));
  return x;
}

// Output shape and values against PyTorch, then gradients against FD.
template <class Layer>
void check_resampling(Layer layer, telar::Shape const& in, telar::Shape const& out,
                      Values const& expect) {
  INFO(layer.name() << " on " << in.str());
  CHECK(layer.output_shape(in).str() == out.str());
  check_close(run(layer, in, sample(in)), expect);
  auto const report = telar::check_gradients(layer, in, 2);
  INFO(report.str());
  CHECK(report.passed(1e-6));
}

template <class Layer>
void check_shape_error(Layer& layer, telar::Shape const& in, std::string const& message) {
  try {
    (void)layer.output_shape(in);
    FAIL("no exception");
  } catch (telar::ShapeError const& e) {
    CHECK(std::string(e.what()) == message);
  }
}

} // namespace

TEST_CASE("New activations match PyTorch 1.13 at their kinks and finite differences",
          "[layers][activation][fd]") {
  check_activation(telar::ReLU6<double>{}, {0, 0, 0, 0, 0, 0.5, 2, 3, 6, 6},
                   {0, 0, 0, 0, 0, 1, 1, 1, 0, 0});
  check_activation(telar::Clip<double>(-1, 2), {-1, -1, -1, -1, 0, 0.5, 2, 2, 2, 2},
                   {0, 0, 0, 1, 1, 1, 1, 0, 0, 0});
  check_activation(telar::LeakyReLU<double>{}, {-0.04, -0.03, -0.015, -0.01, 0, 0.5, 2, 3, 6, 7},
                   {0.01, 0.01, 0.01, 0.01, 0.01, 1, 1, 1, 1, 1});
  check_activation(telar::LeakyReLU<double>(0.2), {-0.8, -0.6, -0.3, -0.2, 0, 0.5, 2, 3, 6, 7},
                   {0.2, 0.2, 0.2, 0.2, 0.2, 1, 1, 1, 1, 1});
  check_activation(telar::ELU<double>{},
                   {-0.9816843611112658, -0.950212931632136, -0.7768698398515702,
                    -0.6321205588285577, 0, 0.5, 2, 3, 6, 7},
                   {0.01831563888873418, 0.049787068367863944, 0.22313016014842982,
                    0.36787944117144233, 1, 1, 1, 1, 1, 1});
  check_activation(telar::ELU<double>(0.5),
                   {-0.4908421805556329, -0.475106465816068, -0.3884349199257851,
                    -0.31606027941427883, 0, 0.5, 2, 3, 6, 7},
                   {0.00915781944436709, 0.024893534183931972, 0.11156508007421491,
                    0.18393972058572117, 0.5, 1, 1, 1, 1, 1});
  check_activation(telar::Swish<double>{},
                   {-0.07194483984836623, -0.14227761953270035, -0.2736382857095345,
                    -0.2689414213699951, 0, 0.3112296656009273, 1.7615941559557646,
                    2.8577223804672998, 5.985164261060192, 6.993622641639196},
                   {-0.05266461489107291, -0.08810410601516962, -0.041294154299142946,
                    0.07232948812851325, 0.5, 0.7399611873026519, 1.0907842487848955,
                    1.0881041060151693, 1.0123264325915249, 1.0054604970664518});
  check_activation(
      telar::HardSwish<double>{},
      {0, 0, -0.375, -1.0 / 3, 0, 0.2916666666666667, 1.6666666666666667, 3, 6, 7},
      {0, -0.5, 0, 0.16666666666666669, 0.5, 0.6666666666666666, 1.1666666666666665, 1, 1, 1});
  // PyTorch's backward multiplies by 1/6 in float (0.1666666716337204).
  check_activation(telar::HardSigmoid<double>{},
                   {0, 0, 0.25, 1.0 / 3, 0.5, 0.5833333333333334, 0.8333333333333334, 1, 1, 1},
                   {0, 0, 1.0 / 6, 1.0 / 6, 1.0 / 6, 1.0 / 6, 1.0 / 6, 0, 0, 0}, 1e-7);
  check_activation(telar::HardSigmoid<double>(0.2, 0.5), {0, 0, 0.2, 0.3, 0.5, 0.6, 0.9, 1, 1, 1},
                   {0, 0, 0.2, 0.2, 0.2, 0.2, 0.2, 0, 0, 0});
}

TEST_CASE("MathFunction: exp, sqrt, erf and pow against the library and finite differences",
          "[layers][activation][fd]") {
  using F = telar::MathFunction<double>;
  using K = telar::MathFn;
  auto check = [](F f, Values const& x, auto value, auto slope) {
    INFO(f.function_name() << " p = " << f.exponent());
    Values y, s, dx;
    for (double const v : x)
      y.push_back(value(v)), s.push_back(slope(v));
    check_close(run(f, telar::Shape(x.size()), x, &dx), y);
    check_close(dx, s);
  };
  Values const x{-2.0, -0.5, 0.0, 0.25, 1.0, 3.0}, positive{0.25, 1.0, 4.0, 9.0};
  double const two_over_sqrt_pi = 2 / std::sqrt(std::acos(-1.0));
  check(
      F(K::exp), x, [](double v) { return std::exp(v); }, [](double v) { return std::exp(v); });
  check(
      F(K::erf), x, [](double v) { return std::erf(v); },
      [&](double v) { return two_over_sqrt_pi * std::exp(-v * v); });
  check(
      F(K::sqrt), positive, [](double v) { return std::sqrt(v); },
      [](double v) { return 0.5 / std::sqrt(v); });
  check(
      F(K::pow, 3), x, [](double v) { return v * v * v; }, [](double v) { return 3 * v * v; });
  check(
      F(K::pow, 0), x, [](double) { return 1.0; }, [](double) { return 0.0; }); // as PyTorch
  check(
      F(K::pow, -0.5), positive, [](double v) { return 1 / std::sqrt(v); },
      [](double v) { return -0.5 / (v * std::sqrt(v)); });
  F root(K::sqrt);
  CHECK(std::isnan(run(root, telar::Shape(1), {-1.0})[0])); // outside the domain
  CHECK(std::string(F(K::pow, 2).function_name()) == "pow");

  // Gradients: exp, erf and x^3 on [-1, 1]; sqrt and fractional powers after
  // an exp, which keeps their inputs positive.
  for (F f : {F(K::exp), F(K::erf), F(K::pow, 3)}) {
    auto const report = telar::check_gradients(f, telar::Shape{3, 8}, 4);
    INFO(f.function_name() << ": " << report.str());
    CHECK(report.passed(1e-6));
  }
  for (F f : {F(K::sqrt), F(K::pow, 1.5), F(K::pow, -0.5)}) {
    telar::Sequential<F, F> chain(F(K::exp), f);
    auto const report = telar::check_gradients(chain, telar::Shape{3, 8}, 4);
    INFO(f.function_name() << " p = " << f.exponent() << ": " << report.str());
    CHECK(report.passed(1e-6));
  }
}

TEST_CASE("Activations report their settings and refuse an empty Clip", "[layers][activation]") {
  CHECK(telar::LeakyReLU<float>{}.negative_slope() == Approx(0.01f));
  CHECK(telar::ELU<float>(0.5f).alpha() == 0.5f);
  telar::HardSigmoid<double> onnx(0.2, 0.5);
  CHECK(onnx.alpha() == 0.2);
  CHECK(onnx.beta() == 0.5);
  CHECK(telar::Clip<float>(-1, 1).max() == 1.0f);
  CHECK(telar::SiLU<float>{}.saved_bytes(8, telar::Shape{4, 4}) == 0);
  try {
    telar::Clip<float>(1, -1);
    FAIL("no exception");
  } catch (telar::Error const& e) {
    CHECK(std::string(e.what()) == "telar::Clip: min (1.000000) must not exceed max (-1.000000)");
  }
}

TEST_CASE("Softmax over an axis matches a direct computation and finite differences",
          "[layers][softmax][fd]") {
  // [2, 3, 4]: softmax over axis 1 (= -2) of each sample.
  telar::Shape const in{2, 3, 4};
  Values x(in.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(double(i) * 1.7) * 3;
  for (int axis : {1, -2}) {
    telar::Softmax<double> softmax(axis);
    Values const y = run(softmax, in, x);
    for (std::size_t a = 0; a < 2; ++a)
      for (std::size_t c = 0; c < 4; ++c) {
        double sum = 0;
        for (std::size_t b = 0; b < 3; ++b)
          sum += std::exp(x[a * 12 + b * 4 + c]);
        for (std::size_t b = 0; b < 3; ++b)
          CHECK(y[a * 12 + b * 4 + c] == Approx(std::exp(x[a * 12 + b * 4 + c]) / sum));
      }
  }
  struct Case {
    telar::Shape in;
    int axis;
  };
  for (Case const& c : {Case{telar::Shape(5), 0}, Case{{3, 4}, -1}, Case{{2, 3, 4}, 0},
                        Case{{2, 3, 2, 3}, 2}, Case{{2, 3, 2, 3}, -1}}) {
    INFO("input " << c.in.str() << " axis " << c.axis);
    telar::Softmax<double> softmax(c.axis);
    auto const report = telar::check_gradients(softmax, c.in, 3);
    INFO(report.str());
    CHECK(report.passed(1e-6));
  }
}

TEST_CASE("Softmax names the axis and the shape it cannot take", "[layers][softmax]") {
  telar::Softmax<float> softmax(3);
  using telar::Shape;
  check_shape_error(softmax, Shape{2, 3, 4},
                    "Softmax: axis 3 is outside input [2, 3, 4] (expected -3 to 2, the batch "
                    "excluded)");
  check_shape_error(softmax, Shape{2, 0, 4},
                    "Softmax expects a known, non-empty input shape of rank 1 to 4, got [2, 0, 4]");
  telar::Softmax<float> unbuilt;
  telar::Matrix<float> x("x", 2, 4), y("y", 2, 4);
  telar::Softmax<float>::saved_type saved;
  CHECK_THROWS_AS(unbuilt.forward(Exec{}, x, y, saved), telar::Error);
  unbuilt.build(telar::Shape{5});
  try {
    unbuilt.forward(Exec{}, x, y, saved);
    FAIL("no exception");
  } catch (telar::ShapeError const& e) {
    CHECK(std::string(e.what()) ==
          "telar::Softmax::forward: expected [n, 5] -> [n, 5], got [2, 4] -> [2, 4]");
  }
}

TEST_CASE("Pooling with ceil_mode and count_include_pad matches PyTorch 1.13 and FD",
          "[layers][pooling][fd]") {
  using telar::Shape;
  check_resampling(
      telar::MaxPool2D<double>(3, 2, 1, true), Shape{2, 6, 6}, Shape{2, 4, 4},
      {2.9749944313574055, 2.9749944313574055, 2.3954613378704708, 2.3954613378704708,
       2.9993787004280077, 2.5774854445694872, 2.9568008963718992, 2.9568008963718992,
       2.319983668698662,  2.821286888841018,  2.9568008963718992, 2.9568008963718992,
       2.0106875275301244, 1.9488385850586034, 2.8482115820601033, 0.5673438610526745,
       2.2669206772182635, 2.941768475326602,  2.6760350480981114, 1.656502154723641,
       2.99657415508571,   2.99657415508571,   2.6760350480981114, 2.534393052059225,
       2.9844803740752193, 2.444115189775374,  2.9057571297610334, 2.9057571297610334,
       2.1576296908936197, 2.1576296908936197, 2.9057571297610334, 2.9057571297610334});
  // ceil_mode with stride = kernel: the partial last window leaves the tiled path.
  check_resampling(telar::MaxPool2D<double>(2, 2, 0, true), Shape{1, 5, 5}, Shape{1, 3, 3},
                   {2.9749944313574055, 2.5774854445694872, 1.4823400534158244, 2.637819184952173,
                    2.9993787004280077, 2.319983668698662, 1.5872480583600717, 2.9568008963718992,
                    0.12207977204959457});
  // A fourth window would start in the right padding: PyTorch drops it.
  check_resampling(telar::MaxPool2D<double>(2, 2, 1, true), Shape{1, 5, 5}, Shape{1, 3, 3},
                   {0.0, 2.9749944313574055, 1.4823400534158244, 2.3954613378704708,
                    2.9993787004280077, 2.5774854445694872, 1.5872480583600717, 2.637819184952173,
                    2.9568008963718992});
  check_resampling(
      telar::AvgPool2D<double>(3, 2, 1, true), Shape{1, 6, 6}, Shape{1, 4, 4},
      {-0.10878232979270235, 0.1493581006159937, -0.11562338770959199, 0.32474404340464574,
       -0.1272961244591192, 0.10304416415234138, -0.09323328113589884, 0.12548196650106833,
       0.13647197116482387, -0.022902102189387326, 0.048598311280169226, 0.17619568950401665,
       0.659921018764788, -0.3108899682182552, 0.35237647003095435, 0.14183596526316863});
  check_resampling(
      telar::AvgPool2D<double>(3, 2, 1, true, false), Shape{1, 6, 6}, Shape{1, 4, 4},
      {-0.24476024203358027, 0.22403715092399054, -0.173435081564388, 0.9742321302139372,
       -0.19094418668867882, 0.10304416415234138, -0.09323328113589884, 0.25096393300213665,
       0.20470795674723583, -0.022902102189387326, 0.048598311280169226, 0.3523913790080333,
       1.979763056294364, -0.6217799364365104, 0.7047529400619087, 0.5673438610526745});
  check_resampling(telar::AvgPool2D<double>(2, 2, 1, true), Shape{1, 5, 5}, Shape{1, 3, 3},
                   {0.0, 0.552092781319228, -0.32377599839184323, -0.12218278444204989,
                    -0.3504134441265788, 0.13160051011437746, 0.6661057801066441,
                    -0.683026913743017, 0.8034455084063421});
}

TEST_CASE("3-D and global max pooling match PyTorch 1.13 and FD", "[layers][pooling][fd]") {
  using telar::Shape;
  check_resampling(
      telar::MaxPool3D<double>(2, 2, 0, true), Shape{2, 3, 5, 4}, Shape{2, 2, 3, 2},
      {2.9749944313574055, 2.9568008963718992,  2.9993787004280077, 2.8482115820601033,
       2.637819184952173,  2.941768475326602,   2.6760350480981114, 2.2669206772182635,
       2.99657415508571,   -0.5282268598457612, 2.444115189775374,  -0.6867507673356201,
       2.9844803740752193, 2.9798588926115497,  2.556900622524844,  2.9057571297610334,
       2.9983052764799765, 2.1278565018225164,  2.656537542823823,  -0.9219555816867531,
       2.9498135517490436, 1.9809840815446405,  1.9789143763537147, 2.835466311429424});
  check_resampling(
      telar::AvgPool3D<double>(3, 2, 1, true, false), Shape{1, 4, 5, 5}, Shape{1, 3, 3, 3},
      {0.6112575135302307,   -0.14305753016730702, 0.022196393206404375, 0.09790176729385956,
       -0.02695509298401851, 0.021454473074676923, 0.6514922838120982,   -0.2046127841054803,
       0.2545262061499035,   -0.2926821467211303,  0.12984259805032305,  -0.2822564874047225,
       -0.03870979124386818, 0.01955980725283331,  -0.04790037394513328, -0.20660180288971894,
       0.12244235376706374,  -0.33556879975569426, -0.5367023120860472,  0.02035726143154759,
       0.4465610467560246,   -0.09997417628289813, 0.012252095520736658, 0.04572231156634802,
       -0.7527776874094861,  0.13767186882297452,  0.14317130701376157});
  check_resampling(telar::AvgPool3D<double>{}, Shape{1, 4, 4, 4}, Shape{1, 2, 2, 2},
                   {0.8239938788165597, -0.6613019119350521, -0.03336883038348154,
                    0.28242062146850566, -0.006495113028280319, -0.24402001812558538,
                    0.8382152426232988, -0.9398902352162423});
  check_resampling(telar::GlobalMaxPool<double>{}, Shape{3, 4, 5}, Shape(3),
                   {2.9993787004280077, 2.9568008963718992, 2.99657415508571});
  check_resampling(telar::GlobalMaxPool<double>{}, Shape{2, 3, 3, 3}, Shape(2),
                   {2.9993787004280077, 2.99657415508571});
  // Tiled 3-D windows (stride = kernel, no padding): the scatter backward.
  telar::MaxPool3D<double> tiled(2);
  auto const report = telar::check_gradients(tiled, Shape{2, 4, 4, 6}, 2);
  INFO(report.str());
  CHECK(report.passed(1e-6));
}

TEST_CASE("Pooling counts its saved bytes and names the shapes it refuses", "[layers][pooling]") {
  using telar::Shape;
  CHECK(telar::MaxPool3D<float>(2).saved_bytes(4, Shape{3, 4, 4, 4}) == 4 * 3 * 8 * sizeof(int));
  CHECK(telar::GlobalMaxPool<float>{}.saved_bytes(4, Shape{3, 5, 5}) == 4 * 3 * sizeof(int));
  CHECK(telar::AvgPool3D<float>(2).saved_bytes(4, Shape{3, 4, 4, 4}) == 0);
  CHECK(telar::MaxPool3D<float>(2).flops(1, Shape{1, 4, 4, 4}) == 8 * 8);
  // saved_bytes is what forward allocates into the saved state.
  telar::MaxPool3D<float> max3(2);
  max3.build(Shape{3, 4, 4, 4});
  telar::Matrix<float> x("x", 4, 3 * 64), y("y", 4, 3 * 8), g("g", 4, 3);
  telar::MaxPool3D<float>::saved_type saved;
  max3.forward(Exec{}, x, y, saved);
  CHECK(saved.argmax.span() * sizeof(int) == max3.saved_bytes(4, Shape{3, 4, 4, 4}));
  telar::GlobalMaxPool<float> global;
  telar::GlobalMaxPool<float>::saved_type gsaved;
  global.forward(Exec{}, x, g, gsaved);
  CHECK(gsaved.argmax.span() * sizeof(int) == global.saved_bytes(4, Shape{3, 4, 4, 4}));
  telar::MaxPool3D<float> pool3(2);
  check_shape_error(pool3, Shape{3, 8, 8}, "MaxPool3D expects inputs [C, D, H, W], got [3, 8, 8]");
  telar::AvgPool3D<float> big(5);
  check_shape_error(big, Shape{1, 8, 4, 8},
                    "AvgPool3D expects inputs [C, D, H, W] with every spatial extent + 2 padding "
                    ">= kernel (5), got [1, 8, 4, 8]");
  telar::GlobalMaxPool<float> gmp;
  check_shape_error(gmp, Shape(7),
                    "GlobalMaxPool expects inputs [C, H, W] (or [C, L], [C, D, H, W]), got [7]");
}

TEST_CASE("Upsample matches PyTorch 1.13's F.interpolate and FD", "[layers][upsample][fd]") {
  using telar::Shape;
  using U = telar::Upsample<double>;
  auto const linear = telar::UpsampleMode::linear;
  check_resampling(U({2, 3}), Shape{2, 3, 2}, Shape{2, 6, 6},
                   {0.0,
                    0.0,
                    0.0,
                    2.9749944313574055,
                    2.9749944313574055,
                    2.9749944313574055,
                    0.0,
                    0.0,
                    0.0,
                    2.9749944313574055,
                    2.9749944313574055,
                    2.9749944313574055,
                    -0.7666233060804937,
                    -0.7666233060804937,
                    -0.7666233060804937,
                    -2.7774440469831974,
                    -2.7774440469831974,
                    -2.7774440469831974,
                    -0.7666233060804937,
                    -0.7666233060804937,
                    -0.7666233060804937,
                    -2.7774440469831974,
                    -2.7774440469831974,
                    -2.7774440469831974,
                    1.4823400534158244,
                    1.4823400534158244,
                    1.4823400534158244,
                    2.3954613378704708,
                    2.3954613378704708,
                    2.3954613378704708,
                    1.4823400534158244,
                    1.4823400534158244,
                    1.4823400534158244,
                    2.3954613378704708,
                    2.3954613378704708,
                    2.3954613378704708,
                    -2.099624062780627,
                    -2.099624062780627,
                    -2.099624062780627,
                    -1.8544113367110997,
                    -1.8544113367110997,
                    -1.8544113367110997,
                    -2.099624062780627,
                    -2.099624062780627,
                    -2.099624062780627,
                    -1.8544113367110997,
                    -1.8544113367110997,
                    -1.8544113367110997,
                    2.5774854445694872,
                    2.5774854445694872,
                    2.5774854445694872,
                    1.190221719391841,
                    1.190221719391841,
                    1.190221719391841,
                    2.5774854445694872,
                    2.5774854445694872,
                    2.5774854445694872,
                    1.190221719391841,
                    1.190221719391841,
                    1.190221719391841,
                    -2.8841924756386703,
                    -2.8841924756386703,
                    -2.8841924756386703,
                    -0.4469970774425964,
                    -0.4469970774425964,
                    -0.4469970774425964,
                    -2.8841924756386703,
                    -2.8841924756386703,
                    -2.8841924756386703,
                    -0.4469970774425964,
                    -0.4469970774425964,
                    -0.4469970774425964});
  check_resampling(U::to_size({6, 4}), Shape{1, 3, 2}, Shape{1, 6, 4},
                   {0.0,
                    0.0,
                    2.9749944313574055,
                    2.9749944313574055,
                    0.0,
                    0.0,
                    2.9749944313574055,
                    2.9749944313574055,
                    -0.7666233060804937,
                    -0.7666233060804937,
                    -2.7774440469831974,
                    -2.7774440469831974,
                    -0.7666233060804937,
                    -0.7666233060804937,
                    -2.7774440469831974,
                    -2.7774440469831974,
                    1.4823400534158244,
                    1.4823400534158244,
                    2.3954613378704708,
                    2.3954613378704708,
                    1.4823400534158244,
                    1.4823400534158244,
                    2.3954613378704708,
                    2.3954613378704708});
  check_resampling(U({2, 1, 2}), Shape{1, 2, 2, 3}, Shape{1, 4, 2, 6},
                   {0.0,
                    0.0,
                    2.9749944313574055,
                    2.9749944313574055,
                    -0.7666233060804937,
                    -0.7666233060804937,
                    -2.7774440469831974,
                    -2.7774440469831974,
                    1.4823400534158244,
                    1.4823400534158244,
                    2.3954613378704708,
                    2.3954613378704708,
                    0.0,
                    0.0,
                    2.9749944313574055,
                    2.9749944313574055,
                    -0.7666233060804937,
                    -0.7666233060804937,
                    -2.7774440469831974,
                    -2.7774440469831974,
                    1.4823400534158244,
                    1.4823400534158244,
                    2.3954613378704708,
                    2.3954613378704708,
                    -2.099624062780627,
                    -2.099624062780627,
                    -1.8544113367110997,
                    -1.8544113367110997,
                    2.5774854445694872,
                    2.5774854445694872,
                    1.190221719391841,
                    1.190221719391841,
                    -2.8841924756386703,
                    -2.8841924756386703,
                    -0.4469970774425964,
                    -0.4469970774425964,
                    -2.099624062780627,
                    -2.099624062780627,
                    -1.8544113367110997,
                    -1.8544113367110997,
                    2.5774854445694872,
                    2.5774854445694872,
                    1.190221719391841,
                    1.190221719391841,
                    -2.8841924756386703,
                    -2.8841924756386703,
                    -0.4469970774425964,
                    -0.4469970774425964});
  check_resampling(U({2, 2}, linear), Shape{1, 3, 4}, Shape{1, 6, 8},
                   {0.0,
                    0.7437486078393514,
                    2.231245823518054,
                    2.0395899969979308,
                    0.16878112827898106,
                    -1.2693284913061695,
                    -2.2747388617575215,
                    -2.7774440469831974,
                    0.3705850133539561,
                    0.985466549511885,
                    2.215229621827743,
                    1.8476149946753722,
                    -0.11737733194522729,
                    -1.4615765887954384,
                    -2.1849827758752616,
                    -2.5466858694151733,
                    1.1117550400618683,
                    1.4689024328569524,
                    2.1831972184471202,
                    1.463664990030255,
                    -0.6896942523936441,
                    -1.8460727837739763,
                    -2.0054706041107413,
                    -2.0851695142791242,
                    1.7561264012042401,
                    1.8406326592158835,
                    2.00964517523917,
                    0.9966720334393255,
                    -1.1982867661836498,
                    -2.0974640674698466,
                    -1.7008598704192648,
                    -1.5025577718939738,
                    2.3036990967810715,
                    2.100657228588678,
                    1.6945734922038918,
                    0.446636124902584,
                    -1.643154873315245,
                    -2.2157504398830503,
                    -1.2711505748008316,
                    -0.7988506422597222,
                    2.5774854445694872,
                    2.2306695132750756,
                    1.5370376506862524,
                    0.17161817063421314,
                    -1.8655889268810426,
                    -2.2748936260896517,
                    -1.0562959269916148,
                    -0.4469970774425964});
  check_resampling(U({2, 2}, linear, true), Shape{1, 3, 4}, Shape{1, 6, 8},
                   {0.0,
                    1.274997613438888,
                    2.549995226877776,
                    1.9059607920894348,
                    0.30241033318747784,
                    -1.053883411923737,
                    -1.9156637294534666,
                    -2.7774440469831974,
                    0.5929360213663298,
                    1.5144696667647448,
                    2.4360033121631597,
                    1.5880369646131525,
                    -0.144679379411067,
                    -1.4581675164910914,
                    -1.9331992396827247,
                    -2.408230962874358,
                    1.1858720427326597,
                    1.7539417200906016,
                    2.3220113974485437,
                    1.2701131371368701,
                    -0.5917690920096119,
                    -1.8624516210584459,
                    -1.9507347499119823,
                    -2.0390178787655193,
                    1.7013691316465571,
                    1.8955309670157803,
                    2.089692802385003,
                    0.8941416543098936,
                    -0.9962659854873834,
                    -2.1588792795672593,
                    -1.8659038822123293,
                    -1.5729284848573988,
                    2.1394272881080223,
                    1.939237407540281,
                    1.7390475269725398,
                    0.46012251613222305,
                    -1.3581700598443824,
                    -2.3474504920175305,
                    -1.6787066365837646,
                    -1.0099627811499976,
                    2.5774854445694872,
                    1.9829438480647816,
                    1.388402251560076,
                    0.026103377954552556,
                    -1.7200741342013812,
                    -2.5360217044678026,
                    -1.4915093909552002,
                    -0.4469970774425964});
  check_resampling(U::to_size({5, 7}, linear), Shape{1, 3, 4}, Shape{1, 5, 7},
                   {0.0,
                    1.0624980111990732,
                    2.7624948291175904,
                    1.104185562638456,
                    -0.9102533590021149,
                    -2.0592937823750885,
                    -2.7774440469831974,
                    0.5929360213663297,
                    1.3608807258650089,
                    2.5895922530628956,
                    0.7216787926010425,
                    -1.3789955626258188,
                    -2.012371193547997,
                    -2.4082309628743586,
                    1.4823400534158244,
                    1.8084547978639123,
                    2.330238388980853,
                    0.14791863754492196,
                    -2.082108868061375,
                    -1.9419873103073595,
                    -1.8544113367110997,
                    2.139427288108022,
                    1.9726023876349046,
                    1.7056825468779166,
                    -0.4490237718560799,
                    -2.458907801256492,
                    -1.5672493273448034,
                    -1.009962781149998,
                    2.5774854445694872,
                    2.0820341141488994,
                    1.2893119854759587,
                    -0.8469853781234146,
                    -2.710107090053237,
                    -1.317424005369766,
                    -0.44699707744259637});
  check_resampling(U::to_size({5, 7}, linear, true), Shape{1, 3, 4}, Shape{1, 5, 7},
                   {0.0,
                    1.4874972156787027,
                    2.9749944313574055,
                    1.104185562638456,
                    -0.7666233060804937,
                    -1.7720336765318456,
                    -2.7774440469831974,
                    0.7411700267079122,
                    1.7131989556609253,
                    2.685227884613938,
                    0.6260521000916889,
                    -1.4331236844305604,
                    -1.8745256881388543,
                    -2.3159276918471488,
                    1.4823400534158244,
                    1.9389006956431476,
                    2.3954613378704708,
                    0.14791863754492196,
                    -2.099624062780627,
                    -1.9770176997458633,
                    -1.8544113367110997,
                    2.029912748992656,
                    1.9113771388119059,
                    1.7928415286311559,
                    -0.34953337028924636,
                    -2.491908269209649,
                    -1.821306238143248,
                    -1.150704207076848,
                    2.5774854445694872,
                    1.883853581980664,
                    1.190221719391841,
                    -0.8469853781234147,
                    -2.8841924756386703,
                    -1.6655947765406334,
                    -0.4469970774425964});
  check_resampling(U::to_size({2, 3}, linear), Shape{1, 4, 5}, Shape{1, 2, 3},
                   {0.9443821740529532, -1.3105173213957966, 0.8575274905336039,
                    -0.23720211993912557, 0.6212333402525575, -0.6169692378054783});
  check_resampling(U({2, 2, 2}, linear), Shape{1, 2, 3, 2}, Shape{1, 4, 6, 4},
                   {0.0,
                    0.7437486078393514,
                    2.231245823518054,
                    2.9749944313574055,
                    -0.19165582652012342,
                    0.24047933305297112,
                    1.1047496521991602,
                    1.5368848117722547,
                    -0.5749674795603703,
                    -0.7660592165197894,
                    -1.1482426904386276,
                    -1.3393344273980465,
                    -0.2043824662064142,
                    -0.5243412748472557,
                    -1.1642588921289387,
                    -1.4842177007697803,
                    0.920099213541745,
                    0.9656331580705722,
                    1.0567010471282265,
                    1.1022349916570537,
                    1.4823400534158244,
                    1.7106203745294861,
                    2.167181016756809,
                    2.3954613378704708,
                    -0.5249060156951567,
                    0.04823123556370226,
                    1.1945057380814201,
                    1.7676429893402792,
                    -0.3763285413758672,
                    -0.062408820867437924,
                    0.5654306201494207,
                    0.8793503406578499,
                    -0.07917359273728802,
                    -0.2836889337297182,
                    -0.6927196157145784,
                    -0.8972349567070086,
                    0.14972964147455137,
                    -0.11718627402696832,
                    -0.6510181050300076,
                    -0.9179340205315274,
                    0.310381161259651,
                    0.4370991582408117,
                    0.6905351522031329,
                    0.8172531491842935,
                    0.39070692115220074,
                    0.7142418743747017,
                    1.3613117808197028,
                    1.6848467340422038,
                    -1.57471804708547,
                    -1.342803508987596,
                    -0.8789744327918476,
                    -0.6470598946939734,
                    -0.7456739710873546,
                    -0.6681851287082559,
                    -0.5132074439500585,
                    -0.43571860157095976,
                    0.9124141809088764,
                    0.6810516318504243,
                    0.21832653373351985,
                    -0.013036015324932294,
                    0.8579538568364824,
                    0.6971237276136065,
                    0.3754634691678546,
                    0.2146333399449786,
                    -0.909054943304537,
                    -0.6199688414187094,
                    -0.0417966376470544,
                    0.24728946423877313,
                    -1.7925593433750466,
                    -1.2785151259348675,
                    -0.25042669105450893,
                    0.26361752638567043,
                    -2.099624062780627,
                    -2.038320881263245,
                    -1.9157145182284816,
                    -1.8544113367110997,
                    -0.9303466859430984,
                    -0.9710732826286647,
                    -1.0525264759997979,
                    -1.0932530726853644,
                    1.4082080677319588,
                    1.1634219146404954,
                    0.673849608457569,
                    0.42906345536610574,
                    1.2120659645174479,
                    1.104278728433894,
                    0.8887042562667857,
                    0.7809170201832316,
                    -1.518772995586631,
                    -1.14850284124847,
                    -0.40796253257214804,
                    -0.03769237823398708,
                    -2.8841924756386703,
                    -2.274893626089652,
                    -1.0562959269916152,
                    -0.4469970774425963});
  check_resampling(U::to_size({3, 4, 5}, linear, true), Shape{2, 2, 3, 2}, Shape{2, 3, 4, 5},
                   {0.0,
                    0.7437486078393514,
                    1.4874972156787027,
                    2.231245823518054,
                    2.9749944313574055,
                    -0.5110822040536624,
                    -0.5983027915909958,
                    -0.6855233791283294,
                    -0.7727439666656627,
                    -0.8599645542029963,
                    -0.016968852915054455,
                    -0.27601220269428456,
                    -0.5350555524735149,
                    -0.7940989022527448,
                    -1.053142252031975,
                    1.4823400534158244,
                    1.7106203745294861,
                    1.9389006956431476,
                    2.1671810167568095,
                    2.3954613378704708,
                    -1.0498120313903134,
                    -0.6472861367119469,
                    -0.24476024203358027,
                    0.15776565264478637,
                    0.5602915473231529,
                    0.25368336903289324,
                    0.10468496175231973,
                    -0.04431344552825389,
                    -0.1933118528088274,
                    -0.3423102600894012,
                    0.3699786424591903,
                    0.22640146539627445,
                    0.08282428833335848,
                    -0.06075288872955725,
                    -0.20433006579247326,
                    -0.700926211111423,
                    -0.2821366257800828,
                    0.1366529595512571,
                    0.5554425448825973,
                    0.9742321302139372,
                    -2.099624062780627,
                    -2.038320881263245,
                    -1.9770176997458633,
                    -1.9157145182284814,
                    -1.8544113367110997,
                    1.018448942119449,
                    0.8076727150956352,
                    0.5968964880718216,
                    0.3861202610480079,
                    0.17534403402419393,
                    0.7569261378334351,
                    0.7288151334868335,
                    0.7007041291402318,
                    0.6725931247936303,
                    0.6444821204470286,
                    -2.8841924756386703,
                    -2.2748936260896517,
                    -1.6655947765406334,
                    -1.056295926991615,
                    -0.4469970774425964,
                    2.9993787004280077,
                    2.1680565787529487,
                    1.3367344570778896,
                    0.5054123354028304,
                    -0.32590978627222866,
                    -0.9438039913450573,
                    -0.5554829653537278,
                    -0.16716193936239837,
                    0.22115908662893088,
                    0.6094801126202603,
                    -1.0643238298370026,
                    -0.7651230303602422,
                    -0.4659222308834818,
                    -0.1667214314067213,
                    0.13247936807003918,
                    2.637819184952173,
                    1.5391363837334067,
                    0.4404535825146402,
                    -0.6582292187041263,
                    -1.7569120199228927,
                    0.4071481984666101,
                    0.5546203841532618,
                    0.7020925698399134,
                    0.849564755526565,
                    0.9970369412132166,
                    -0.3069996934683028,
                    -0.28481543778629814,
                    -0.2626311821042936,
                    -0.2404469264222891,
                    -0.2182626707402846,
                    -0.15041502954860614,
                    -0.20046798176225195,
                    -0.25052093397589775,
                    -0.3005738861895435,
                    -0.3506268384031893,
                    0.8769021902257002,
                    0.807662752225401,
                    0.7384233142251018,
                    0.6691838762248025,
                    0.5999444382245033,
                    -2.1850823034947875,
                    -1.0588158104464251,
                    0.0674506826019372,
                    1.1937171756502996,
                    2.319983668698662,
                    0.3298046044084518,
                    -0.014147910218868541,
                    -0.35810042484618887,
                    -0.7020529394735091,
                    -1.0460054541008295,
                    0.7634937707397903,
                    0.3641870668357383,
                    -0.03511963706831369,
                    -0.4344263409723657,
                    -0.8337330448764178,
                    -0.8840148045007729,
                    0.07618912071739517,
                    1.0363930459355633,
                    1.9965969711537312,
                    2.9568008963718992});
  check_resampling(U::to_size({7}, linear), Shape{2, 3}, Shape{2, 7},
                   {0.0, 0.42499920447962924, 1.6999968179185174, 2.974994431357405,
                    1.3714439724554495, -0.23210648644650753, -0.7666233060804937,
                    -2.7774440469831974, -2.168903461211909, -0.3432817038980422, 1.482340053415824,
                    1.87367774675353, 2.2650154400912355, 2.3954613378704708});
}

TEST_CASE("Upsample refuses what it cannot do, naming the sizes", "[layers][upsample]") {
  using telar::Shape;
  auto nearest = telar::Upsample<float>::to_size({7, 8});
  check_shape_error(nearest, Shape{3, 4, 4},
                    "Upsample (nearest) takes integer factors only: output size [7, 8] is not a "
                    "multiple of input [3, 4, 4]'s spatial extents");
  telar::Upsample<float> two({2, 2});
  check_shape_error(two, Shape{3, 4, 4, 4},
                    "Upsample with 2 spatial factors [2, 2] expects inputs [C, 2 extents], got "
                    "[3, 4, 4, 4]");
  CHECK_THROWS_AS(telar::Upsample<float>({2, 0}), telar::Error);
  CHECK_THROWS_AS(telar::Upsample<float>({2, 2}, telar::UpsampleMode::nearest, true), telar::Error);
  CHECK(two.saved_bytes(4, Shape{3, 4, 4}) == 0);
  CHECK(two.flops(1, Shape{3, 4, 4}) == 3 * 8 * 8);
}

TEST_CASE("The new layers compose in a Sequential: shapes and gradients", "[layers][fd]") {
  // An encoder-decoder in miniature: pool, upsample back, gate with a
  // channel softmax, as squeeze-excitation and attention graphs do.
  using telar::Shape;
  telar::Sequential<telar::MaxPool3D<double>, telar::Upsample<double>, telar::HardSwish<double>,
                    telar::Softmax<double>>
      net(telar::MaxPool3D<double>(2),
          telar::Upsample<double>({2, 2, 2}, telar::UpsampleMode::linear), {},
          telar::Softmax<double>(0));
  CHECK(net.shapes(Shape{3, 4, 4, 2}).back().str() == "[3, 4, 4, 2]");
  auto const report = telar::check_gradients(net, Shape{3, 4, 4, 2}, 2);
  INFO(report.str());
  CHECK(report.passed(1e-6));
}

TEST_CASE("Rearrange moves values as index arithmetic says; FD gradients", "[layers][fd]") {
  telar::Shape const in{2, 3, 4};
  Values const x = sample(in);
  auto t = telar::Rearrange<double>::transpose(in, {2, 0, 1}); // y(c, a, b) = x(a, b, c)
  CHECK(t.output_shape(in).str() == telar::Shape{4, 2, 3}.str());
  Values const y = run(t, in, x);
  for (std::size_t a = 0; a < 2; ++a)
    for (std::size_t b = 0; b < 3; ++b)
      for (std::size_t c = 0; c < 4; ++c)
        CHECK(y[c * 6 + a * 3 + b] == x[a * 12 + b * 4 + c]);
  auto s = telar::Rearrange<double>::slice(in, 2, 1, 3); // x(:, :, 1:3)
  Values dx;
  Values const z = run(s, in, x, &dx);
  REQUIRE(z.size() == 12);
  for (std::size_t i = 0; i < 12; ++i)
    CHECK(z[i] == x[i / 2 * 4 + 1 + i % 2]);
  for (std::size_t i = 0; i < 24; ++i) // the dropped columns get no gradient
    CHECK(dx[i] == (i % 4 == 1 || i % 4 == 2 ? 1.0 : 0.0));
  auto r = telar::Rearrange<double>::reshape(in, telar::Shape{6, 4});
  CHECK(run(r, in, x) == x);
  for (auto* l : {&t, &s, &r}) {
    auto const report = telar::check_gradients(*l, in, 2);
    INFO(report.str());
    CHECK(report.passed(1e-6));
  }
  CHECK_THROWS_AS(telar::Rearrange<double>::transpose(in, {0, 0, 1}), telar::ShapeError);
  CHECK_THROWS_AS(telar::Rearrange<double>::slice(in, 1, 2, 4), telar::ShapeError);
  check_shape_error(t, telar::Shape{2, 4, 3},
                    "telar::Rearrange expects inputs [2, 3, 4], got [2, 4, 3]");
}

// A causal mask [3, 3] (j > i set) over scores [2, 3, 3]: the mask repeats
// over the first axis; masked entries take the value and pass no gradient.
TEST_CASE("MaskedFill replaces the masked values, tiled over the leading axes; FD gradients",
          "[layers][fd]") {
  telar::Shape const in{2, 3, 3};
  std::vector<bool> mask(9);
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 3; ++j)
      mask[i * 3 + j] = j > i;
  telar::MaskedFill<double> f(in, mask, -7.5);
  Values const x = sample(in);
  Values dx;
  Values const y = run(f, in, x, &dx);
  REQUIRE(y.size() == 18);
  for (std::size_t k = 0; k < 18; ++k) {
    bool const set = mask[k % 9];
    CHECK(y[k] == (set ? -7.5 : x[k]));
    CHECK(dx[k] == (set ? 0.0 : 1.0));
  }
  auto const report = telar::check_gradients(f, in, 2);
  INFO(report.str());
  CHECK(report.passed(1e-6));
  CHECK_THROWS_AS(telar::MaskedFill<double>(in, std::vector<bool>(4), 0.0), telar::ShapeError);
  check_shape_error(f, telar::Shape{3, 3},
                    "telar::MaskedFill expects inputs [2, 3, 3], got [3, 3]");
}

// x [2, 3, 4] per sample; y = (0.5 x) x^T per head: [2, 3, 3]. Both inputs of
// the MatMul join come from x, so its two gradients add up.
TEST_CASE("A graph's batched MatMul join equals the direct product; FD gradients",
          "[layers][graph][fd]") {
  using Node = std::variant<telar::Rearrange<double>, telar::Scale<double>>;
  telar::Shape const in{2, 3, 4};
  telar::DynamicGraph<Node> g("x");
  g.add("half", telar::Scale<double>(0.5), "x", "q");
  g.add("kt", telar::Rearrange<double>::transpose(in, {0, 2, 1}), "x", "k");
  g.add_matmul("qk", {"q", "k"}, "y");
  g.set_output("y");
  CHECK(g.output_shape(in).str() == telar::Shape{2, 3, 3}.str());
  g.build(in);
  Values const x = sample(in);
  Values const y = run(g, in, x);
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t j = 0; j < 3; ++j) {
        double want = 0;
        for (std::size_t k = 0; k < 4; ++k)
          want += 0.5 * x[h * 12 + i * 4 + k] * x[h * 12 + j * 4 + k];
        CHECK(y[h * 9 + i * 3 + j] == Approx(want).epsilon(1e-12));
      }
  auto const report = telar::check_gradients(g, in, 2);
  INFO(report.str());
  CHECK(report.passed(1e-6));
  telar::DynamicGraph<Node> bad("x");
  bad.add_matmul("xx", {"x", "x"}, "y"); // [3, 4] x [3, 4]: K differs from the rows
  bad.set_output("y");
  CHECK_THROWS_WITH(
      bad.output_shape(telar::Shape{3, 4}),
      Catch::Matchers::ContainsSubstring("a MatMul needs [..., M, K] and [..., K, N]"));
}

// A table [2, 4] over samples [3, 2, 4] (right-aligned, as ONNX broadcasts:
// it repeats over the first axis), then [3, 1, 1] (one value per channel);
// x - b and b - x by the signs.
TEST_CASE("Bias adds a table broadcast over the sample; x - b, b - x; FD gradients",
          "[layers][fd]") {
  telar::Shape const in{3, 2, 4}, table{2, 4};
  for (double const sx : {1.0, -1.0})
    for (double const sb : {1.0, -1.0}) {
      INFO("input sign " << sx << ", bias sign " << sb);
      telar::Bias<double> b(in, table, sb, sx);
      b.initialize(0);
      Values const t = sample(table);
      Kokkos::deep_copy(b.bias, Kokkos::View<double const*, Kokkos::HostSpace>(t.data(), t.size()));
      Values const x = sample(in);
      Values dx;
      Values const y = run(b, in, x, &dx);
      for (std::size_t c = 0; c < 3; ++c)
        for (std::size_t h = 0; h < 2; ++h)
          for (std::size_t w = 0; w < 4; ++w) {
            std::size_t const e = (c * 2 + h) * 4 + w;
            CHECK(y[e] == Approx(sx * x[e] + sb * t[h * 4 + w]).epsilon(1e-14));
            CHECK(dx[e] == sx);
          }
      auto const report = telar::check_gradients(b, in, 2);
      INFO(report.str());
      CHECK(report.passed(1e-6));
    }
  telar::Bias<double> per_channel(in, telar::Shape{3, 1, 1});
  auto const report = telar::check_gradients(per_channel, in, 2);
  INFO(report.str());
  CHECK(report.passed(1e-6));
  CHECK_THROWS_WITH(telar::Bias<double>(in, telar::Shape{3, 4}),
                    "telar::Bias: a table [3, 4] does not broadcast over samples [3, 2, 4] (its "
                    "last axes must each equal the sample's or be 1)");
  check_shape_error(per_channel, telar::Shape{3, 2, 5},
                    "telar::Bias (table [3, 1, 1]) expects inputs [3, 2, 4], got [3, 2, 5]");
}

// A table [2, 4] over samples [3, 2, 4] (repeated over the first axis),
// then [3, 1, 1] (one factor per channel); x * w and x / w. The table is set
// away from zero and one, so a divisor's gradient -dy x / w^2 differs from a
// factor's and a swapped or missing term shows.
TEST_CASE("Multiplier scales by a table broadcast over the sample; x * w, x / w; FD gradients",
          "[layers][fd]") {
  telar::Shape const in{3, 2, 4};
  for (telar::Shape const table : {telar::Shape{2, 4}, telar::Shape{3, 1, 1}})
    for (bool const divide : {false, true}) {
      INFO("table " << table.str() << (divide ? ", dividing" : ", multiplying"));
      telar::Multiplier<double> m(in, table, divide);
      CHECK(m.parameter_count() == table.size());
      m.initialize(0);
      Values t(table.size());
      for (std::size_t i = 0; i < t.size(); ++i)
        t[i] = 1.5 + std::sin(0.9 * double(i)); // in [0.5, 2.5]
      Kokkos::deep_copy(m.weight,
                        Kokkos::View<double const*, Kokkos::HostSpace>(t.data(), t.size()));
      Values const x = sample(in);
      Values dx;
      Values const y = run(m, in, x, &dx);
      for (std::size_t c = 0; c < 3; ++c)
        for (std::size_t h = 0; h < 2; ++h)
          for (std::size_t w = 0; w < 4; ++w) {
            std::size_t const e = (c * 2 + h) * 4 + w;
            double const f = table.rank == 2 ? t[h * 4 + w] : t[c];
            CHECK(y[e] == Approx(divide ? x[e] / f : x[e] * f).epsilon(1e-14));
            CHECK(dx[e] == Approx(divide ? 1 / f : f).epsilon(1e-14));
          }
      telar::GradientCheckOptions o;
      o.initialize = false; // keep the table above
      auto const report = telar::check_gradients(m, in, 2, o);
      INFO(report.str());
      CHECK(report.passed(1e-6));
    }
  CHECK_THROWS_WITH(telar::Multiplier<double>(in, telar::Shape{3, 4}),
                    "telar::Multiplier: a table [3, 4] does not broadcast over samples [3, 2, 4] "
                    "(its last axes must each equal the sample's or be 1)");
  telar::Multiplier<double> per_channel(in, telar::Shape{3, 1, 1});
  check_shape_error(per_channel, telar::Shape{3, 2, 5},
                    "telar::Multiplier (table [3, 1, 1]) expects inputs [3, 2, 4], got [3, 2, 5]");
}

// A fixed table (an ONNX Constant node: a literal in PyTorch's forward) is
// a buffer: no parameter, no gradient buffer, the forward of the trained one.
TEST_CASE("A fixed Bias or Multiplier keeps its table as a buffer; FD input gradients",
          "[layers][fd]") {
  telar::Shape const in{3, 2, 4}, table{3, 1, 1};
  Values const x = sample(in);
  auto const check_fixed = [&](auto trained, auto fixed, auto& table_of) {
    CHECK(trained.trained());
    CHECK_FALSE(fixed.trained());
    CHECK(fixed.parameter_count() == 0);
    CHECK(fixed.buffer_count() == table.size());
    CHECK(trained.buffer_count() == 0);
    trained.initialize(0);
    fixed.initialize(0);
    Values t(table.size());
    for (std::size_t i = 0; i < t.size(); ++i)
      t[i] = 1.5 + std::sin(0.9 * double(i));
    for (auto* l : {&trained, &fixed})
      Kokkos::deep_copy(table_of(*l),
                        Kokkos::View<double const*, Kokkos::HostSpace>(t.data(), t.size()));
    int params = 0, buffers = 0;
    fixed.parameters([&](char const*, auto&, auto&) { ++params; });
    fixed.buffers([&](char const* name, auto& v) {
      ++buffers;
      INFO(name);
      CHECK(v.data() == table_of(fixed).data());
    });
    CHECK(params == 0);
    CHECK(buffers == 1);
    CHECK(run(fixed, in, x) == run(trained, in, x));
    telar::GradientCheckOptions o;
    o.initialize = false; // keep the table above
    auto const report = telar::check_gradients(fixed, in, 2, o);
    INFO(report.str());
    CHECK(report.passed(1e-6));
  };
  auto bias_table = [](auto& l) -> auto& {
    return l.bias;
  };
  auto weight_table = [](auto& l) -> auto& {
    return l.weight;
  };
  check_fixed(telar::Bias<double>(in, table, -1.0, 1.0),
              telar::Bias<double>(in, table, -1.0, 1.0, false), bias_table);
  check_fixed(telar::Multiplier<double>(in, table, true),
              telar::Multiplier<double>(in, table, true, false), weight_table);
}

// x [3, 2, 2]; s = sigmoid(x); p = sigmoid(the channel means) [3]; q =
// the first channel's mean [1]: y = (x + p) + (q + s) + s, an Add
// spread per channel on the right, one spread per sample on the left, and an
// Add of three equal shapes. A spread input's gradient sums over its
// positions (FD shows a missing or doubled term).
TEST_CASE("A graph's Add of two broadcasts per channel or per sample; FD gradients",
          "[layers][graph][fd]") {
  using Node =
      std::variant<telar::Sigmoid<double>, telar::GlobalAvgPool<double>, telar::Rearrange<double>>;
  telar::Shape const in{3, 2, 2};
  telar::DynamicGraph<Node> g("x");
  g.add("s", telar::Sigmoid<double>{}, "x", "s");
  g.add("mean", telar::GlobalAvgPool<double>{}, "x", "m");
  g.add("p", telar::Sigmoid<double>{}, "m", "p");
  g.add("first", telar::Rearrange<double>::slice(in, 0, 0, 1), "x", "f");
  g.add("q", telar::GlobalAvgPool<double>{}, "f", "q");
  g.add_add("xp", {"x", "p"}, "a");
  g.add_add("qs", {"q", "s"}, "b");
  g.add_add("y", {"a", "b", "s"}, "y");
  g.set_output("y");
  CHECK(g.output_shape(in) == in);
  g.build(in);
  Values const x = sample(in);
  Values const y = run(g, in, x);
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  auto mean = [&](std::size_t c) {
    return (x[c * 4] + x[c * 4 + 1] + x[c * 4 + 2] + x[c * 4 + 3]) / 4;
  };
  for (std::size_t c = 0; c < 3; ++c)
    for (std::size_t k = c * 4; k < c * 4 + 4; ++k)
      CHECK(y[k] == Approx(x[k] + sig(mean(c)) + mean(0) + 2 * sig(x[k])).epsilon(1e-12));
  auto const report = telar::check_gradients(g, in, 2);
  INFO(report.str());
  CHECK(report.passed(1e-6));
  telar::DynamicGraph<Node> bad("x");
  bad.add("mean", telar::GlobalAvgPool<double>{}, "x", "m");
  bad.add_add("three", {"x", "m", "x"}, "y");
  bad.set_output("y");
  CHECK_THROWS_WITH(bad.output_shape(in),
                    "telar::DynamicGraph: Add node 'three' joins 'x' [3, 2, 2], 'm' [3], 'x' "
                    "[3, 2, 2]: an Add of three inputs or more needs equal shapes (of two, one may "
                    "be spread: one value per channel or per sample)");
}

// x [3, 2, 2]; s = sigmoid(x), p = sigmoid(mean over the channel) [3]:
// y = (x / s - p) - p / s: Div and Sub of equal shapes and with one value
// per channel on either side (divisors in (0.26, 0.74)). Gradients of a
// spread input sum over its channel.
TEST_CASE("A graph's Sub and Div joins, same shape and per channel; FD gradients",
          "[layers][graph][fd]") {
  using Node = std::variant<telar::Sigmoid<double>, telar::GlobalAvgPool<double>>;
  telar::Shape const in{3, 2, 2};
  telar::DynamicGraph<Node> g("x");
  g.add("s", telar::Sigmoid<double>{}, "x", "s");
  g.add("mean", telar::GlobalAvgPool<double>{}, "x", "m");
  g.add("p", telar::Sigmoid<double>{}, "m", "p");
  g.add_div("xs", {"x", "s"}, "a");
  g.add_sub("ap", {"a", "p"}, "b");
  g.add_div("ps", {"p", "s"}, "c");
  g.add_sub("y", {"b", "c"}, "y");
  g.set_output("y");
  CHECK(g.output_shape(in) == in);
  g.build(in);
  Values const x = sample(in);
  Values const y = run(g, in, x);
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  for (std::size_t c = 0; c < 3; ++c) {
    double const p = sig((x[c * 4] + x[c * 4 + 1] + x[c * 4 + 2] + x[c * 4 + 3]) / 4);
    for (std::size_t k = c * 4; k < c * 4 + 4; ++k)
      CHECK(y[k] == Approx(x[k] / sig(x[k]) - p - p / sig(x[k])).epsilon(1e-12));
  }
  auto const report = telar::check_gradients(g, in, 2);
  INFO(report.str());
  CHECK(report.passed(1e-6));
  using Cut = std::variant<telar::Rearrange<double>>;
  telar::DynamicGraph<Cut> bad("x");
  bad.add("first", telar::Rearrange<double>::slice(in, 0, 0, 1), "x", "f");
  bad.add_div("xf", {"x", "f"}, "y"); // [1, 2, 2] against [3, 2, 2]: neither
  bad.set_output("y");
  CHECK_THROWS_WITH(
      bad.output_shape(in),
      "telar::DynamicGraph: Div node 'xf' joins 'x' [3, 2, 2], 'f' [1, 2, 2]: a Div "
      "needs equal shapes, or one of [C] or [C, 1, 1] (one value per channel) or [1] (one "
      "per sample) against [C, ...]");
}
