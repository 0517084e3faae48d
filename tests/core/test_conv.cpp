// Convolution (grouped, depthwise, transposed), pooling and flatten layers:
// finite-difference gradient checks in double, forward checks against a naive
// direct convolution and against PyTorch 1.13 (tests/core/conv_reference.py
// prints the numbers), and shape errors.
#include "support.hpp"

#include <telar/core/detail/host_simd.hpp>
#include <telar/core/sequential.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/conv_transpose.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/testing/check_gradients.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

using telar::Shape;
using telar::test::Exec;
using telar::test::random_matrix;
using telar::test::to_host;

namespace {

template <class Layer>
void require_gradients(Layer layer, Shape in, std::size_t samples, std::string const& what) {
  auto const report = telar::check_gradients(layer, in, samples);
  INFO(what << "\n" << report.str());
  CHECK(report.passed(1e-6));
}

// y(n, co, oh, ow) by the definition, on the host.
template <class Conv, class HX>
std::vector<double> direct_conv2d(Conv& conv, HX const& hx, std::size_t n, std::size_t C,
                                  std::size_t H, std::size_t W, std::size_t Co, int k, int s, int p,
                                  int d, std::size_t Ho, std::size_t Wo) {
  auto hw = to_host(conv.weight);
  std::vector<double> y(n * Co * Ho * Wo, 0.0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t co = 0; co < Co; ++co)
      for (std::size_t oh = 0; oh < Ho; ++oh)
        for (std::size_t ow = 0; ow < Wo; ++ow) {
          double acc = conv.has_bias() ? double(to_host(conv.bias)(co)) : 0.0;
          for (std::size_t c = 0; c < C; ++c)
            for (int ky = 0; ky < k; ++ky)
              for (int kx = 0; kx < k; ++kx) {
                long const ih = long(oh) * s - p + ky * d, iw = long(ow) * s - p + kx * d;
                if (ih < 0 || iw < 0 || ih >= long(H) || iw >= long(W))
                  continue;
                acc += double(hw(co, (c * k + ky) * k + kx)) *
                       double(hx(i, (c * H + std::size_t(ih)) * W + std::size_t(iw)));
              }
          y[((i * Co + co) * Ho + oh) * Wo + ow] = acc;
        }
  return y;
}

// Fills x, W and b of a built layer by conv_reference.py's formulas, runs
// forward on 2 samples and returns the output shape and the checksum
// sum_i y[i] ((i % 7) - 3).
template <class Layer>
std::pair<Shape, double> reference_checksum(Layer layer, Shape in) {
  layer.build(in);
  layer.initialize(1);
  auto fill = [](auto const& v, auto f) {
    auto h = Kokkos::create_mirror_view(v);
    for (std::size_t i = 0; i < h.size(); ++i)
      h.data()[i] = f(double(i));
    Kokkos::deep_copy(v, h);
  };
  fill(layer.weight, [](double i) { return 0.5 * std::cos(0.23 * i); });
  fill(layer.bias, [](double i) { return 0.1 * i - 0.2; });
  Shape const out = layer.output_shape(in);
  telar::Matrix<double> x("x", 2, in.size()), y("y", 2, out.size());
  fill(x, [](double i) { return std::sin(0.37 * i + 0.1); });
  typename Layer::saved_type saved;
  layer.forward(Exec{}, x, y, saved);
  auto hy = to_host(y);
  double sum = 0;
  for (std::size_t i = 0; i < hy.size(); ++i)
    sum += hy.data()[i] * double(int(i % 7) - 3);
  return {out, sum};
}

} // namespace

