// Convolution policies: oneDNN's primitives (telar::OneDnnConv) against the
// portable im2col + GEMM path (telar::Im2colConv) in float, forward, input
// and weight gradients (accumulated), over 2-D and 3-D geometries and batch
// sizes; AutoConv's choice. oneDNN has no f64 convolutions: the finite-
// difference checks in double stay on the portable path (test_conv.cpp).
// The oneDNN cases are templates over the memory space (one type: the
// default), so that `if constexpr` discards them where oneDNN cannot run (a
// CUDA build) instead of instantiating oneDNN layers there.
#include "support.hpp"

#include <telar/core/branches.hpp>
#include <telar/core/gemm.hpp>
#include <telar/core/recompute.hpp>
#include <telar/core/sequential.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/conv_transpose.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/parallel/precision.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using telar::Shape;
using telar::test::Exec;
using telar::test::random_matrix;
using telar::test::to_host;
using M = telar::DefaultMemorySpace;

namespace {

// Largest |a - b| / (1 + |b|) over two views of the same size.
template <class A, class B>
double worst(A const& a, B const& b) {
  auto ha = to_host(a);
  auto hb = to_host(b);
  REQUIRE(ha.size() == hb.size());
  double w = 0;
  for (std::size_t i = 0; i < ha.size(); ++i)
    w = std::max(w, std::fabs(double(ha.data()[i]) - double(hb.data()[i])) /
                        (1.0 + std::fabs(double(hb.data()[i]))));
  return w;
}

// Runs forward, backward_input and backward_weight twice (gradients must
// accumulate) on layers a and b made by make(), and compares everything.
template <class A, class B, class Make>
void compare(Make make, Shape in, std::size_t n, std::string const& what) {
  INFO(what << ", batch " << n);
  A a = make(A{});
  B b = make(B{});
  a.build(in), b.build(in);
  a.initialize(7), b.initialize(7);
  std::size_t const out = a.output_shape(in).size();
  auto x = random_matrix<float>(n, in.size(), 11);
  auto dy = random_matrix<float>(n, out, 12);
  telar::Matrix<float> ya("ya", n, out), yb("yb", n, out), dxa("dxa", n, in.size()),
      dxb("dxb", n, in.size());
  typename A::saved_type sa;
  typename B::saved_type sb;
  for (int rep = 0; rep < 2; ++rep) {
    Kokkos::deep_copy(dxa, 3.f); // overwritten, not accumulated
    Kokkos::deep_copy(dxb, -3.f);
    a.forward(Exec{}, x, ya, sa);
    b.forward(Exec{}, x, yb, sb);
    a.backward_input(Exec{}, dy, dxa, sa);
    b.backward_input(Exec{}, dy, dxb, sb);
    a.backward_weight(Exec{}, dy, sa);
    b.backward_weight(Exec{}, dy, sb);
    Exec{}.fence();
    CHECK(worst(ya, yb) < 1e-5);
    CHECK(worst(dxa, dxb) < 1e-5);
    CHECK(worst(a.weight_grad, b.weight_grad) < 1e-4);
    if (a.has_bias())
      CHECK(worst(a.bias_grad, b.bias_grad) < 1e-4);
  }
}

// bf16 layer a against fp32 layer b (im2col + GEMM), element by element:
// with inputs rounded to bf16 (unit roundoff u = 2^-8) and fp32 sums, each
// result is off by at most (2u + u^2) times the same sum over absolute
// values (plus fp32 summation error, bounded by 2^-16 of it for these
// sizes), which layer b computes on |x|, |W|, |dy|.
template <class A, class B, class Make>
void compare_bf16(Make make, Shape in, std::size_t n, std::string const& what) {
  INFO(what << ", batch " << n << " (bf16)");
  A a = make(A{});
  B b = make(B{}), mag = make(B{});
  a.build(in), b.build(in), mag.build(in);
  a.initialize(7), b.initialize(7), mag.initialize(7);
  auto absolute = [](auto const& v) {
    auto h = to_host(v);
    for (std::size_t i = 0; i < h.size(); ++i)
      h.data()[i] = std::fabs(h.data()[i]);
    Kokkos::deep_copy(v, h);
  };
  absolute(mag.weight);
  if (mag.has_bias())
    absolute(mag.bias);
  std::size_t const out = a.output_shape(in).size();
  auto x = random_matrix<float>(n, in.size(), 11);
  auto dy = random_matrix<float>(n, out, 12);
  auto ax = random_matrix<float>(n, in.size(), 11);
  auto ady = random_matrix<float>(n, out, 12);
  absolute(ax), absolute(ady);
  telar::Matrix<float> ya("ya", n, out), yb("yb", n, out), ym("ym", n, out),
      dxa("dxa", n, in.size()), dxb("dxb", n, in.size()), dxm("dxm", n, in.size());
  typename A::saved_type sa;
  typename B::saved_type sb, sm;
  a.forward(Exec{}, x, ya, sa);
  b.forward(Exec{}, x, yb, sb);
  mag.forward(Exec{}, ax, ym, sm);
  a.backward_input(Exec{}, dy, dxa, sa);
  b.backward_input(Exec{}, dy, dxb, sb);
  mag.backward_input(Exec{}, ady, dxm, sm);
  a.backward_weight(Exec{}, dy, sa);
  b.backward_weight(Exec{}, dy, sb);
  mag.backward_weight(Exec{}, ady, sm);
  Exec{}.fence();
  double const u = std::ldexp(1.0, -8), rel = 2 * u + u * u + std::ldexp(1.0, -16);
  // Largest |a - b| / (rel |m| + tiny): at most 1 when the bound holds.
  auto ratio = [rel](auto const& va, auto const& vb, auto const& vm) {
    auto ha = to_host(va);
    auto hb = to_host(vb);
    auto hm = to_host(vm);
    double r = 0;
    for (std::size_t i = 0; i < ha.size(); ++i)
      r = std::max(r, std::fabs(double(ha.data()[i]) - double(hb.data()[i])) /
                          (rel * std::fabs(double(hm.data()[i])) + 1e-6));
    return r;
  };
  CHECK(ratio(ya, yb, ym) <= 1.0);
  CHECK(ratio(dxa, dxb, dxm) <= 1.0);
  CHECK(ratio(a.weight_grad, b.weight_grad, mag.weight_grad) <= 1.0);
  if (a.has_bias())
    CHECK(ratio(a.bias_grad, b.bias_grad, mag.bias_grad) <= 1.0); // sums of bf16 dy: u
  CHECK(worst(ya, yb) > 0);                                       // bf16 really ran
}

// Whether two views hold the same bytes.
template <class A, class B>
bool same_bits(A const& a, B const& b) {
  auto ha = to_host(a);
  auto hb = to_host(b);
  return ha.size() == hb.size() &&
         std::memcmp(ha.data(), hb.data(), ha.size() * sizeof(*ha.data())) == 0;
}

// oneDNN's backward_weight reads the x and dy that forward and
// backward_input converted for its micro-batch (detail/onednn_conv.hpp):
// its gradients must equal, bit for bit, those of a layer that converts them
// again (another micro-batch's calls in between leave nothing to reuse), and
// with two micro-batches in flight each must get its own inputs, whichever
// ran last (a cache per layer alone would give one the other's).
template <class L, class Make>
void check_reuse(Make make, Shape in, std::size_t n, std::string const& what) {
  INFO(what << ", batch " << n);
  auto fresh = [&] {
    L l = make(L{});
    l.build(in);
    l.initialize(7);
    return l;
  };
  std::size_t const out = fresh().output_shape(in).size();
  auto x1 = random_matrix<float>(n, in.size(), 21);
  auto x2 = random_matrix<float>(n, in.size(), 22);
  auto dy1 = random_matrix<float>(n, out, 23);
  auto dy2 = random_matrix<float>(n, out, 24);
  telar::Matrix<float> y("y", n, out), dx("dx", n, in.size());
  using S = typename L::saved_type;
  auto same_grads = [](L const& a, L const& b) {
    CHECK(same_bits(a.weight_grad, b.weight_grad));
    CHECK(same_bits(a.bias_grad, b.bias_grad));
  };
  // One micro-batch: everything reused, the weight gradient after the input
  // gradient or before it (pipelines' non-split schedules).
  auto alone = [&](auto const& x, auto const& dy, bool weight_first = false) {
    L l = fresh();
    S s;
    l.forward(Exec{}, x, y, s);
    if (weight_first)
      l.backward_weight(Exec{}, dy, s);
    l.backward_input(Exec{}, dy, dx, s);
    if (!weight_first)
      l.backward_weight(Exec{}, dy, s);
    return l;
  };
  L const a1 = alone(x1, dy1), a2 = alone(x2, dy2);
  same_grads(a1, alone(x1, dy1, true));
  // Converted again in backward_weight: what every call did before.
  L r = fresh();
  S r1, r2;
  r.forward(Exec{}, x1, y, r1);
  r.backward_input(Exec{}, dy1, dx, r1);
  r.forward(Exec{}, x2, y, r2);
  r.backward_input(Exec{}, dy2, dx, r2);
  r.backward_weight(Exec{}, dy1, r1);
  same_grads(a1, r);
  // Two in flight, the second's forward and the first's backward_input last.
  L c = fresh();
  S c1, c2;
  c.forward(Exec{}, x1, y, c1);
  c.forward(Exec{}, x2, y, c2);
  c.backward_input(Exec{}, dy2, dx, c2);
  c.backward_input(Exec{}, dy1, dx, c1);
  c.backward_weight(Exec{}, dy2, c2);
  same_grads(a2, c);
  Kokkos::deep_copy(c.weight_grad, 0.f);
  Kokkos::deep_copy(c.bias_grad, 0.f);
  c.backward_weight(Exec{}, dy1, c1);
  same_grads(a1, c);
  CHECK(!same_bits(a1.weight_grad, a2.weight_grad)); // the inputs do matter
}

// Scoped environment variable for the ISA test hooks.
struct ScopedEnv {
  std::string name;
  ScopedEnv(char const* n, char const* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

} // namespace

TEST_CASE("AutoConv picks oneDNN for float on the host when available", "[conv][policy]") {
  using F = telar::AutoConv::select<float, M>;
  using D = telar::AutoConv::select<double, M>;
  CHECK(std::is_same_v<D, telar::Im2colConv>);
  CHECK(std::string(telar::conv_backend_name<double, M>()) == "im2col");
  if constexpr (TELAR_HAVE_ONEDNN && Kokkos::SpaceAccessibility<Kokkos::HostSpace, M>::accessible) {
    CHECK(std::is_same_v<F, telar::OneDnnConv>);
    CHECK(std::is_same_v<telar::Conv2D<float>::conv_policy, telar::OneDnnConv>);
  } else {
    CHECK(std::is_same_v<F, telar::Im2colConv>);
  }
  CHECK(std::is_same_v<telar::Conv2D<double>::conv_policy, telar::Im2colConv>);
}

#if TELAR_HAVE_ONEDNN
TEMPLATE_TEST_CASE("oneDNN Conv2D equals im2col + GEMM in float", "[conv][policy]", M) {
  using M = TestType; // dependent: discarded where oneDNN cannot run
  if constexpr (telar::OneDnnConv::supports<float, M>()) {
    using A = telar::Conv2D<float, M, telar::AutoGemm, telar::OneDnnConv>;
    using B = telar::Conv2D<float, M, telar::AutoGemm, telar::Im2colConv>;
    using E = telar::Conv2D<float>::Extents;
    struct Case {
      std::size_t C, Co;
      E k, s, p, d;
      bool bias;
      Shape in;
      char const* what;
    };
    for (Case const& c :
         {Case{1,
               8,
               {3, 3},
               {1, 1},
               {1, 1},
               {1, 1},
               true,
               Shape{1, 9, 9},
               "1->8 3x3 p1 (first layer)"},
          Case{5, 7, {3, 3}, {1, 1}, {1, 1}, {1, 1}, true, Shape{5, 6, 7}, "3x3 s1 p1"},
          Case{3, 4, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true, Shape{3, 7, 6}, "3x3 s2 p1"},
          Case{4,
               6,
               {3, 3},
               {2, 2},
               {0, 0},
               {1, 1},
               false,
               Shape{4, 8, 9},
               "3x3 s2 p0 no bias, rows left over"},
          Case{6, 3, {1, 1}, {1, 1}, {0, 0}, {1, 1}, true, Shape{6, 4, 5}, "1x1"},
          Case{2, 5, {2, 2}, {1, 1}, {0, 0}, {2, 2}, true, Shape{2, 6, 5}, "2x2 dilation 2"},
          Case{2, 3, {1, 3}, {1, 2}, {0, 1}, {1, 1}, true, Shape{2, 4, 7}, "1x3 stride (1,2)"},
          Case{32,
               32,
               {3, 3},
               {1, 1},
               {1, 1},
               {1, 1},
               true,
               Shape{32, 14, 14},
               "CNN 32->32 14x14"}}) {
      auto make = [&c](auto l) { return decltype(l)(c.C, c.Co, c.k, c.s, c.p, c.bias, c.d); };
      for (std::size_t n : {std::size_t(1), std::size_t(3)})
        compare<A, B>(make, c.in, n, c.what);
    }
  }
}

TEMPLATE_TEST_CASE("oneDNN Conv3D equals im2col + GEMM in float", "[conv][policy]", M) {
  using M = TestType; // dependent: discarded where oneDNN cannot run
  if constexpr (telar::OneDnnConv::supports<float, M>()) {
    using A = telar::Conv3D<float, M, telar::AutoGemm, telar::OneDnnConv>;
    using B = telar::Conv3D<float, M, telar::AutoGemm, telar::Im2colConv>;
    compare<A, B>([](auto l) { return decltype(l)(2, 3, 3, 1, 1); }, Shape{2, 3, 4, 5}, 2,
                  "3x3x3 s1 p1");
    compare<A, B>([](auto l) { return decltype(l)(3, 4, 2, 2, 0, false); }, Shape{3, 4, 5, 4}, 2,
                  "2x2x2 s2 p0 no bias");
  }
}

TEMPLATE_TEST_CASE("oneDNN Conv2D keeps primitives per batch size and in copies", "[conv][policy]",
                   M) {
  using M = TestType; // dependent: discarded where oneDNN cannot run
  if constexpr (telar::OneDnnConv::supports<float, M>()) {
    using A = telar::Conv2D<float, M, telar::AutoGemm, telar::OneDnnConv>;
    using B = telar::Conv2D<float, M, telar::AutoGemm, telar::Im2colConv>;
    auto make = [](auto l) { return decltype(l)(3, 4, 3, 1, 1); };
    // Several batch sizes through one layer (training, evaluation, remainder),
    // more than the cache holds, then back.
    A a = make(A{});
    B b = make(B{});
    Shape const in{3, 5, 5};
    a.build(in), b.build(in);
    a.initialize(2), b.initialize(2);
    A copy = a; // a copy starts with no primitives and shares none
    for (std::size_t n : {4, 2, 7, 1, 5, 4, 2}) {
      INFO("batch " << n);
      auto x = random_matrix<float>(n, in.size(), n);
      telar::Matrix<float> ya("ya", n, 4 * 25), yb("yb", n, 4 * 25), yc("yc", n, 4 * 25);
      typename A::saved_type sa, sc;
      typename B::saved_type sb;
      a.forward(Exec{}, x, ya, sa);
      b.forward(Exec{}, x, yb, sb);
      copy.forward(Exec{}, x, yc, sc);
      CHECK(worst(ya, yb) < 1e-5);
      CHECK(worst(yc, yb) < 1e-5);
    }
  }
}

TEMPLATE_TEST_CASE("A float CNN trains the same with oneDNN and im2col convolutions",
                   "[conv][policy]", M) {
  using M = TestType; // dependent: discarded where oneDNN cannot run
  if constexpr (telar::OneDnnConv::supports<float, M>()) {
    using T = float;
    auto run = [](auto conv) {
      using C = decltype(conv);
      using Net = telar::Sequential<C, telar::ReLU<T>, telar::MaxPool2D<T>, C>;
      Net net(C(1, 4, 3, 1, 1), {}, telar::MaxPool2D<T>(2), C(4, 2, 3, 1, 1));
      Shape const in{1, 8, 8};
      net.build(in);
      net.initialize(5);
      auto x = random_matrix<T>(3, in.size(), 1);
      auto dy = random_matrix<T>(3, 2 * 16, 2);
      telar::Matrix<T> y("y", 3, 2 * 16), dx("dx", 3, in.size());
      typename Net::saved_type saved;
      net.forward(Exec{}, x, y, saved);
      net.backward_input(Exec{}, dy, dx, saved);
      net.backward_weight(Exec{}, dy, saved);
      Exec{}.fence();
      auto const& first = std::get<0>(net.layers());
      return std::make_pair(to_host(y), to_host(first.weight_grad));
    };
    auto a = run(telar::Conv2D<T, M, telar::AutoGemm, telar::OneDnnConv>{});
    auto b = run(telar::Conv2D<T, M, telar::AutoGemm, telar::Im2colConv>{});
    CHECK(worst(a.first, b.first) < 1e-5);
    CHECK(worst(a.second, b.second) < 1e-4);
  }
}

TEMPLATE_TEST_CASE("oneDNN grouped and depthwise convolutions equal im2col + GEMM",
                   "[conv][policy][groups]", M) {
  using M = TestType; // dependent: discarded where oneDNN cannot run
  if constexpr (telar::OneDnnConv::supports<float, M>()) {
    using A2 = telar::Conv2D<float, M, telar::AutoGemm, telar::OneDnnConv>;
    using B2 = telar::Conv2D<float, M, telar::AutoGemm, telar::Im2colConv>;
    compare<A2, B2>([](auto l) { return decltype(l)(4, 6, 3, 1, 1, true, 1, 2); }, Shape{4, 6, 7},
                    2, "2 groups 3x3 p1");
    compare<A2, B2>([](auto l) { return decltype(l)(8, 8, 3, 2, 1, false, 1, 8); }, Shape{8, 9, 8},
                    3, "depthwise 3x3 s2 p1 no bias");
    compare<A2, B2>([](auto l) { return decltype(l)(6, 12, 1, 1, 0, true, 1, 3); }, Shape{6, 4, 5},
                    2, "3 groups 1x1");
    compare<A2, B2>([](auto l) { return decltype(l)(16, 24, 3, 1, 1, true, 1, 2); },
                    Shape{16, 6, 5}, 2, "2 groups of 8 -> 12");
    using A3 = telar::Conv3D<float, M, telar::AutoGemm, telar::OneDnnConv>;
    using B3 = telar::Conv3D<float, M, telar::AutoGemm, telar::Im2colConv>;
    compare<A3, B3>([](auto l) { return decltype(l)(4, 4, 3, 1, 1, true, 1, 4); },
                    Shape{4, 3, 4, 5}, 2, "3-D depthwise");
  }
}

TEMPLATE_TEST_CASE("oneDNN transposed convolutions equal im2col + GEMM",
                   "[conv][policy][transpose]", M) {
  using M = TestType; // dependent: discarded where oneDNN cannot run
  if constexpr (telar::OneDnnConv::supports<float, M>()) {
    using A2 = telar::ConvTranspose2D<float, M, telar::AutoGemm, telar::OneDnnConv>;
    using B2 = telar::ConvTranspose2D<float, M, telar::AutoGemm, telar::Im2colConv>;
    compare<A2, B2>([](auto l) { return decltype(l)(6, 4, 3, 2, 1, 1); }, Shape{6, 5, 4}, 2,
                    "3x3 s2 p1 op1");
    compare<A2, B2>([](auto l) { return decltype(l)(4, 6, 2, 2, 0, 0, false, 1, 2); },
                    Shape{4, 4, 3}, 3, "2x2 s2 2 groups no bias");
    compare<A2, B2>([](auto l) { return decltype(l)(3, 2, 2, 2, 1, 2, true, 3); }, Shape{3, 3, 4},
                    2, "s2 d3 op2 (im2col fallback)");
    using A3 = telar::ConvTranspose3D<float, M, telar::AutoGemm, telar::OneDnnConv>;
    using B3 = telar::ConvTranspose3D<float, M, telar::AutoGemm, telar::Im2colConv>;
    compare<A3, B3>([](auto l) { return decltype(l)(3, 2, 2, 2, 0, 1); }, Shape{3, 2, 3, 2}, 2,
                    "3-D 2x2x2 s2 op1");
  }
}

namespace {
// Convolutions of policy C with GEMM policy G, in bf16, against fp32 im2col
// on the shapes that matter: a first layer, the CNN's, strided without
// bias, depthwise, 3-D, transposed.
template <class G, class C, class M>
void bf16_convolutions() {
  using A2 = telar::Conv2D<float, M, G, C>;
  using B2 = telar::Conv2D<float, M, telar::AutoGemm, telar::Im2colConv>;
  compare_bf16<A2, B2>([](auto l) { return decltype(l)(1, 8, 3, 1, 1); }, Shape{1, 9, 9}, 3,
                       "1->8 3x3 p1 (first layer)");
  compare_bf16<A2, B2>([](auto l) { return decltype(l)(32, 32, 3, 1, 1); }, Shape{32, 14, 14}, 2,
                       "CNN 32->32 14x14");
  compare_bf16<A2, B2>([](auto l) { return decltype(l)(4, 6, 3, 2, 0, false); }, Shape{4, 8, 9}, 3,
                       "3x3 s2 p0 no bias");
  compare_bf16<A2, B2>([](auto l) { return decltype(l)(8, 8, 3, 1, 1, true, 1, 8); },
                       Shape{8, 6, 6}, 2, "depthwise");
  using A3 = telar::Conv3D<float, M, G, C>;
  using B3 = telar::Conv3D<float, M, telar::AutoGemm, telar::Im2colConv>;
  compare_bf16<A3, B3>([](auto l) { return decltype(l)(2, 3, 3, 1, 1); }, Shape{2, 3, 4, 5}, 2,
                       "3x3x3 s1 p1");
  using AT = telar::ConvTranspose2D<float, M, G, C>;
  using BT = telar::ConvTranspose2D<float, M, telar::AutoGemm, telar::Im2colConv>;
  compare_bf16<AT, BT>([](auto l) { return decltype(l)(6, 4, 3, 2, 1, 1); }, Shape{6, 5, 4}, 2,
                       "transposed 3x3 s2 p1 op1");
}
} // namespace

TEMPLATE_TEST_CASE("OneDnnConvBf16 agrees with fp32 within bf16 rounding", "[conv][policy][bf16]",
                   M) {
  using M = TestType; // dependent: discarded where oneDNN cannot run
  if constexpr (telar::OneDnnConvBf16::supports<float, M>()) {
    if (!telar::bf16_available()) {
      SKIP("no AVX512-BF16/AMX on this CPU");
    }
    bf16_convolutions<telar::AutoGemm, telar::OneDnnConvBf16, M>();
    std::string const kernels = telar::bf16_kernels();
    INFO(kernels);
    CHECK(kernels.find("conv_fwd:") != std::string::npos);
    CHECK(kernels.find("conv_bwd_data:") != std::string::npos);
    CHECK(kernels.find("conv_bwd_weights:") != std::string::npos);
  }
}

// The bf16 convolution of CUDA memory (what Precision<bf16, float> rebinds
// to there, telar::bf16_conv_policy_t): im2col, and every GEMM the layer's
// Bf16Gemm (cuBLAS on the GPU; oneDNN's bf16 matmul here, so that the
// same path is checked on the host). The same bound as oneDNN's primitives.
TEMPLATE_TEST_CASE("im2col convolutions under Bf16Gemm agree with fp32 within bf16 rounding",
                   "[conv][policy][bf16]", M) {
  using M = TestType; // dependent: discarded where Bf16Gemm cannot run
  if constexpr (telar::bf16_layers_supported<float, M>()) {
    if (!telar::bf16_available<M>())
      SKIP("no bf16 instructions here");
    bf16_convolutions<telar::Bf16Gemm, telar::Im2colConv, M>();
  }
}

TEMPLATE_TEST_CASE(
    "oneDNN's backward_weight reuses its micro-batch's converted inputs, bit for bit",
    "[conv][policy][bf16]", M) {
  using M = TestType; // dependent: discarded where oneDNN cannot run
  if constexpr (telar::OneDnnConvBf16::supports<float, M>()) {
    auto run = [](auto policy) {
      using P = decltype(policy);
      using C2 = telar::Conv2D<float, M, telar::AutoGemm, P>;
      using T2 = telar::ConvTranspose2D<float, M, telar::AutoGemm, P>;
      using C3 = telar::Conv3D<float, M, telar::AutoGemm, P>;
      check_reuse<C2>([](auto l) { return decltype(l)(1, 8, 3, 1, 1); }, Shape{1, 9, 9}, 3,
                      "1->8 3x3 p1 (first layer)");
      check_reuse<C2>([](auto l) { return decltype(l)(32, 32, 3, 1, 1); }, Shape{32, 14, 14}, 2,
                      "32->32 14x14");
      check_reuse<C2>([](auto l) { return decltype(l)(4, 6, 3, 2, 0, false); }, Shape{4, 8, 9}, 3,
                      "3x3 s2 p0 no bias");
      check_reuse<C2>([](auto l) { return decltype(l)(16, 16, 3, 1, 1, true, 1, 16); },
                      Shape{16, 6, 6}, 2, "depthwise");
      check_reuse<C3>([](auto l) { return decltype(l)(16, 16, 3, 1, 1); }, Shape{16, 3, 4, 5}, 2,
                      "3x3x3 s1 p1");
      check_reuse<T2>([](auto l) { return decltype(l)(32, 16, 3, 2, 1, 1); }, Shape{32, 5, 4}, 2,
                      "transposed 3x3 s2 p1 op1");
    };
    run(telar::OneDnnConv{});
    if (!telar::bf16_available()) {
      SKIP("no AVX512-BF16/AMX on this CPU");
    }
    run(telar::OneDnnConvBf16{});
  }
}

#if TELAR_HAVE_ONEDNN
// The reuse itself: backward_weights takes x from forward and dy from
// backward_data only while their buffers hold what they converted for the
// same call id from the same pointers.
TEST_CASE("oneDNN's convolution cache reuses converted inputs only for the same call",
          "[conv][policy][bf16]") {
  if (!telar::bf16_available()) {
    SKIP("no AVX512-BF16/AMX on this CPU");
  }
  telar::detail::ConvGeometry g;
  g.C = g.Co = 16;
  telar::detail::conv_set_dim(g, 1, 6, 3, 1, 1, 1, 6);
  telar::detail::conv_set_dim(g, 2, 6, 3, 1, 1, 1, 6);
  std::size_t const n = 2, act = n * 16 * 36;
  std::vector<float> x(act, 0.5f), x2(act, 0.25f), w(16 * 16 * 9, 0.125f), b(16, 1.f), y(act),
      dy(act, 1.f), dx(act), dw(w.size()), db(b.size());
  telar::detail::OneDnnConvCache c(true);
  auto weights = [&](float const* xp, float const* dyp, std::uint64_t call) {
    c.backward_weights(g, n, xp, dyp, dw.data(), db.data(), call);
  };
  c.forward(g, n, x.data(), w.data(), b.data(), y.data(), 5);
  c.backward_data(g, n, dy.data(), w.data(), dx.data(), true, 5);
  weights(x.data(), dy.data(), 5);
  CHECK(c.reused() == 2);
  weights(x.data(), dy.data(), 6); // another micro-batch's
  weights(x.data(), dy.data(), 0); // no id
  weights(dy.data(), x.data(), 5); // other buffers
  CHECK(c.reused() == 2);
  c.forward(g, n, x2.data(), w.data(), b.data(), y.data(), 7); // x's copy overwritten
  weights(x.data(), dy.data(), 5);
  CHECK(c.reused() == 3); // dy only
  // The weight gradient first (pipelines' non-split schedules): x from
  // forward, then backward_data takes dy from backward_weights.
  c.forward(g, n, x.data(), w.data(), b.data(), y.data(), 8);
  weights(x.data(), dy.data(), 8);
  CHECK(c.reused() == 4);
  c.backward_data(g, n, dy.data(), w.data(), dx.data(), true, 8);
  CHECK(c.reused() == 5);
}

// The two-step conversion of activations (core/detail/onednn_staged.hpp)
// against oneDNN's one reorder: the same words, padding included, for
// channels that do not fill a block, a batch that is not a multiple of the
// samples staged at a time, 3-D tensors, and values that round specially
// (ties, subnormals, infinities, NaN, -0).
TEST_CASE("oneDNN's staged conversion of activations gives its one reorder's words",
          "[conv][policy][bf16]") {
  if (!telar::bf16_available()) {
    SKIP("no AVX512-BF16/AMX on this CPU");
  }
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  auto& eng = telar::detail::onednn_engine();
  auto& s = telar::detail::onednn_stream();
  auto check = [&](dnnl::memory::dims const& d, tag plain, tag blocked) {
    INFO("dims " << d.size() << "-D, batch " << d[0] << ", channels " << d[1]);
    dnnl::memory::desc const from(d, dt::f32, plain), to(d, dt::bf16, blocked);
    auto staged = telar::detail::OneDnnStagedInput::make(eng, from, to, d, plain);
    REQUIRE(staged);
    std::size_t const n = from.get_size() / sizeof(float);
    std::vector<float> x(n);
    float const special[] = {1.f + 0x1p-8f, 1.f + 0x3p-8f, 1e-40f, -1e-40f, 0x1p-126f,
                             INFINITY,      -INFINITY,     NAN,    -0.f,    3.4e38f};
    for (std::size_t i = 0; i < n; ++i)
      x[i] = i % 7 == 0 ? special[(i / 7) % 10] : std::sin(float(i)) * float(1 + i % 1000);
    std::vector<std::uint16_t> want(to.get_size() / 2, 0x5555), got(want.size(), 0xaaaa);
    dnnl::memory src(from, eng, x.data()), dst(to, eng, want.data());
    dnnl::reorder(src, dst).execute(s, src, dst);
    staged->run(s, x.data(), got.data());
    s.wait();
    CHECK(got == want);
  };
  // The first fills the staging buffer with values; the second's padding
  // then lies where they were (2 samples at a time, then 1).
  check({128, 32, 14, 14}, tag::abcd, tag::aBcd16b);
  check({7, 20, 40, 40}, tag::abcd, tag::aBcd16b);
  check({3, 8, 5, 6}, tag::abcd, tag::aBcd8b);
  check({5, 16, 3, 4, 5}, tag::abcde, tag::aBcde16b);
  // Not blocked, not bf16, not the plain layout: oneDNN's own reorder.
  dnnl::memory::dims const d{2, 16, 3, 3};
  using desc = dnnl::memory::desc;
  desc const f32(d, dt::f32, tag::abcd), bf16(d, dt::bf16, tag::aBcd16b);
  auto make = [&](desc const& a, desc const& b) {
    return telar::detail::OneDnnStagedInput::make(eng, a, b, d, tag::abcd);
  };
  CHECK(!make(f32, desc(d, dt::bf16, tag::abcd)));
  CHECK(!make(f32, desc(d, dt::f32, tag::aBcd16b)));
  CHECK(!make(desc(d, dt::f32, tag::acdb), bf16));
  CHECK(make(f32, bf16));
}
#endif

TEMPLATE_TEST_CASE("OneDnnConvBf16 refuses a CPU without bf16 instructions unless fp32 is asked "
                   "for",
                   "[conv][policy][bf16]", M) {
  using M = TestType; // dependent: discarded where oneDNN cannot run
  if constexpr (telar::OneDnnConvBf16::supports<float, M>()) {
    using A = telar::Conv2D<float, M, telar::AutoGemm, telar::OneDnnConvBf16>;
    using F = telar::Conv2D<float, M, telar::AutoGemm, telar::OneDnnConv>;
    Shape const in{3, 6, 6};
    A a(3, 4, 3, 1, 1);
    F f(3, 4, 3, 1, 1);
    a.build(in), f.build(in);
    a.initialize(3), f.initialize(3);
    auto x = random_matrix<float>(2, in.size(), 5);
    telar::Matrix<float> ya("ya", 2, 4 * 36), yf("yf", 2, 4 * 36);
    typename A::saved_type sa;
    typename F::saved_type sf;
    ScopedEnv hide("TELAR_TEST_HIDE_BF16", "1");
    try {
      a.forward(Exec{}, x, ya, sa);
      FAIL("no exception");
    } catch (telar::Error const& e) {
      CHECK(std::string(e.what()).find(
                "telar::Convolution (telar::OneDnnConvBf16): this CPU lacks the AVX512-BF16 "
                "(avx512_core_bf16) or AMX instruction set (hidden by TELAR_TEST_HIDE_BF16)") == 0);
    }
    // The opt-in fallback runs oneDNN's fp32 primitives: identical to OneDnnConv.
    ScopedEnv fallback("TELAR_BF16_FALLBACK", "fp32");
    A b(3, 4, 3, 1, 1); // fresh primitives
    b.build(in);
    b.initialize(3);
    typename A::saved_type sb;
    b.forward(Exec{}, x, ya, sb);
    f.forward(Exec{}, x, yf, sf);
    Exec{}.fence();
    CHECK(worst(ya, yf) == 0);
  }
}
#endif

// telar::Precision<bf16, float> rebinds a layer to exactly the layer written
// with the bf16 policies, keeping its configuration (here every setting of a
// transposed and a grouped, dilated convolution), so the two compute alike;
// containers (Concat, DenseConcat, Recompute) are rebuilt around their parts.
TEMPLATE_TEST_CASE("Precision<bf16, float> rebinds convolutions, keeping their configuration",
                   "[conv][policy][bf16]", M) {
  using M = TestType; // dependent: discarded where bf16 cannot compute
  if constexpr (!telar::bf16_layers_supported<float, M>()) {
    SKIP("no bf16 layers in this memory space (neither oneDNN nor cuBLAS)");
  } else {
    using P = telar::Precision<telar::bf16, float>;
    using C = telar::bf16_conv_policy_t<float, M>; // oneDNN's here, im2col's in CUDA memory
    static_assert(std::is_same_v<C, telar::OneDnnConvBf16> == telar::test::onednn_bf16_v<M>);
    using TF = telar::ConvTranspose2D<float, M>;
    using TB = telar::ConvTranspose2D<float, M, telar::Bf16Gemm, C>;
    using CF = telar::Conv2D<float, M>;
    using CB = telar::Conv2D<float, M, telar::Bf16Gemm, C>;
    using DB = telar::StaticDense<float, 6 * 4 * 4, 3, M, telar::Bf16Gemm>;
    static_assert(std::is_same_v<telar::WithPrecision<TF, P>, TB>);
    using Net =
        telar::Sequential<telar::Concat<CF, telar::Recompute<CF>>, telar::DenseConcat<CF>,
                          telar::Flatten<float>, telar::StaticDense<float, 6 * 4 * 4, 3, M>>;
    static_assert(
        std::is_same_v<telar::WithPrecision<Net, P>,
                       telar::Sequential<telar::Concat<CB, telar::Recompute<CB>>,
                                         telar::DenseConcat<CB>, telar::Flatten<float>, DB>>);
    Net const net(telar::Concat<CF, telar::Recompute<CF>>(CF(2, 1, 3, 1, 1),
                                                          telar::Recompute<CF>(CF(2, 1, 1))),
                  telar::DenseConcat<CF>(CF(2, 4, 3, 1, 2, true, 2)), {}, {});
    auto rebound = telar::with_precision<P>(net);
    auto plain = net;
    CHECK(rebound.build(Shape{2, 4, 4}) == plain.build(Shape{2, 4, 4}));
    CHECK(rebound.parameter_count() == plain.parameter_count());
    if (!telar::bf16_available<M>())
      SKIP("no bf16 instructions here");
    // The rebound layer against the one constructed with the bf16 policies.
    auto from = [](auto fp32, auto bf16) {
      return [fp32, bf16, first = true](auto) mutable {
        return std::exchange(first, false) ? telar::with_precision<P>(fp32) : bf16;
      };
    };
    compare<TB, TB>(from(TF(6, 4, 3, 2, 1, 1, false, 2, 2), TB(6, 4, 3, 2, 1, 1, false, 2, 2)),
                    Shape{6, 5, 4}, 2, "transposed 3x3 s2 p1 op1 dilation 2 groups 2, rebound");
    compare<CB, CB>(from(CF(4, 6, 3, 2, 1, true, 2, 2), CB(4, 6, 3, 2, 1, true, 2, 2)),
                    Shape{4, 9, 8}, 2, "grouped dilated 3x3 s2, rebound");
  }
}
