#include "support.hpp"

#include <telar/comm/detail/bf16_word.hpp>
#include <telar/core/gemm.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/conv_transpose.hpp>
#include <telar/layers/dense.hpp>
#include <telar/profile/launches.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>

using telar::test::random_matrix;
using telar::test::to_host;

namespace {
template <class T, class Policy>
void check_against_reference(Policy policy, char ta, char tb, std::size_t m, std::size_t n,
                             std::size_t k, T beta) {
  using telar::test::Exec;
  auto A = ta == 'N' ? random_matrix<T>(m, k, 1) : random_matrix<T>(k, m, 1);
  auto B = tb == 'N' ? random_matrix<T>(k, n, 2) : random_matrix<T>(n, k, 2);
  auto C = random_matrix<T>(m, n, 3);
  auto Cref = random_matrix<T>(m, n, 3);
  telar::gemm(policy, Exec{}, ta, tb, T(0.5), A, B, beta, C);
  telar::gemm(telar::ReferenceGemm{}, Exec{}, ta, tb, T(0.5), A, B, beta, Cref);
  auto h = to_host(C), r = to_host(Cref);
  double worst = 0;
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j)
      worst = std::max(worst, std::abs(double(h(i, j)) - double(r(i, j))));
  double const tol = std::is_same_v<T, float> ? 1e-4 * (k + 1) : 1e-11 * (k + 1);
  INFO(Policy::name() << " " << ta << tb << " m=" << m << " n=" << n << " k=" << k);
  CHECK(worst <= tol);
}
} // namespace

using Policies = std::tuple<telar::AutoGemm, telar::OneDnnGemm, telar::KokkosKernelsGemm>;

TEMPLATE_LIST_TEST_CASE("gemm policies agree with the reference kernel", "[gemm]", Policies) {
  auto run = [](auto t) {
    using T = decltype(t);
    if constexpr (TestType::template supports<T, telar::DefaultMemorySpace>()) {
      for (char ta : {'N', 'T'})
        for (char tb : {'N', 'T'})
          for (auto [m, n, k] : {std::tuple<int, int, int>{1, 1, 1},
                                 {7, 5, 3},
                                 {33, 17, 65},
                                 {64, 10, 128},
                                 {5, 9, 0}})
            for (T beta : {T(0), T(1), T(0.25)})
              check_against_reference<T>(TestType{}, ta, tb, m, n, k, beta);
    } else {
      SUCCEED("policy not available for this type in this build");
    }
  };
  run(float{});
  run(double{});
}

TEST_CASE("gemm works on row ranges of a matrix", "[gemm]") {
  using telar::test::Exec;
  auto A = random_matrix<float>(10, 6, 4);
  auto B = random_matrix<float>(6, 4, 5);
  telar::Matrix<float> C("C", 10, 4), Cref("Cref", 10, 4);
  telar::gemm(telar::AutoGemm{}, Exec{}, 'N', 'N', 1.f, telar::rows(A, 3, 8), B, 0.f,
              telar::rows(C, 3, 8));
  telar::gemm(telar::ReferenceGemm{}, Exec{}, 'N', 'N', 1.f, A, B, 0.f, Cref);
  auto h = to_host(C), r = to_host(Cref);
  for (std::size_t i = 0; i < 10; ++i)
    for (std::size_t j = 0; j < 4; ++j) {
      if (i >= 3 && i < 8)
        CHECK(std::abs(h(i, j) - r(i, j)) < 1e-5f);
      else
        CHECK(h(i, j) == 0.f);
    }
}

TEST_CASE("gemm rejects mismatched shapes with the shapes in the message", "[gemm]") {
  using telar::test::Exec;
  telar::Matrix<float> A("A", 4, 3), B("B", 5, 2), C("C", 4, 2);
  try {
    telar::gemm(telar::AutoGemm{}, Exec{}, 'N', 'N', 1.f, A, B, 0.f, C);
    FAIL("no exception");
  } catch (telar::ShapeError const& e) {
    CHECK(std::string(e.what()) == "telar::gemm: op(A) is 4x3, op(B) is 5x2, C is 4x2");
  }
}