TEST_CASE("Grouped and depthwise convolutions match finite differences", "[conv][groups][fd]") {
  using C2 = telar::Conv2D<double>;
  using C3 = telar::Conv3D<double>;
  require_gradients(C2(4, 6, 3, 1, 1, true, 1, 2), Shape{4, 4, 5}, 2, "2 groups 3x3 p1");
  require_gradients(C2(3, 3, 3, 2, 1, true, 1, 3), Shape{3, 5, 6}, 2, "depthwise 3x3 s2 p1");
  require_gradients(C2(2, 4, 3, 1, 0, false, 2, 2), Shape{2, 6, 6}, 2, "depthwise x2 d2 no bias");
  require_gradients(C2(4, 4, 1, 1, 0, true, 1, 2), Shape{4, 3, 4}, 2, "2 groups 1x1 (no im2col)");
  require_gradients(C2(10, 10, 3, 1, 1, true, 1, 2), Shape{10, 3, 3}, 2, "2 groups of 5");
  require_gradients(C3(4, 2, 2, 1, 1, true, 1, 2), Shape{4, 2, 3, 3}, 1, "3-D 2 groups");
}

TEST_CASE("Transposed convolutions match finite differences", "[conv][transpose][fd]") {
  using T2 = telar::ConvTranspose2D<double>;
  using T3 = telar::ConvTranspose3D<double>;
  require_gradients(T2(2, 3, 3), Shape{2, 3, 4}, 2, "3x3 s1");
  require_gradients(T2(3, 2, 3, 2, 1, 1), Shape{3, 3, 4}, 2, "3x3 s2 p1 op1");
  require_gradients(T2(4, 6, 2, 2, 0, 0, false, 1, 2), Shape{4, 3, 3}, 2, "2x2 s2 2 groups");
  require_gradients(T2(2, 2, 2, 2, 1, 2, true, 3), Shape{2, 3, 3}, 2, "s2 d3 op2 (op >= stride)");
  require_gradients(T2(3, 2, 1), Shape{3, 3, 4}, 2, "1x1 (no im2col)");
  require_gradients(T2(10, 10, 2, 2, 0, 0, true, 1, 2), Shape{10, 3, 3}, 2, "2 groups of 5");
  require_gradients(T2(2, 3, {1, 3}, {1, 2}, {0, 1}, {0, 1}), Shape{2, 3, 3}, 2,
                    "1x3 stride (1,2) op (0,1)");
  require_gradients(T3(2, 2, 2, 2, 0, 1), Shape{2, 2, 2, 3}, 1, "3-D 2x2x2 s2 op1");
}

TEST_CASE("Grouped and transposed convolutions match PyTorch 1.13", "[conv][groups][transpose]") {
  struct Want {
    char const* what;
    Shape out;
    double sum; // from tests/core/conv_reference.py
  };
  auto check = [](std::pair<Shape, double> const& got, Want const& want) {
    INFO(want.what);
    CHECK(got.first == want.out);
    CHECK(std::fabs(got.second - want.sum) < 1e-10 * (1 + std::fabs(want.sum)));
  };
  using C2 = telar::Conv2D<double>;
  using C3 = telar::Conv3D<double>;
  using T2 = telar::ConvTranspose2D<double>;
  using T3 = telar::ConvTranspose3D<double>;
  check(reference_checksum(C2(4, 6, 3, 1, 1, true, 1, 2), Shape{4, 5, 6}),
        {"grouped 2-D", Shape{6, 5, 6}, -3.4151145406466874});
  check(reference_checksum(C2(3, 6, 3, 2, 1, true, 1, 3), Shape{3, 7, 6}),
        {"depthwise 2-D s2", Shape{6, 4, 3}, -0.8244497152068588});
  check(reference_checksum(C3(4, 2, 2, 1, 0, true, 1, 2), Shape{4, 3, 4, 3}),
        {"grouped 3-D", Shape{2, 2, 3, 2}, 6.07122104044106});
  check(reference_checksum(T2(3, 4, 3, 2, 1, 1), Shape{3, 4, 5}),
        {"transposed 2-D s2 p1 op1", Shape{4, 8, 10}, -9.745495050265848});
  check(reference_checksum(T2(4, 6, 2, 1, 0, 0, true, 2, 2), Shape{4, 3, 4}),
        {"transposed 2-D grouped d2", Shape{6, 5, 6}, -3.378378048406219});
  check(reference_checksum(T2(2, 3, 2, 2, 1, 2, true, 3), Shape{2, 3, 3}),
        {"transposed 2-D s2 d3 op2", Shape{3, 8, 8}, -0.4881662355818284});
  check(reference_checksum(T3(2, 3, 2, 2, 0, 1), Shape{2, 2, 3, 2}),
        {"transposed 3-D s2 op1", Shape{3, 5, 7, 5}, 0.5426875034084216});
}

