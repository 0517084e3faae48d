// Element-wise, softmax, pooling and resampling layers: values against
// PyTorch 1.13 (numbers printed by reference/layer_zoo_reference.py),
// gradients against finite differences in double, and shape errors.
#include "support.hpp"

#include <telar/layers/activation.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/layers/softmax.hpp>
#include <telar/testing/check_gradients.hpp>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <string>
#include <vector>

using Catch::Approx;
using telar::test::to_host;
using Exec = telar::DefaultMemorySpace::execution_space;
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
  check_shape_error(softmax, telar::Shape{2, 3, 4},
                    "Softmax: axis 3 is outside input [2, 3, 4] (expected -3 to 2, the batch "
                    "excluded)");
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
