#pragma once
// Element loops on the host compiled twice, for the build's target and for
// AVX-512, the copy chosen when the loop runs.
//
// Why: Telar's own kernels are compiled in the user's program, and without
// -march GCC targets x86-64 (SSE2, 4 floats a vector), where PyTorch and
// oneDNN pick AVX-512 kernels at run time: a transformer block's GELU,
// LayerNorm and softmax took 7% more time than in a build for this CPU. A
// build for the CPU is no answer either (a binary made for one machine; and
// loops GCC vectorises 16 wide fall into their scalar remainders on short
// rows: docs/precision.md).
//
// The AVX-512 copy is made without contraction into fused multiply-adds
// (which AVX-512F has and GCC would use, -std=c++17 or not), so both copies
// compute every value the same way: the choice moves the speed, never a
// result (tests/core/test_host_simd.cpp). Only GCC makes the second copy
// (clang contracts per statement where the lambda is written, before any
// attribute of the loop around it could say otherwise); elsewhere, on
// devices and in builds already for AVX-512, simd_for is Kokkos's
// parallel_for. TELAR_HOST_SIMD=baseline in the environment takes the
// build's copy everywhere (to compare, or on a machine whose AVX-512 is
// slower than its narrower units).
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__AVX512F__) &&    \
    !defined(__CUDACC__) && !defined(__HIPCC__)
#define TELAR_HOST_SIMD_AVX512 1
#else
#define TELAR_HOST_SIMD_AVX512 0
#endif

namespace telar::detail {

enum class HostSimd { baseline, avx512 };

template <class Exec>
inline constexpr bool runs_on_host_v =
    std::is_same_v<typename Exec::memory_space, Kokkos::HostSpace>;

// What this machine and build allow, once per process.
inline HostSimd host_simd_available() {
#if TELAR_HOST_SIMD_AVX512
  static HostSimd const level = [] {
    __builtin_cpu_init();
    bool const cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                     __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    char const* env = std::getenv("TELAR_HOST_SIMD");
    bool const off = env && std::strcmp(env, "baseline") == 0;
    return cpu && !off ? HostSimd::avx512 : HostSimd::baseline;
  }();
  return level;
#else
  return HostSimd::baseline;
#endif
}

// The copy simd_for takes; tests set it to compare the two.
inline HostSimd& host_simd_choice() {
  static HostSimd choice = host_simd_available();
  return choice;
}

// "avx512" or "baseline", for run summaries.
inline char const* host_simd_name() {
  return host_simd_choice() == HostSimd::avx512 ? "avx512" : "baseline";
}

#if TELAR_HOST_SIMD_AVX512
// Iterations of a parallel_for are independent, which is what ivdep tells
// the vectoriser (no run-time overlap checks between the views). flatten:
// a call f did not inline would run the build's code, not this copy's. f
// is copied: a float member of the caller's f (SGD's momentum) could be
// where a store of the loop writes, so it would be loaded anew in every
// iteration and the loop kept scalar; a local copy cannot be.
template <class F>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), optimize("fp-contract=off"),
               flatten)) void
simd_range_avx512(F const& f, std::size_t begin, std::size_t end) {
  F const g = f;
#pragma GCC ivdep
  for (std::size_t i = begin; i < end; ++i)
    g(i);
}

// An integer count, f(i, acc) adding to acc: exact in any order, so
// vectorised freely.
template <class Int, class F>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), flatten)) Int
simd_count_avx512(F const& f, std::size_t begin, std::size_t end) {
  F const g = f; // as in simd_range_avx512
  Int acc = 0;
  for (std::size_t i = begin; i < end; ++i)
    g(i, acc);
  return acc;
}
#endif

// Kokkos::parallel_for(label, RangePolicy<Exec>(exec, 0, n), f), with f's
// loop compiled for AVX-512 where the host has it: `block` indices per call
// (elements: 4096, 16 KiB of floats; rows: 1, the loops being inside f), a
// block per task under OpenMP.
template <class Exec, class F>
void simd_for(char const* label, Exec const& exec, std::size_t n, F const& f,
              std::size_t block = 4096) {
#if TELAR_HOST_SIMD_AVX512
  if constexpr (runs_on_host_v<Exec>) {
    if (host_simd_choice() == HostSimd::avx512) {
      Kokkos::parallel_for(
          label, Kokkos::RangePolicy<Exec>(exec, 0, (n + block - 1) / block),
          [=](std::size_t b) { simd_range_avx512(f, b * block, std::min(n, (b + 1) * block)); });
      return;
    }
  }
#endif
  (void)block;
  Kokkos::parallel_for(label, Kokkos::RangePolicy<Exec>(exec, 0, n), f);
}

// Kokkos::parallel_reduce of an integer count over [begin, end) (f(i, acc)
// adds to acc), its loop compiled for AVX-512 as simd_for's.
template <class Int, class Exec, class F>
Int simd_count(char const* label, Exec const& exec, std::size_t begin, std::size_t end,
               F const& f) {
  static_assert(std::is_integral_v<Int>, "simd_count counts: any order gives the same sum");
  Int total = 0;
#if TELAR_HOST_SIMD_AVX512
  if constexpr (runs_on_host_v<Exec>) {
    if (host_simd_choice() == HostSimd::avx512) {
      constexpr std::size_t block = 4096;
      Kokkos::parallel_reduce(
          label, Kokkos::RangePolicy<Exec>(exec, 0, (end - begin + block - 1) / block),
          [=](std::size_t b, Int& acc) {
            std::size_t const lo = begin + b * block;
            acc += simd_count_avx512<Int>(f, lo, std::min(end, lo + block));
          },
          total);
      return total;
    }
  }
#endif
  Kokkos::parallel_reduce(label, Kokkos::RangePolicy<Exec>(exec, begin, end), f, total);
  return total;
}

// op folded over v(0), ..., v(n - 1) in 16 interleaved lanes (each starting
// from init), the lanes combined pairwise at the end: a fold the vectoriser
// may keep in one AVX-512 register (or four SSE ones) without reordering
// it, so both copies of a simd_for give the same bits (a plain running sum
// stays scalar: reassociating it would change the result).
template <class T, class V, class Op>
KOKKOS_INLINE_FUNCTION T lane_reduce(std::size_t n, T init, V const& v, Op const& op) {
  constexpr std::size_t lanes = 16;
  T acc[lanes];
  for (std::size_t l = 0; l < lanes; ++l)
    acc[l] = init;
  std::size_t j = 0;
  for (; j + lanes <= n; j += lanes)
    for (std::size_t l = 0; l < lanes; ++l)
      acc[l] = op(acc[l], v(j + l));
  for (std::size_t l = 0; j + l < n; ++l)
    acc[l] = op(acc[l], v(j + l));
  for (std::size_t w = lanes / 2; w > 0; w /= 2)
    for (std::size_t l = 0; l < w; ++l)
      acc[l] = op(acc[l], acc[l + w]);
  return acc[0];
}

template <class T, class V>
KOKKOS_INLINE_FUNCTION T lane_sum(std::size_t n, V const& v) {
  return lane_reduce<T>(n, T(0), v, [](T a, T b) { return a + b; });
}

} // namespace telar::detail
