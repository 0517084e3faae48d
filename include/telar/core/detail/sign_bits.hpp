#pragma once
// A ReLU's output signs packed 32 to a word (telar::ReLU's compact copy):
// forward writes y = max(x, 0) and the word of its signs in one pass,
// backward multiplies dy by the slope each bit gives, bit for bit what
// ReluOp gives from the kept output.
//
// On x86 hosts a word is eight SSE2 groups of four (a compare's movemask
// gives four bits at once): Telar builds for the x86-64 baseline, which has
// no per-lane variable shift, so the compilers leave a loop over the bits
// scalar. Measured on 3.2 M values (a CNN's ReLU at batch 128, Kokkos
// Serial): the scalar loops 1.7 ms forward and 1.6 ms backward, these 0.6
// and 0.6, a kept fp32 output 0.45 and 0.85. Elsewhere (devices, other
// CPUs, double) the plain loop.
#include <telar/core/detail/math.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__SSE2__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__) &&            \
    !defined(__SYCL_DEVICE_ONLY__)
#define TELAR_SIGN_BITS_SSE2 1
#include <emmintrin.h>
#else
#define TELAR_SIGN_BITS_SSE2 0
#endif

namespace telar::detail {

// y[k] = max(x[k], 0) for k < count (<= 32), as ReluOp::value; returns the
// word whose bit k says y[k] > 0.
template <class T>
KOKKOS_INLINE_FUNCTION std::uint32_t relu_signs(T const* x, T* y, std::size_t count) {
#if TELAR_SIGN_BITS_SSE2
  if constexpr (std::is_same_v<T, float>)
    if (count == 32) {
      __m128 const zero = _mm_setzero_ps(); // max(x, +0) is +0 for x <= 0, -0 and NaN
      std::uint32_t bits = 0;
      for (int q = 0; q < 8; ++q) {
        __m128 const v = _mm_max_ps(_mm_loadu_ps(x + 4 * q), zero);
        _mm_storeu_ps(y + 4 * q, v);
        bits |= std::uint32_t(_mm_movemask_ps(_mm_cmpgt_ps(v, zero))) << (4 * q);
      }
      return bits;
    }
#endif
  std::uint32_t bits = 0;
  for (std::size_t k = 0; k < count; ++k) {
    T const v = zero_unless(x[k] > T(0), x[k]);
    y[k] = v;
    bits |= std::uint32_t(v > T(0)) << k;
  }
  return bits;
}

// dx[k] = dy[k] * (bit k of `bits` ? 1 : 0) for k < count (<= 32): the
// product ReluOp::slope's 1 or +0 gives.
template <class T>
KOKKOS_INLINE_FUNCTION void relu_signs_backward(std::uint32_t bits, T const* dy, T* dx,
                                                std::size_t count) {
#if TELAR_SIGN_BITS_SSE2
  if constexpr (std::is_same_v<T, float>)
    if (count == 32) {
      __m128i const word = _mm_set1_epi32(int(bits));
      __m128 const one = _mm_set1_ps(1.f);
      __m128i select = _mm_set_epi32(8, 4, 2, 1); // bits 4q .. 4q + 3
      for (int q = 0; q < 8; ++q) {
        __m128i const on = _mm_cmpeq_epi32(_mm_and_si128(word, select), select);
        __m128 const slope = _mm_and_ps(_mm_castsi128_ps(on), one);
        _mm_storeu_ps(dx + 4 * q, _mm_mul_ps(_mm_loadu_ps(dy + 4 * q), slope));
        select = _mm_slli_epi32(select, 4);
      }
      return;
    }
#endif
  for (std::size_t k = 0; k < count; ++k) {
    T const slope = zero_unless(((bits >> k) & 1u) != 0, T(1));
    dx[k] = dy[k] * slope;
  }
}

} // namespace telar::detail

#undef TELAR_SIGN_BITS_SSE2 // the functions above are its only readers
