#pragma once
// Vectorisable float erf and exp (see fast_erf).
#include <telar/core/detail/math.hpp>

#include <cstdint>
#include <type_traits>

namespace telar::detail {

// x with its magnitude at most c > 0 (NaN stays NaN). Compares the
// magnitudes' bit patterns as integers, which order like the magnitudes: a
// float comparison may trap, so compilers keep it a branch and the loop
// around it scalar, unless -fno-trapping-math.
KOKKOS_INLINE_FUNCTION float clamp_magnitude(float x, float c) {
  std::int32_t const xb = bit_cast<std::int32_t>(x), cb = bit_cast<std::int32_t>(c);
  std::int32_t const sign = xb & std::int32_t(0x80000000u), mag = xb & 0x7fffffff;
  return bit_cast<float>((mag < cb || mag > 0x7f800000 ? mag : cb) | sign);
}

// erf and exp without library calls for float, so that element loops
// vectorise on CPUs (glibc's erff and expf are scalar calls: GELU was 8% of
// a transformer block's step). erf: the rational approximation of Eigen and
// XLA on [-4, 4] (+-1 beyond; at most 3.9e-7 from erf). exp: Cody-Waite
// reduction to r in [-ln2/2, ln2/2], Cephes' degree-6 polynomial, 2^n built
// in the exponent bits (under 1 ulp; |x| clamped to 87). Other types use
// the library functions, so double-precision gradient checks stay exact.
template <class T>
KOKKOS_INLINE_FUNCTION T fast_erf(T a) {
  if constexpr (std::is_same_v<T, float>) {
    float const x = clamp_magnitude(a, 4.f);
    float const x2 = x * x;
    float p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
    p = x2 * p - 2.10102402082508e-06f;
    p = x2 * p - 5.69250639462346e-05f;
    p = x2 * p - 7.34990630326855e-04f;
    p = x2 * p - 2.95459980854025e-03f;
    p = x2 * p - 1.60960333262415e-02f;
    float q = x2 * -1.45660718464996e-05f - 2.13374055278905e-04f;
    q = x2 * q - 1.68282697438203e-03f;
    q = x2 * q - 7.37332916720468e-03f;
    q = x2 * q - 1.42647390514189e-02f;
    return x * p / q;
  } else {
    return erf(a);
  }
}

template <class T>
KOKKOS_INLINE_FUNCTION T fast_exp(T a) {
  if constexpr (std::is_same_v<T, float>) {
    float const x = clamp_magnitude(a, 87.f);
    float const n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f; // round(x / ln2)
    float const r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float const scale = bit_cast<float>((std::int32_t(n) + 127) << 23);
    return (p * r * r + r + 1.f) * scale;
  } else {
    return exp(a);
  }
}
} // namespace telar::detail