TEST_CASE("Grouped and transposed convolutions count parameters and flops",
          "[conv][groups][transpose]") {
  telar::Conv2D<double> dw(8, 8, 3, 1, 1, true, 1, 8);
  CHECK(dw.parameter_count() == 8 * 9 + 8);
  CHECK(dw.flops(2, Shape{8, 5, 5}) == 2.0 * 2 * 8 * 25 * 9);
  CHECK(dw.groups() == 8);
  // PyTorch: ConvTranspose2d(4, 6, 3, groups=2) has 4 * 3 * 9 + 6 parameters.
  telar::ConvTranspose2D<double> up(4, 6, 3, 2, 0, 0, true, 1, 2);
  CHECK(up.parameter_count() == 4 * 3 * 9 + 6);
  // Each input value meets out/groups * 9 weights: 2 * n * 4 * 5 * 5 * 27.
  CHECK(up.flops(2, Shape{4, 5, 5}) == 2.0 * 2 * 4 * 25 * 27);
  CHECK(up.saved_bytes(2, Shape{4, 5, 5}) == 0);
  up.build(Shape{4, 5, 5});
  up.initialize(1);
  CHECK(to_host(up.weight).extent(0) == 4);
  CHECK(to_host(up.weight).extent(1) == 27);
  double const bound = 1.0 / std::sqrt(27.0); // fan-in out/groups * 9, as PyTorch
  auto hw = to_host(up.weight);
  for (std::size_t i = 0; i < hw.size(); ++i)
    REQUIRE(std::fabs(hw.data()[i]) <= bound);
}

TEST_CASE("Conv2D gradients match finite differences", "[conv][fd]") {
  using C2 = telar::Conv2D<double>;
  require_gradients(C2(2, 3, 3), Shape{2, 5, 6}, 2, "3x3 s1 p0");
  require_gradients(C2(2, 3, 3, 1, 1), Shape{2, 5, 4}, 2, "3x3 s1 p1");
  require_gradients(C2(3, 2, 3, 2, 1), Shape{3, 7, 6}, 2, "3x3 s2 p1");
  require_gradients(C2(2, 4, 3, 2, 0, false), Shape{2, 7, 5}, 2, "3x3 s2 p0 no bias");
  require_gradients(C2(3, 2, 1), Shape{3, 4, 5}, 2, "1x1 (no im2col)");
  require_gradients(C2(1, 2, 2, 1, 0, true, 2), Shape{1, 6, 5}, 2, "2x2 dilation 2");
  require_gradients(C2(2, 3, {1, 3}, {1, 2}, {0, 1}), Shape{2, 4, 7}, 2, "1x3 stride (1,2)");
}

TEST_CASE("Conv3D gradients match finite differences", "[conv][fd]") {
  using C3 = telar::Conv3D<double>;
  require_gradients(C3(2, 2, 3, 1, 1), Shape{2, 3, 4, 3}, 2, "3x3x3 s1 p1");
  require_gradients(C3(1, 3, 2, 2, 0, false), Shape{1, 4, 5, 4}, 1, "2x2x2 s2 p0 no bias");
}

