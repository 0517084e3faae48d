#pragma once
// Max pooling with 2 x 2 windows and stride 2 tiling the plane exactly
// (telar::MaxPool2D(2) on even sizes, the CNNs' pooling; a MaxPool3D with a
// unit depth window too). The general kernels (pooling.hpp) loop over a
// window whose sizes they read at run time, one comparison and index update
// at a time: at a CNN's sizes their forward took six times a ReLU's time
// on the same input. Here each window is four loads and three selects, and
// backward writes every input gradient once (no zeroing pass), so neither
// pass reads more than it must. The results are the general kernels', bit
// for bit: the same maximum (ties keep the first in row-major order, a NaN
// never replaces a number) at the same position. On hosts with AVX-512 the
// rows run maxpool_2x2_avx512.hpp's code instead, with the same results.
#include <telar/layers/detail/maxpool_2x2_avx512.hpp>
#include <telar/layers/detail/pool_geometry.hpp>
#include <telar/layers/detail/spatial_row.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <type_traits>

namespace telar::detail {

// Whether g is such a pooling.
inline bool pool_2x2(PoolGeometry const& g) {
  return g.k[0] == 1 && g.k[1] == 2 && g.k[2] == 2 && g.s[0] == 1 && g.s[1] == 2 && g.s[2] == 2 &&
         g.p[0] == 0 && g.p[1] == 0 && g.p[2] == 0 && g.out[0] == g.in[0] &&
         2 * g.out[1] == g.in[1] && 2 * g.out[2] == g.in[2];
}

// Where output row r of a 2x2 pooling lies: its two input rows start at
// `in` (the top one; the bottom one w_in later), `first` is the top row's
// position in its plane (what idx holds), its outputs start at `out`.
struct Row2x2 {
  std::size_t in, out;
  int first, w_in;
  KOKKOS_INLINE_FUNCTION Row2x2(PoolGeometry const& g, std::size_t r)
      : out(r * std::size_t(g.out[2])) {
    SpatialRow const o(r, g.out[0], g.out[1]);
    w_in = g.in[2];
    first = (o.d * g.in[1] + 2 * o.h) * w_in;
    in = o.plane * g.in_plane() + std::size_t(first);
  }
};

// y = the maxima of the windows, idx = their positions in the plane.
template <class Exec, class X, class Y, class I>
void maxpool_2x2_forward(Exec const& exec, PoolGeometry const g, X const& x, Y const& y,
                         I const& idx) {
  using T = typename Y::non_const_value_type;
#if TELAR_HOST_SIMD_AVX512
  if constexpr (runs_on_host_v<Exec> && std::is_same_v<T, float>) {
    if (host_simd_choice() == HostSimd::avx512) {
      Kokkos::parallel_for("telar::MaxPool::forward_2x2",
                           Kokkos::RangePolicy<Exec>(exec, 0, g.out_rows(x.extent(0))),
                           [=](std::size_t r) {
                             Row2x2 const w(g, r);
                             float const* const top = x.data() + w.in;
                             maxpool_2x2_row_avx512(top, top + w.w_in, y.data() + w.out,
                                                    idx.data() + w.out, g.out[2], w.first, w.w_in);
                           });
      return;
    }
  }
#endif
  Kokkos::parallel_for(
      "telar::MaxPool::forward_2x2", Kokkos::RangePolicy<Exec>(exec, 0, g.out_rows(x.extent(0))),
      KOKKOS_LAMBDA(std::size_t r) {
        Row2x2 const row(g, r);
        int const w_in = row.w_in, first = row.first;
        T const* const top = x.data() + row.in;
        T const* const bottom = top + w_in;
        T* const out = y.data() + row.out;
        int* const arg = idx.data() + row.out;
        for (int ow = 0; ow < g.out[2]; ++ow) {
          int const w = 2 * ow;
          T m = top[w];
          int at = first + w;
          at = top[w + 1] > m ? first + w + 1 : at;
          m = top[w + 1] > m ? top[w + 1] : m;
          at = bottom[w] > m ? first + w_in + w : at;
          m = bottom[w] > m ? bottom[w] : m;
          at = bottom[w + 1] > m ? first + w_in + w + 1 : at;
          m = bottom[w + 1] > m ? bottom[w + 1] : m;
          out[ow] = m;
          arg[ow] = at;
        }
      });
}

// dx = dy at each window's maximum, 0 elsewhere: one output row writes the
// two input rows its windows cover, every element of them once.
template <class Exec, class DY, class DX, class I>
void maxpool_2x2_backward(Exec const& exec, PoolGeometry const g, DY const& dy, DX const& dx,
                          I const& idx) {
  using T = typename DX::non_const_value_type;
#if TELAR_HOST_SIMD_AVX512
  if constexpr (runs_on_host_v<Exec> && std::is_same_v<T, float> &&
                std::is_same_v<typename DY::non_const_value_type, float>) {
    if (host_simd_choice() == HostSimd::avx512) {
      Kokkos::parallel_for(
          "telar::MaxPool::backward_input_2x2",
          Kokkos::RangePolicy<Exec>(exec, 0, g.out_rows(dy.extent(0))), [=](std::size_t r) {
            Row2x2 const w(g, r);
            float* const top = dx.data() + w.in;
            maxpool_2x2_backward_row_avx512(top, top + w.w_in, dy.data() + w.out,
                                            idx.data() + w.out, g.out[2], w.first, w.w_in);
          });
      return;
    }
  }
#endif
  Kokkos::parallel_for(
      "telar::MaxPool::backward_input_2x2",
      Kokkos::RangePolicy<Exec>(exec, 0, g.out_rows(dy.extent(0))), KOKKOS_LAMBDA(std::size_t r) {
        Row2x2 const row(g, r);
        int const w_in = row.w_in, first = row.first;
        T* const top = dx.data() + row.in;
        T* const bottom = top + w_in;
        auto const* const grad = dy.data() + row.out;
        int const* const arg = idx.data() + row.out;
        for (int ow = 0; ow < g.out[2]; ++ow) {
          int const w = 2 * ow, at = arg[ow] - first;
          T const d = grad[ow];
          top[w] = at == w ? d : T(0);
          top[w + 1] = at == w + 1 ? d : T(0);
          bottom[w] = at == w_in + w ? d : T(0);
          bottom[w + 1] = at == w_in + w + 1 ? d : T(0);
        }
      });
}

} // namespace telar::detail
