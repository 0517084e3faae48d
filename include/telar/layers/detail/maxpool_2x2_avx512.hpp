#pragma once
// One output row of 2 x 2 max pooling in AVX-512 (maxpool_2x2.hpp uses them
// on hosts that have it, as host_simd.hpp's loops do). Why by hand: the
// windows' elements lie two apart, and the rows of a CNN's pooling are 7 to
// 14 outputs wide; the vectoriser's 16-lane loop never ran on them, and
// their scalar code took 1.0 to 1.2 ms for the 12.8 MB of example 02's
// first pooling, where a ReLU reads and writes it in 0.85. Here a row is
// one masked pass of 16 windows: the even and odd columns separated by two
// permutes, then the same three ordered comparisons as the scalar kernel
// (`>` is false for a NaN, so ties keep the first element and a NaN never
// replaces a number): the same maxima at the same positions, bit for bit.
#include <telar/core/detail/host_simd.hpp>

#if TELAR_HOST_SIMD_AVX512
#include <immintrin.h>

#include <algorithm>

namespace telar::detail {

#define TELAR_AVX512_ROW __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) inline

// Lanes [0, k) set, and the two masks of a pair of rows' 2k inputs.
struct PoolLanes {
  __mmask16 out, in_lo, in_hi;
  explicit PoolLanes(int k)
      : out(__mmask16((1u << k) - 1)), in_lo(__mmask16(2 * k >= 16 ? 0xFFFFu : (1u << 2 * k) - 1)),
        in_hi(__mmask16(2 * k > 16 ? (1u << (2 * k - 16)) - 1 : 0u)) {}
};

TELAR_AVX512_ROW __m512i pool_lane_ids() {
  return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

// m, at = v, its position (at0 + offset) where v > m: the scalar kernel's
// selects. (Helpers, not lambdas: a lambda would not get the target.)
TELAR_AVX512_ROW void pool_take(__m512& m, __m512i& at, __m512 v, __m512i at0, int offset) {
  __mmask16 const gt = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ);
  m = _mm512_mask_blend_ps(gt, m, v);
  at = _mm512_mask_blend_epi32(gt, at, _mm512_add_epi32(at0, _mm512_set1_epi32(offset)));
}

// out[0, n) = the maxima of the windows over top and bottom (each 2n wide),
// arg = their positions, `first` being top[0]'s position in the plane.
TELAR_AVX512_ROW void maxpool_2x2_row_avx512(float const* top, float const* bottom, float* out,
                                             int* arg, int n, int first, int w_in) {
  __m512i const two_l = _mm512_slli_epi32(pool_lane_ids(), 1);
  __m512i const even = two_l, odd = _mm512_add_epi32(two_l, _mm512_set1_epi32(1));
  for (int o = 0; o < n; o += 16) {
    PoolLanes const l(std::min(16, n - o));
    float const* t = top + 2 * o;
    float const* b = bottom + 2 * o;
    __m512 const t0 = _mm512_maskz_loadu_ps(l.in_lo, t),
                 t1 = _mm512_maskz_loadu_ps(l.in_hi, t + 16);
    __m512 const b0 = _mm512_maskz_loadu_ps(l.in_lo, b),
                 b1 = _mm512_maskz_loadu_ps(l.in_hi, b + 16);
    __m512i const at0 = _mm512_add_epi32(_mm512_set1_epi32(first + 2 * o), two_l);
    __m512 m = _mm512_permutex2var_ps(t0, even, t1);
    __m512i at = at0;
    pool_take(m, at, _mm512_permutex2var_ps(t0, odd, t1), at0, 1);
    pool_take(m, at, _mm512_permutex2var_ps(b0, even, b1), at0, w_in);
    pool_take(m, at, _mm512_permutex2var_ps(b0, odd, b1), at0, w_in + 1);
    _mm512_mask_storeu_ps(out + o, l.out, m);
    _mm512_mask_storeu_epi32(arg + o, l.out, at);
  }
}

// d where the lanes' window position rel is column `offset`, 0 elsewhere.
TELAR_AVX512_ROW __m512 pool_at(__m512 d, __m512i rel, __m512i two_l, int offset) {
  return _mm512_maskz_mov_ps(
      _mm512_cmpeq_epi32_mask(rel, _mm512_add_epi32(two_l, _mm512_set1_epi32(offset))), d);
}

// row[0, 2k) = the even and odd columns interleaved back.
TELAR_AVX512_ROW void pool_interleave(float* row, PoolLanes const& l, __m512 even, __m512 odd) {
  __m512i const lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  __m512i const hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
  _mm512_mask_storeu_ps(row, l.in_lo, _mm512_permutex2var_ps(even, lo, odd));
  _mm512_mask_storeu_ps(row + 16, l.in_hi, _mm512_permutex2var_ps(even, hi, odd));
}

// top and bottom (2n wide each) = grad at each window's maximum (arg), 0
// elsewhere: every element written once.
TELAR_AVX512_ROW void maxpool_2x2_backward_row_avx512(float* top, float* bottom, float const* grad,
                                                      int const* arg, int n, int first, int w_in) {
  __m512i const two_l = _mm512_slli_epi32(pool_lane_ids(), 1);
  for (int o = 0; o < n; o += 16) {
    PoolLanes const l(std::min(16, n - o));
    __m512 const d = _mm512_maskz_loadu_ps(l.out, grad + o);
    __m512i const rel = _mm512_sub_epi32(_mm512_maskz_loadu_epi32(l.out, arg + o),
                                         _mm512_set1_epi32(first + 2 * o));
    pool_interleave(top + 2 * o, l, pool_at(d, rel, two_l, 0), pool_at(d, rel, two_l, 1));
    pool_interleave(bottom + 2 * o, l, pool_at(d, rel, two_l, w_in),
                    pool_at(d, rel, two_l, w_in + 1));
  }
}

#undef TELAR_AVX512_ROW

} // namespace telar::detail
#endif