TEST_CASE("Conv2D forward matches a direct convolution", "[conv]") {
  struct Case {
    std::size_t C, Co, H, W;
    int k, s, p, d;
    bool bias;
  };
  for (Case const c : {Case{3, 4, 7, 6, 3, 1, 1, 1, true}, Case{2, 5, 9, 8, 3, 2, 1, 1, false},
                       Case{2, 3, 8, 8, 2, 2, 0, 1, true}, Case{1, 2, 7, 7, 3, 1, 2, 2, true}}) {
    telar::Conv2D<double> conv(c.C, c.Co, std::size_t(c.k), std::size_t(c.s), std::size_t(c.p),
                               c.bias, std::size_t(c.d));
    Shape const in{c.C, c.H, c.W};
    Shape const out = conv.output_shape(in);
    conv.build(in);
    conv.initialize(3);
    std::size_t const n = 3;
    auto x = random_matrix<double>(n, in.size(), 5);
    telar::Matrix<double> y("y", n, out.size());
    telar::Conv2D<double>::saved_type saved;
    conv.forward(Exec{}, x, y, saved);
    auto const want =
        direct_conv2d(conv, to_host(x), n, c.C, c.H, c.W, c.Co, c.k, c.s, c.p, c.d, out[1], out[2]);
    auto hy = to_host(y);
    double worst = 0;
    for (std::size_t i = 0; i < want.size(); ++i)
      worst = std::max(worst, std::fabs(hy.data()[i] - want[i]));
    INFO("C " << c.C << " Co " << c.Co << " k " << c.k << " s " << c.s << " p " << c.p);
    CHECK(worst < 1e-12);
  }
}

TEST_CASE("Conv2D in float with the reference GEMM agrees with the default policy", "[conv]") {
  telar::Conv2D<float> a(3, 4, 3, 1, 1);
  telar::Conv2D<float, telar::DefaultMemorySpace, telar::ReferenceGemm> b(3, 4, 3, 1, 1);
  Shape const in{3, 6, 6};
  a.build(in), b.build(in);
  a.initialize(9), b.initialize(9);
  auto x = random_matrix<float>(2, in.size(), 1);
  telar::Matrix<float> ya("ya", 2, 4 * 36), yb("yb", 2, 4 * 36);
  decltype(a)::saved_type sa;
  decltype(b)::saved_type sb;
  a.forward(Exec{}, x, ya, sa);
  b.forward(Exec{}, x, yb, sb);
  auto ha = to_host(ya), hb = to_host(yb);
  for (std::size_t i = 0; i < ha.size(); ++i)
    REQUIRE(std::fabs(ha.data()[i] - hb.data()[i]) < 1e-5f);
}

TEST_CASE("Conv2D initialisation follows PyTorch's bounds", "[conv]") {
  telar::Conv2D<double> conv(4, 8, 3);
  conv.build(Shape{4, 5, 5});
  conv.initialize(1);
  double const bound = 1.0 / std::sqrt(36.0);
  auto hw = to_host(conv.weight);
  auto hb = to_host(conv.bias);
  REQUIRE(hw.extent(0) == 8);
  REQUIRE(hw.extent(1) == 36);
  double lo = 1, hi = -1;
  for (std::size_t i = 0; i < hw.size(); ++i) {
    lo = std::min(lo, hw.data()[i]);
    hi = std::max(hi, hw.data()[i]);
  }
  CHECK(lo >= -bound);
  CHECK(hi < bound);
  CHECK(hi - lo > bound); // spread over the interval
  for (std::size_t i = 0; i < hb.size(); ++i)
    CHECK(std::fabs(hb(i)) <= bound);
  CHECK(conv.flops(2, Shape{4, 5, 5}) == 2.0 * 2 * 8 * 9 * 36);
}

