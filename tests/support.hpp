#pragma once
// Helpers shared by Telar's tests.
#include <telar/core/gemm.hpp>
#include <telar/core/tensor.hpp>

#include <cstdint>
#include <vector>

namespace telar::test {

// The execution space the layer and optimizer tests hand their layers: the
// default one of the default memory space, or TELAR_TEST_EXEC where a build
// with two host backends (Serial and OpenMP) compiles those tests once more
// for the other one (tests/CMakeLists.txt, telar_add_test's BACKENDS).
#ifdef TELAR_TEST_EXEC
using Exec = TELAR_TEST_EXEC;
#else
using Exec = DefaultMemorySpace::execution_space;
#endif
static_assert(Kokkos::SpaceAccessibility<Exec, DefaultMemorySpace>::accessible,
              "TELAR_TEST_EXEC must reach the default memory space");

// S as a type that depends on M. Tests that instantiate bf16 code only where
// it can run (`if constexpr (telar::bf16_layers_supported<float, M>())` in a
// template on the memory space M) name their bf16 types through it: a
// template resolves what does not depend on its parameters where it is
// defined, discarded branch or not (a static_assert in it would fire).
template <class S, class M>
struct on_space {
  using type = S;
};
template <class S, class M>
using on_space_t = typename on_space<S, M>::type;

// Whether float layers in M compute bf16 with oneDNN (host memory): what
// the tests of its compact copies, the weights rounded once a step and the
// bf16 ZeRO-3 gathers need. In CUDA memory the bf16 layers are cuBLAS's
// GEMMs alone.
template <class M>
inline constexpr bool onednn_bf16_v = telar::detail::onednn_bf16_v<telar::Bf16Gemm, float, M>;

// Deterministic values in [-1, 1) (not std::mt19937's distributions, whose
// output differs between standard libraries).
inline double hash_uniform(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + i + 1;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return double(x >> 11) / double(1ull << 53) * 2.0 - 1.0;
}

template <class T, class M = DefaultMemorySpace>
Matrix<T, M> random_matrix(std::size_t r, std::size_t c, std::uint64_t seed, double scale = 1) {
  Matrix<T, M> m("test::random", r, c);
  auto h = Kokkos::create_mirror_view(m);
  for (std::size_t i = 0; i < r; ++i)
    for (std::size_t j = 0; j < c; ++j)
      h(i, j) = T(scale * hash_uniform(seed, i * c + j));
  Kokkos::deep_copy(m, h);
  return m;
}

template <class V>
auto to_host(V const& v) {
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, v);
}

// Relative difference |a - b| / max(|a|, |b|, floor).
inline double rel_diff(double a, double b, double floor = 1e-12) {
  double const d = a > b ? a - b : b - a;
  double const s = std::max({a < 0 ? -a : a, b < 0 ? -b : b, floor});
  return d / s;
}

} // namespace telar::test
