// Element-wise, softmax, pooling and resampling layers: values against
// PyTorch 1.13 (numbers printed by reference/layer_zoo_reference.py),
// gradients against finite differences in double, and shape errors.
#include "support.hpp"

#include <telar/layers/activation.hpp>
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
