#include "support.hpp"

#include <telar/core/gemm.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <tuple>

using telar::test::random_matrix;
using telar::test::to_host;

namespace {
template <class T, class Policy>
void check_against_reference(Policy policy, char ta, char tb, std::size_t m, std::size_t n,
                             std::size_t k, T beta) {
  using Exec = telar::DefaultMemorySpace::execution_space;
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
  using Exec = telar::DefaultMemorySpace::execution_space;
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
  using Exec = telar::DefaultMemorySpace::execution_space;
  telar::Matrix<float> A("A", 4, 3), B("B", 5, 2), C("C", 4, 2);
  try {
    telar::gemm(telar::AutoGemm{}, Exec{}, 'N', 'N', 1.f, A, B, 0.f, C);
    FAIL("no exception");
  } catch (telar::ShapeError const& e) {
    CHECK(std::string(e.what()) == "telar::gemm: op(A) is 4x3, op(B) is 5x2, C is 4x2");
  }
}