TEST_CASE("Pooling and Flatten gradients match finite differences", "[pool][fd]") {
  // Inputs spaced apart so no two window entries tie within the FD step.
  require_gradients(telar::MaxPool2D<double>(2), Shape{2, 4, 6}, 2, "max 2x2");
  require_gradients(telar::MaxPool2D<double>(3, 2, 1), Shape{2, 5, 5}, 2, "max 3x3 s2 p1");
  require_gradients(telar::MaxPool2D<double>(3, 1), Shape{1, 5, 4}, 2, "max 3x3 s1 (overlap)");
  require_gradients(telar::MaxPool2D<double>(2), Shape{2, 5, 7}, 2,
                    "max 2x2, odd extents (tiled path)");
  require_gradients(telar::MaxPool2D<double>(3), Shape{2, 7, 6}, 2, "max 3x3 s3 (tiled path)");
  require_gradients(telar::AvgPool2D<double>(2), Shape{2, 4, 6}, 2, "avg 2x2");
  require_gradients(telar::AvgPool2D<double>(3, 2, 1), Shape{2, 5, 6}, 2, "avg 3x3 s2 p1");
  require_gradients(telar::GlobalAvgPool<double>{}, Shape{3, 4, 5}, 2, "global avg");
  require_gradients(telar::GlobalAvgPool<double>{}, Shape{2, 2, 3, 2}, 2, "global avg 3-D");
  require_gradients(telar::Flatten<double>{}, Shape{2, 3, 4}, 2, "flatten");
}

TEST_CASE("MaxPool2D and AvgPool2D forward values", "[pool]") {
  // One channel 4x4 holding 0..15: 2x2 maxima 5 7 13 15, means 2.5 4.5 10.5 12.5.
  telar::Matrix<double> x("x", 1, 16);
  auto hx = Kokkos::create_mirror_view(x);
  for (int i = 0; i < 16; ++i)
    hx(0, i) = i;
  Kokkos::deep_copy(x, hx);
  telar::MaxPool2D<double> mp(2);
  telar::AvgPool2D<double> ap(2);
  mp.build(Shape{1, 4, 4});
  ap.build(Shape{1, 4, 4});
  telar::Matrix<double> ym("ym", 1, 4), ya("ya", 1, 4);
  telar::MaxPool2D<double>::saved_type sm;
  telar::NoSaved sa;
  mp.forward(Exec{}, x, ym, sm);
  ap.forward(Exec{}, x, ya, sa);
  auto hm = to_host(ym), ha = to_host(ya);
  double const wm[4] = {5, 7, 13, 15}, wa[4] = {2.5, 4.5, 10.5, 12.5};
  for (int i = 0; i < 4; ++i) {
    CHECK(hm(0, i) == wm[i]);
    CHECK(ha(0, i) == wa[i]);
  }
}