// telar::Bf16Gemm rounds A and B to bf16 (8 significant bits: unit roundoff
// u = 2^-8) and accumulates in fp32. Each product a'b' = ab (1 + d1)(1 + d2)
// with |d| <= u, so |C_bf16 - C| <= alpha (2u + u^2) (|A| |B|) plus fp32
// summation error (<= (k + 2) 2^-24 of the same sum) and fp32 rounding of
// beta C (2^-23 |beta C|): about 7.9e-3 relative to |A||B| whatever K is.
// The test checks that bound element by element.
#if TELAR_HAVE_ONEDNN
namespace {
using Host = Kokkos::HostSpace;
using HostExec = Host::execution_space;

// Scoped environment variable for the ISA test hooks.
struct ScopedEnv {
  std::string name;
  ScopedEnv(char const* n, char const* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

// The product runs in memory space M (on a copy of the operands there,
// brought back), the check on the host.
template <class M = Host>
void check_bf16_bound(char ta, char tb, std::size_t m, std::size_t n, std::size_t k, float alpha,
                      float beta, std::size_t pad) {
  // pad > 0: the matrices are column ranges of wider ones (leading dimension
  // larger than the row), as layers' row views are.
  auto wide = [&](std::size_t r, std::size_t c, std::uint64_t seed) {
    return random_matrix<float, Host>(r, c + pad, seed);
  };
  auto Aw = ta == 'N' ? wide(m, k, 21) : wide(k, m, 21);
  auto Bw = tb == 'N' ? wide(k, n, 22) : wide(n, k, 22);
  auto Cw = wide(m, n, 23);
  auto const cols = [pad](auto const& w) {
    return Kokkos::subview(w, Kokkos::ALL, std::make_pair(std::size_t{0}, w.extent(1) - pad));
  };
  auto A = cols(Aw), B = cols(Bw), C = cols(Cw);
  Kokkos::View<float**, Kokkos::LayoutRight, Host> C0("C0", m, n);
  Kokkos::deep_copy(C0, C);
  auto dA = Kokkos::create_mirror_view_and_copy(M{}, Aw);
  auto dB = Kokkos::create_mirror_view_and_copy(M{}, Bw);
  auto dC = Kokkos::create_mirror_view_and_copy(M{}, Cw);
  telar::gemm(telar::Bf16Gemm{}, typename M::execution_space{}, ta, tb, alpha, cols(dA), cols(dB),
              beta, cols(dC));
  Kokkos::deep_copy(Cw, dC);
  double const u = std::ldexp(1.0, -8);
  double const rel = 2 * u + u * u + double(k + 2) * std::ldexp(1.0, -24);
  double worst_ratio = 0;
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double exact = 0, mag = 0;
      for (std::size_t l = 0; l < k; ++l) {
        double const a = ta == 'N' ? A(i, l) : A(l, i), b = tb == 'N' ? B(l, j) : B(j, l);
        exact += a * b;
        mag += std::fabs(a * b);
      }
      double const want = alpha * exact + beta * double(C0(i, j));
      double const bound = std::fabs(alpha) * rel * mag +
                           std::ldexp(1.0, -23) * (std::fabs(beta * C0(i, j)) + std::fabs(want)) +
                           1e-30;
      worst_ratio = std::max(worst_ratio, std::fabs(double(C(i, j)) - want) / bound);
    }
  INFO(ta << tb << " m=" << m << " n=" << n << " k=" << k << " alpha=" << alpha << " beta=" << beta
          << " pad=" << pad);
  CHECK(worst_ratio <= 1.0);
}
} // namespace

TEST_CASE("Bf16Gemm agrees with fp32 within bf16 rounding", "[gemm][bf16]") {
  if (!telar::bf16_available()) {
    SKIP("no AVX512-BF16/AMX on this CPU");
  }
  for (char ta : {'N', 'T'})
    for (char tb : {'N', 'T'})
      for (auto [m, n, k] : {std::tuple<int, int, int>{1, 1, 1},
                             {7, 5, 3},
                             {33, 17, 65},
                             {64, 96, 300},
                             {128, 10, 512}})
        for (float beta : {0.f, 1.f, 0.25f})
          check_bf16_bound(ta, tb, m, n, k, beta == 1.f ? 1.f : 0.5f, beta, 0);
  check_bf16_bound('N', 'T', 20, 30, 40, 1.f, 1.f, 5); // strided rows
  check_bf16_bound('T', 'N', 20, 30, 40, 1.f, 0.f, 3);
  // More than 2^20 values of C accumulated from a short k (a weight
  // gradient's shape): A's bf16 copy is padded, so oneDNN takes its
  // gemm-based matmul (core/detail/onednn_bf16_gemm.hpp, pads_a).
  for (char ta : {'N', 'T'})
    check_bf16_bound(ta, 'N', 1040, 1024, 16, 1.f, 1.f, 0);
  check_bf16_bound('T', 'N', 1040, 1024, 16, 0.5f, 0.25f, 3);

  // The relative error of a K = 256 product is about 1e-2 at worst and much
  // less typically (rounding errors of opposite signs cancel).
  auto A = random_matrix<float, Host>(64, 256, 31), B = random_matrix<float, Host>(256, 64, 32);
  telar::Matrix<float, Host> C("C", 64, 64), Cf("Cf", 64, 64);
  telar::gemm(telar::Bf16Gemm{}, HostExec{}, 'N', 'N', 1.f, A, B, 0.f, C);
  telar::gemm(telar::ReferenceGemm{}, HostExec{}, 'N', 'N', 1.f, A, B, 0.f, Cf);
  double num = 0, den = 0;
  for (std::size_t i = 0; i < 64; ++i)
    for (std::size_t j = 0; j < 64; ++j) {
      num += std::pow(double(C(i, j)) - Cf(i, j), 2);
      den += std::pow(double(Cf(i, j)), 2);
    }
  CHECK(std::sqrt(num / den) < 1e-2);
  CHECK(std::sqrt(num / den) > 0); // bf16 really ran: fp32 would be ~1e-7
}

// Attention's products under Bf16Gemm (telar::gemm_batched): entries that
// are the heads of wider matrices (strided, as strided_batch's), every
// transpose, in one oneDNN call for the whole batch; each entry within the
// bf16 bound of its exact product.
namespace {
// The batch runs in memory space M (on copies there), the check on the host.
template <class M = Host>
void check_bf16_batch() {
  std::size_t const n1 = 3, n2 = 2, m = 5, n = 6, k = 7;
  double const u = std::ldexp(1.0, -8), rel = 2 * u + u * u + double(k + 2) * std::ldexp(1.0, -24);
  for (char ta : {'N', 'T'})
    for (char tb : {'N', 'T'}) {
      // Entry (i, j) of a batch of [r, c] matrices: rows of matrix i, columns
      // [j c, (j + 1) c) of a [n1 r, n2 c] matrix.
      auto batch = [&](auto const& wide, std::size_t r, std::size_t c) {
        using S = typename std::decay_t<decltype(wide)>::memory_space;
        return telar::strided_batch<S>(wide.data(), n1, r * n2 * c, n2, c, r, n2 * c, c);
      };
      std::size_t const ar = ta == 'N' ? m : k, ac = ta == 'N' ? k : m;
      std::size_t const br = tb == 'N' ? k : n, bc = tb == 'N' ? n : k;
      auto const Aw = random_matrix<float, Host>(n1 * ar, n2 * ac, 51);
      auto const Bw = random_matrix<float, Host>(n1 * br, n2 * bc, 52);
      auto const A = batch(Aw, ar, ac), B = batch(Bw, br, bc);
      Kokkos::View<float****, Kokkos::LayoutRight, Host> C("C", n1, n2, m, n),
          C0("C0", n1, n2, m, n);
      for (std::size_t i = 0; i < C.size(); ++i)
        C.data()[i] = C0.data()[i] = float(int(i % 11) - 5) / 4.f;
      float const alpha = 0.5f, beta = 0.25f;
      auto const dA = Kokkos::create_mirror_view_and_copy(M{}, Aw);
      auto const dB = Kokkos::create_mirror_view_and_copy(M{}, Bw);
      auto const dC = Kokkos::create_mirror_view_and_copy(M{}, C);
      telar::LaunchCounter count;
      telar::gemm_batched(telar::Bf16Gemm{}, typename M::execution_space{}, ta, tb, alpha,
                          batch(dA, ar, ac), batch(dB, br, bc), beta, dC);
      CHECK(count.library_calls() == 1);
      Kokkos::deep_copy(C, dC);
      double worst_ratio = 0;
      for (std::size_t b1 = 0; b1 < n1; ++b1)
        for (std::size_t b2 = 0; b2 < n2; ++b2)
          for (std::size_t i = 0; i < m; ++i)
            for (std::size_t j = 0; j < n; ++j) {
              double exact = 0, mag = 0;
              for (std::size_t l = 0; l < k; ++l) {
                double const a = ta == 'N' ? A(b1, b2, i, l) : A(b1, b2, l, i);
                double const b = tb == 'N' ? B(b1, b2, l, j) : B(b1, b2, j, l);
                exact += a * b;
                mag += std::fabs(a * b);
              }
              double const want = alpha * exact + beta * double(C0(b1, b2, i, j));
              double const bound =
                  alpha * rel * mag +
                  std::ldexp(1.0, -23) * (std::fabs(beta * C0(b1, b2, i, j)) + std::fabs(want)) +
                  1e-30;
              worst_ratio =
                  std::max(worst_ratio, std::fabs(double(C(b1, b2, i, j)) - want) / bound);
            }
      INFO(ta << tb);
      CHECK(worst_ratio <= 1.0);
      CHECK(worst_ratio > 0.01); // bf16 ran (fp32 rounding would be ~1e-5 of the bound)
    }
}
} // namespace

TEST_CASE("Bf16Gemm multiplies a batch in one call, each entry within bf16 rounding",
          "[gemm][bf16]") {
  if (!telar::bf16_available()) {
    SKIP("no AVX512-BF16/AMX on this CPU");
  }
  check_bf16_batch();
}

#if TELAR_GEMM_CUBLAS_BF16
// In CUDA memory Bf16Gemm is cuBLAS's bf16 GEMM (core/detail/cublas_bf16_gemm.hpp):
// the same bounds for single products (strided rows too) and for a batch of
// strided heads (one call), and the refusal of a GPU without bf16 tensor
// cores.
TEST_CASE("Bf16Gemm in CUDA memory agrees with fp32 within bf16 rounding", "[gemm][bf16][device]") {
  using Dev = Kokkos::CudaSpace;
  static_assert(telar::Bf16Gemm::supports<float, Dev>());
  {
    ScopedEnv hide("TELAR_TEST_HIDE_BF16", "1");
    telar::Matrix<float, Dev> A("A", 8, 16), B("B", 16, 4), C("C", 8, 4);
    CHECK_THROWS_WITH(telar::gemm(telar::Bf16Gemm{}, Kokkos::Cuda{}, 'N', 'N', 1.f, A, B, 0.f, C),
                      Catch::Matchers::StartsWith("telar::gemm (telar::Bf16Gemm): this GPU has "
                                                  "no bf16 tensor cores (compute capability 8.0 "
                                                  "or later; hidden by TELAR_TEST_HIDE_BF16)"));
    CHECK_FALSE(telar::bf16_available<Dev>());
    CHECK_THROWS_WITH(telar::require_bf16<Dev>("my search"),
                      Catch::Matchers::StartsWith("my search: this GPU has no bf16 tensor cores"));
  }
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  CHECK(telar::bf16_available<Dev>() == (major >= 8));
  if (major < 8)
    SKIP("no bf16 tensor cores on this GPU");
  CHECK(telar::require_bf16<Dev>("my search"));
  for (char ta : {'N', 'T'})
    for (char tb : {'N', 'T'})
      for (auto [m, n, k] : {std::tuple<int, int, int>{1, 1, 1}, {33, 17, 65}, {64, 96, 300}})
        for (float beta : {0.f, 1.f, 0.25f})
          check_bf16_bound<Dev>(ta, tb, m, n, k, beta == 1.f ? 1.f : 0.5f, beta, 0);
  check_bf16_bound<Dev>('N', 'T', 20, 30, 40, 1.f, 1.f, 5); // strided rows
  check_bf16_batch<Dev>();
  CHECK(telar::bf16_kernels().find("cublas:gemm-ex:sm_") != std::string::npos);
  // A Dense layer under it multiplies in bf16 (no compact copy: that is
  // oneDNN's): forward and weight gradient near the fp32 layer's.
  static_assert(telar::bf16_layers_supported<float, Dev>());
  static_assert(!telar::test::onednn_bf16_v<Dev>);
  telar::Dense<float, Dev> d32(64, 32);
  d32.initialize(4);
  telar::Dense<float, Dev, telar::Bf16Gemm> const d16(d32); // the same parameters
  auto const x = Kokkos::create_mirror_view_and_copy(Dev{}, random_matrix<float, Host>(16, 64, 5));
  auto const dy = Kokkos::create_mirror_view_and_copy(Dev{}, random_matrix<float, Host>(16, 32, 6));
  telar::Matrix<float, Dev> y16("y16", 16, 32), y32("y32", 16, 32), dx("dx", 16, 64);
  typename telar::Dense<float, Dev, telar::Bf16Gemm>::saved_type s16;
  typename telar::Dense<float, Dev>::saved_type s32;
  d16.forward(Kokkos::Cuda{}, x, y16, s16);
  d32.forward(Kokkos::Cuda{}, x, y32, s32);
  auto const h16 = Kokkos::create_mirror_view_and_copy(Host{}, y16);
  auto const h32 = Kokkos::create_mirror_view_and_copy(Host{}, y32);
  double num = 0, den = 0;
  for (std::size_t i = 0; i < h16.size(); ++i) {
    num += std::pow(double(h16.data()[i]) - h32.data()[i], 2);
    den += std::pow(double(h32.data()[i]), 2);
  }
  CHECK(std::sqrt(num / den) < 1e-2);
  CHECK(std::sqrt(num / den) > 0); // bf16 ran
  d16.backward_input(Kokkos::Cuda{}, dy, dx, s16);
  d16.backward_weight(Kokkos::Cuda{}, dy, s16);
}
#endif

TEST_CASE("Bf16Gemm is exact on inputs representable in bf16 with small K", "[gemm][bf16]") {
  if (!telar::bf16_available()) {
    SKIP("no AVX512-BF16/AMX on this CPU");
  }
  // Multiples of 1/8 in [-2, 2] have at most 5 significant bits, and sums of
  // K <= 16 of their products fit fp32's 24 bits: every step is exact.
  for (char ta : {'N', 'T'})
    for (char tb : {'N', 'T'})
      for (std::size_t k : {1, 5, 16}) {
        std::size_t const m = 9, n = 13;
        telar::Matrix<float, Host> A("A", ta == 'N' ? m : k, ta == 'N' ? k : m),
            B("B", tb == 'N' ? k : n, tb == 'N' ? n : k), C("C", m, n), R("R", m, n);
        for (std::size_t i = 0; i < A.size(); ++i)
          A.data()[i] = float(int(i * 7 % 33) - 16) / 8.f;
        for (std::size_t i = 0; i < B.size(); ++i)
          B.data()[i] = float(int(i * 5 % 31) - 15) / 8.f;
        for (std::size_t i = 0; i < C.size(); ++i)
          C.data()[i] = R.data()[i] = float(int(i % 17) - 8) / 4.f;
        telar::gemm(telar::Bf16Gemm{}, HostExec{}, ta, tb, 0.5f, A, B, 0.25f, C);
        telar::gemm(telar::ReferenceGemm{}, HostExec{}, ta, tb, 0.5f, A, B, 0.25f, R);
        INFO(ta << tb << " k=" << k);
        for (std::size_t i = 0; i < C.size(); ++i)
          REQUIRE(C.data()[i] == R.data()[i]);
      }
  CHECK(telar::bf16_kernels().find("matmul:") != std::string::npos);
}

TEST_CASE("Bf16Gemm refuses a CPU without bf16 instructions unless fp32 is asked for",
          "[gemm][bf16]") {
  auto A = random_matrix<float, Host>(8, 16, 41), B = random_matrix<float, Host>(16, 4, 42);
  telar::Matrix<float, Host> C("C", 8, 4), R("R", 8, 4);
  {
    ScopedEnv hide("TELAR_TEST_HIDE_BF16", "1");
    CHECK_FALSE(telar::bf16_available());
    // Asked ahead of any GEMM: the same refusal, naming who asked.
    CHECK_THROWS_WITH(telar::require_bf16("my search"),
                      Catch::Matchers::StartsWith("my search: this CPU lacks the AVX512-BF16"));
    try {
      telar::gemm(telar::Bf16Gemm{}, HostExec{}, 'N', 'N', 1.f, A, B, 0.f, C);
      FAIL("no exception");
    } catch (telar::Error const& e) {
      std::string const msg = e.what();
      CHECK(msg.find("telar::gemm (telar::Bf16Gemm): this CPU lacks the AVX512-BF16 "
                     "(avx512_core_bf16) or AMX instruction set (hidden by "
                     "TELAR_TEST_HIDE_BF16)") == 0);
      CHECK(msg.find("TELAR_BF16_FALLBACK=fp32") != std::string::npos);
    }
    // The opt-in fallback runs oneDNN's fp32 GEMM: bit-identical to OneDnnGemm.
    ScopedEnv fallback("TELAR_BF16_FALLBACK", "fp32");
    CHECK_FALSE(telar::require_bf16("my search")); // fp32 will run
    telar::gemm(telar::Bf16Gemm{}, HostExec{}, 'N', 'N', 1.f, A, B, 0.f, C);
    telar::gemm(telar::OneDnnGemm{}, HostExec{}, 'N', 'N', 1.f, A, B, 0.f, R);
    for (std::size_t i = 0; i < C.size(); ++i)
      REQUIRE(C.data()[i] == R.data()[i]);
  }
  CHECK(telar::bf16_available() == (telar::detail::bf16_isa_available()));
  if (telar::bf16_available())
    CHECK(telar::require_bf16("my search"));
}
// The compact copies the stage runner asks for where no neighbour keeps a
// tensor (core/layer.hpp, compact_bytes): a bf16 Dense's or convolution's
// input rounded to bf16 (fp32 where bf16 falls back), a ReLU's output signs. Forward,
// backward_input and backward_weight give bit for bit what the views give,
// and the copies are the size compact_bytes() says.
namespace {
template <class Layer, class M>
void run_layer(Layer const& layer, bool compact, M x, M dy, M y, M dx) {
  typename telar::layer_traits<Layer>::saved_type saved;
  saved.compact = compact;
  M work("work", y.extent(0), y.extent(1));
  layer.forward(HostExec{}, x, work, saved);
  Kokkos::deep_copy(y, work);
  if (compact) { // a compact layer must not read x or y again
    Kokkos::deep_copy(x, -1.f);
    Kokkos::deep_copy(work, -1.f);
  }
  layer.backward_input(HostExec{}, dy, dx, saved);
  if constexpr (telar::layer_traits<Layer>::has_backward_weight)
    layer.backward_weight(HostExec{}, dy, saved);
}

template <class Layer>
void check_compact_matches_view(Layer a, Layer b, std::size_t n, std::size_t in, std::size_t out) {
  telar::Matrix<float, Host> y[2], dx[2];
  Layer* layers[2] = {&a, &b};
  for (int c = 0; c < 2; ++c) {
    y[c] = telar::Matrix<float, Host>("y", n, out);
    dx[c] = telar::Matrix<float, Host>("dx", n, in);
    run_layer(*layers[c], c == 1, random_matrix<float, Host>(n, in, 51),
              random_matrix<float, Host>(n, out, 52), y[c], dx[c]);
  }
  for (std::size_t i = 0; i < n * out; ++i)
    REQUIRE(y[0].data()[i] == y[1].data()[i]);
  for (std::size_t i = 0; i < n * in; ++i)
    REQUIRE(dx[0].data()[i] == dx[1].data()[i]);
  if constexpr (telar::layer_traits<Layer>::has_parameters) {
    for (std::size_t i = 0; i < a.weight_grad.size(); ++i)
      REQUIRE(a.weight_grad.data()[i] == b.weight_grad.data()[i]);
    for (std::size_t i = 0; i < a.bias_grad.size(); ++i)
      REQUIRE(a.bias_grad.data()[i] == b.bias_grad.data()[i]);
  }
}

template <class Layer>
std::size_t compact_allocation(Layer const& layer, std::size_t n, std::size_t in, std::size_t out) {
  typename telar::layer_traits<Layer>::saved_type saved;
  saved.compact = true;
  telar::Matrix<float, Host> y("y", n, out);
  layer.forward(HostExec{}, random_matrix<float, Host>(n, in, 53), y, saved);
  if constexpr (std::is_same_v<Layer, telar::ReLU<float, Host>>)
    return saved.signs.span() * sizeof(std::uint32_t);
  else
    return saved.kept.words() // as Kokkos allocates: whole 8-byte words
               ? telar::detail::view_bytes<std::uint16_t>(saved.kept.shape().size())
               : telar::detail::view_bytes<float>(saved.kept.values().size());
}

using Bf16Dense = telar::Dense<float, Host, telar::Bf16Gemm>;
Bf16Dense bf16_dense(std::size_t in, std::size_t out) {
  Bf16Dense d(in, out);
  d.initialize(7);
  return d;
}

template <int Dims>
using Bf16Conv = telar::Convolution<float, Dims, Host, telar::Bf16Gemm, telar::OneDnnConvBf16>;
template <int Dims>
Bf16Conv<Dims> bf16_conv(telar::Shape const& in, std::size_t out, std::size_t stride) {
  Bf16Conv<Dims> c(in[0], out, 3, stride, 1);
  c.build(in);
  c.initialize(8);
  return c;
}
template <int Dims>
using Bf16ConvT =
    telar::TransposedConvolution<float, Dims, Host, telar::Bf16Gemm, telar::OneDnnConvBf16>;
template <int Dims>
Bf16ConvT<Dims> bf16_conv_t(telar::Shape const& in, std::size_t out, std::size_t kernel,
                            std::size_t stride) {
  Bf16ConvT<Dims> c(in[0], out, kernel, stride);
  c.build(in);
  c.initialize(9);
  return c;
}
// A transposed convolution's copy on [n, in] -> [n, out] of its shapes.
template <int Dims>
void check_transposed(telar::Shape const& in, std::size_t out, std::size_t kernel,
                      std::size_t stride, std::size_t n) {
  auto const a = bf16_conv_t<Dims>(in, out, kernel, stride);
  check_compact_matches_view(a, bf16_conv_t<Dims>(in, out, kernel, stride), n, in.size(),
                             a.output_shape(in).size());
}
} // namespace

TEST_CASE("Compact copies are bit for bit the views they replace", "[gemm][bf16][memory]") {
  // A ReLU of 70 values a sample: words that end inside a sample.
  check_compact_matches_view(telar::ReLU<float, Host>{}, telar::ReLU<float, Host>{}, 9, 70, 70);
  CHECK(compact_allocation(telar::ReLU<float, Host>{}, 9, 70, 70) ==
        telar::ReLU<float, Host>{}.compact_bytes(9, telar::Shape(70)));
  CHECK(telar::ReLU<float, Host>{}.compact_bytes(9, telar::Shape(70)) == 20 * 4); // 630 bits
  auto const dense_case = [](std::size_t bytes_per_value) {
    // Two positions a sample ([n, 2 * in]), as a sequence's rows are.
    check_compact_matches_view(bf16_dense(24, 40), bf16_dense(24, 40), 13, 48, 80);
    auto const d = bf16_dense(24, 40);
    CHECK(compact_allocation(d, 13, 48, 80) == d.compact_bytes(13, telar::Shape{2, 24}));
    CHECK(d.compact_bytes(13, telar::Shape{2, 24}) == 13 * 48 * bytes_per_value);
  };
  // A bf16 convolution's input ([3, 9, 9] -> [5, 9, 9]; 24 channels, which
  // oneDNN's blocked layout pads, so the copy is reordered to the plain one;
  // 3-D: [2, 5, 5, 5] -> [4, 3, 3, 3], stride 2): its weight gradient reads
  // the copy.
  auto const conv_case = [](std::size_t bytes_per_value) {
    telar::Shape const in2{3, 9, 9}, wide{24, 5, 5}, in3{2, 5, 5, 5};
    check_compact_matches_view(bf16_conv<2>(in2, 5, 1), bf16_conv<2>(in2, 5, 1), 7, 243, 405);
    check_compact_matches_view(bf16_conv<2>(wide, 8, 1), bf16_conv<2>(wide, 8, 1), 5, 600, 200);
    check_compact_matches_view(bf16_conv<3>(in3, 4, 2), bf16_conv<3>(in3, 4, 2), 3, 250, 108);
    auto const c = bf16_conv<2>(in2, 5, 1);
    CHECK(compact_allocation(c, 7, 243, 405) == c.compact_bytes(7, in2));
    CHECK(c.compact_bytes(7, in2) == (bytes_per_value == 2
                                          ? telar::detail::view_bytes<std::uint16_t>(7 * 243)
                                          : telar::detail::view_bytes<float>(7 * 243)));
    // Transposed: the input is the adjoint's dy, kept by its backward_data
    // primitive and read by its weight gradient as diff_dst (U-Net's
    // upsampling [16, 4, 4] -> [8, 8, 8]; 3 -> 5 channels, kernel 3,
    // stride 1; 3-D [4, 3, 3, 3] -> [2, 6, 6, 6]).
    check_transposed<2>(telar::Shape{16, 4, 4}, 8, 2, 2, 6);
    check_transposed<2>(in2, 5, 3, 1, 7);
    check_transposed<3>(telar::Shape{4, 3, 3, 3}, 2, 2, 2, 3);
    auto const t = bf16_conv_t<2>(in2, 5, 3, 1);
    CHECK(compact_allocation(t, 7, 243, t.output_shape(in2).size()) == t.compact_bytes(7, in2));
    CHECK(t.compact_bytes(7, in2) == c.compact_bytes(7, in2));
  };
  if (telar::bf16_available()) {
    dense_case(2);
    conv_case(2);
  }
  ScopedEnv hide("TELAR_TEST_HIDE_BF16", "1");
  ScopedEnv fallback("TELAR_BF16_FALLBACK", "fp32");
  dense_case(4); // the fp32 input itself, as exact as the view
  conv_case(4);
}

// What Precision<bf16, float> makes of a GELU (or GELUTanh, SiLU): its
// compact copy is its input rounded to bf16. The output is the fp32
// layer's bit for bit; the input gradient is the fp32 layer's at the
// rounded input, bit for bit, and so within bf16's rounding of the exact
// one; where bf16 falls back the copy is exact.
namespace {
template <class Act>
void check_kept_in_bf16(std::size_t bytes_per_value) {
  std::size_t const n = 9, f = 70;
  auto const x = random_matrix<float, Host>(n, f, 61);
  auto const dy = random_matrix<float, Host>(n, f, 62);
  telar::Matrix<float, Host> y("y", n, f), dx("dx", n, f), y0("y0", n, f), dx0("dx0", n, f);
  telar::KeptInBf16<Act> const kept{Act{}};
  run_layer(kept, true, random_matrix<float, Host>(n, f, 61), dy, y, dx);
  // The reference: the fp32 layer, its backward given the rounded input.
  auto const rounded = random_matrix<float, Host>(n, f, 61);
  for (std::size_t i = 0; i < n * f && bytes_per_value == 2; ++i)
    rounded.data()[i] = telar::detail::Bf16Word::from_float(rounded.data()[i]).to_float();
  Act const plain{};
  typename Act::saved_type saved;
  plain.forward(HostExec{}, x, y0, saved);
  saved.kept = rounded;
  plain.backward_input(HostExec{}, dy, dx0, saved);
  for (std::size_t i = 0; i < n * f; ++i) {
    REQUIRE(y.data()[i] == y0.data()[i]);
    REQUIRE(dx.data()[i] == dx0.data()[i]);
  }
  typename telar::KeptInBf16<Act>::saved_type s;
  s.compact = true;
  kept.forward(HostExec{}, x, y, s);
  CHECK(s.rounded.rounded() == (bytes_per_value == 2));
  CHECK(kept.compact_bytes(n, telar::Shape(f)) ==
        (bytes_per_value == 2 ? telar::detail::view_bytes<std::uint16_t>(n * f)
                              : telar::detail::view_bytes<float>(n * f))); // as Kokkos allocates
  CHECK(std::string(telar::KeptInBf16<Act>::name()) == Act::name());
}
} // namespace

TEST_CASE("A bf16 GELU keeps its input rounded: the slope at the rounded input",
          "[gemm][bf16][memory]") {
  if (telar::bf16_available()) {
    check_kept_in_bf16<telar::GELU<float, Host>>(2);
    check_kept_in_bf16<telar::GELUTanh<float, Host>>(2);
    check_kept_in_bf16<telar::SiLU<float, Host>>(2);
  }
  ScopedEnv hide("TELAR_TEST_HIDE_BF16", "1");
  ScopedEnv fallback("TELAR_BF16_FALLBACK", "fp32");
  check_kept_in_bf16<telar::GELU<float, Host>>(4); // the fp32 input itself: exact
}
#endif