// 2 x 2 windows of stride 2 tiling the plane have their own kernels
// (layers/detail/maxpool_2x2.hpp): against a plain loop over each window
// (ties keep the first element in row-major order, a NaN never replaces a
// number, a NaN first stays), forward values and positions, and backward
// dy at each maximum and 0 elsewhere, exactly; then odd sizes (the general
// kernels) against the same loop. Both copies of the 2x2 kernels: the
// build's and, where the host has it, AVX-512's (16 windows a vector: rows
// of 1, 4, 16, 17 and 33 windows, so full vectors and every kind of tail).
TEST_CASE("2x2 max pooling: ties, NaN and gradients as a plain loop gives them", "[pool]") {
  using telar::detail::HostSimd;
  HostSimd& choice = telar::detail::host_simd_choice();
  HostSimd const before = choice;
  auto const copy = GENERATE(HostSimd::baseline, HostSimd::avx512);
  if (copy == HostSimd::avx512 && telar::detail::host_simd_available() != copy)
    SKIP("no AVX-512 copy here (another CPU or compiler, or TELAR_HOST_SIMD)");
  choice = copy;
  for (auto [c, h, w] : {std::array<std::size_t, 3>{3, 6, 8},
                         {2, 5, 7},
                         {2, 4, 2},
                         {1, 2, 32},
                         {2, 4, 34},
                         {1, 2, 66}}) {
    INFO(c << "x" << h << "x" << w << (copy == HostSimd::avx512 ? ", AVX-512" : ", build's"));
    std::size_t const n = 2, ho = h / 2, wo = w / 2, in = c * h * w, out = c * ho * wo;
    telar::Matrix<float> x("x", n, in), y("y", n, out), dy("dy", n, out), dx("dx", n, in);
    auto hx = Kokkos::create_mirror_view(x);
    auto hdy = Kokkos::create_mirror_view(dy);
    for (std::size_t i = 0; i < hx.size(); ++i) // values 0, 1, 2 at random: many ties
      hx.data()[i] = float((std::uint32_t(i) * 2654435761u >> 13) % 3);
    hx(0, 1) = std::nanf(""); // second of its window: never the maximum
    hx(1, 0) = std::nanf(""); // first of its window: stays
    for (std::size_t i = 0; i < hdy.size(); ++i)
      hdy.data()[i] = float(i + 1);
    Kokkos::deep_copy(x, hx);
    Kokkos::deep_copy(dy, hdy);
    telar::MaxPool2D<float> mp(2);
    mp.build(Shape{c, h, w});
    telar::MaxPool2D<float>::saved_type saved;
    Kokkos::deep_copy(dx, -5.f); // overwritten
    mp.forward(Exec{}, x, y, saved);
    mp.backward_input(Exec{}, dy, dx, saved);
    auto hy = to_host(y), hdx = to_host(dx);
    std::vector<float> want_dx(n * in, 0.f);
    bool same_y = true;
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t k = 0; k < c; ++k)
        for (std::size_t oh = 0; oh < ho; ++oh)
          for (std::size_t ow = 0; ow < wo; ++ow) {
            std::size_t best = (k * h + 2 * oh) * w + 2 * ow;
            for (std::size_t a = 0; a < 2; ++a)
              for (std::size_t b = 0; b < 2; ++b) {
                std::size_t const at = (k * h + 2 * oh + a) * w + 2 * ow + b;
                if (hx(s, at) > hx(s, best))
                  best = at;
              }
            std::size_t const o = (k * ho + oh) * wo + ow;
            float const got = hy(s, o), want = hx(s, best);
            same_y &= std::isnan(want) ? std::isnan(got) : got == want;
            want_dx[s * in + best] = hdy(s, o);
          }
    CHECK(same_y);
    CHECK(std::isnan(hy(1, 0)));
    CHECK(!std::isnan(hy(0, 0)));
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n * in; ++i)
      wrong += hdx.data()[i] != want_dx[i];
    CHECK(wrong == 0);
  }
  choice = before;
}

TEST_CASE("Conv and pooling layers report shape errors", "[conv][pool]") {
  auto message = [](auto const& layer, Shape in) -> std::string {
    try {
      (void)layer.output_shape(in);
    } catch (telar::ShapeError const& e) {
      return e.what();
    }
    return "no error";
  };
  CHECK(message(telar::Conv2D<float>(3, 8, 3), Shape{1, 28, 28})
            .find("Conv2D expects inputs [3, H, W]") == 0);
  CHECK(message(telar::Conv2D<float>(3, 8, 3), Shape{3 * 28 * 28})
            .find("Conv2D expects inputs [3, H, W]") == 0);
  CHECK(message(telar::Conv2D<float>(3, 8, 5), Shape{3, 4, 9}).find("cover the kernel (5)") !=
        std::string::npos);
  CHECK(message(telar::Conv3D<float>(2, 8, 3), Shape{2, 8, 8})
            .find("Conv3D expects inputs [2, D, H, W]") == 0);
  CHECK(message(telar::MaxPool2D<float>(2), Shape{16}).find("MaxPool2D expects inputs [C, H, W]") ==
        0);
  CHECK(message(telar::AvgPool2D<float>(4), Shape{1, 3, 8}).find("AvgPool2D expects inputs") == 0);
  CHECK(message(telar::GlobalAvgPool<float>{}, Shape{10}).find("GlobalAvgPool expects") == 0);
  CHECK(message(telar::ConvTranspose2D<float>(3, 4, 3, 2, 0, 2), Shape{3, 5, 5}) ==
        "ConvTranspose2D: output_padding (2) must be smaller than stride (2) or dilation (1)");
  CHECK(message(telar::ConvTranspose2D<float>(3, 4, 3), Shape{4, 5, 5})
            .find("ConvTranspose2D expects inputs [3, H, W]") == 0);
  CHECK(message(telar::ConvTranspose3D<float>(3, 4, 1, 1, 1), Shape{3, 1, 2, 2})
            .find("whose output is not empty") != std::string::npos);
  auto group_error = [](auto make) -> std::string {
    try {
      make();
    } catch (telar::ShapeError const& e) {
      return e.what();
    }
    return "no error";
  };
  CHECK(group_error([] { telar::Conv2D<float>(6, 4, 3, 1, 0, true, 1, 4); }) ==
        "Conv2D: in_channels (6) and out_channels (4) must be divisible by groups (4)");
  CHECK(group_error([] { telar::Conv3D<float>(4, 6, 3, 1, 0, true, 1, 4); }).find("Conv3D") == 0);
  CHECK(group_error([] { telar::ConvTranspose2D<float>(4, 6, 3, 1, 0, 0, true, 1, 4); }) ==
        "ConvTranspose2D: in_channels (4) and out_channels (6) must be divisible by groups (4)");
  CHECK(telar::ConvTranspose2D<float>(3, 4, 3, 2, 1, 1).output_shape(Shape{3, 7, 5}) ==
        (Shape{4, 14, 10}));
  CHECK(message(telar::Conv2D<float>(1, 4, 3, 1, 1), Shape{1, 28, 28}) == "no error");
  CHECK(telar::Conv2D<float>(1, 4, 3, 2, 1).output_shape(Shape{1, 28, 27}) == (Shape{4, 14, 14}));
  CHECK(telar::Conv3D<float>(1, 4, 3).output_shape(Shape{1, 5, 6, 7}) == (Shape{4, 3, 4, 5}));
  CHECK(telar::MaxPool2D<float>(2).output_shape(Shape{8, 7, 7}) == (Shape{8, 3, 3}));
  CHECK(telar::Flatten<float>{}.output_shape(Shape{8, 7, 7}) == telar::Shape(392));

  // A mismatched chain names the layer and what it expects.
  using Net = telar::Sequential<telar::Conv2D<float>, telar::ReLU<float>, telar::Conv2D<float>>;
  Net net(telar::Conv2D<float>(1, 4, 3, 1, 1), {}, telar::Conv2D<float>(3, 4, 3));
  bool threw = false;
  try {
    net.build(Shape{1, 8, 8});
  } catch (telar::ShapeError const& e) {
    threw = std::string(e.what()).find("Conv2D expects inputs [3, H, W]") != std::string::npos;
  }
  CHECK(threw);
}

TEST_CASE("A small CNN in a Sequential checks out", "[conv][fd]") {
  using T = double;
  using Net = telar::Sequential<telar::Conv2D<T>, telar::ReLU<T>, telar::MaxPool2D<T>,
                                telar::Conv2D<T>, telar::GlobalAvgPool<T>>;
  Net net(telar::Conv2D<T>(1, 3, 3, 1, 1), {}, telar::MaxPool2D<T>(2),
          telar::Conv2D<T>(3, 2, 3, 1, 1), {});
  auto const report = telar::check_gradients(net, Shape{1, 6, 6}, 2);
  INFO(report.str());
  CHECK(report.passed(1e-6));
}
