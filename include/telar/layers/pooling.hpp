#pragma once
/*! \file
 *  \brief Pooling layers over samples [C, H, W] and [C, D, H, W]:
 *  telar::MaxPool2D, telar::MaxPool3D, telar::AvgPool2D, telar::AvgPool3D
 *  (with PyTorch's ceil_mode and count_include_pad), telar::GlobalAvgPool
 *  and telar::GlobalMaxPool ([C, ...] -> [C]).
 *
 *  Backward passes are gathers (each input element sums the output gradients
 *  of the windows that cover it), so no atomics are needed.
 *  \code
 *  telar::MaxPool2D<float> pool(2);          // 2x2 windows, stride 2
 *  telar::GlobalAvgPool<float> gap;          // [C, H, W] -> [C]
 *  telar::AvgPool3D<float> avg(3, 2, 1, true, false); // ceil_mode, pads not counted
 *  \endcode
 */
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/detail/maxpool_2x2.hpp>
#include <telar/layers/detail/pool_geometry.hpp>
#include <telar/layers/detail/spatial_row.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>

namespace telar {

namespace detail {

// Position ((d H + h) W + w in the plane) of the maximum of window ow along W
// within rows [dlo, dhi) x [hlo, hhi); ties keep the first in row-major
// order. The maximum stays in registers (writing it through a reference into
// y would alias x and cost a store per element). Tiled windows need no
// clipping.
template <bool Tiled, class T>
KOKKOS_INLINE_FUNCTION int pool_window_max(PoolGeometry const& g, T const* in, int const (&dr)[2],
                                           int const (&hr)[2], int ow) {
  int wlo, whi;
  if constexpr (Tiled)
    wlo = ow * g.k[2], whi = wlo + g.k[2];
  else
    g.clip(2, ow, wlo, whi);
  int best = (dr[0] * g.in[1] + hr[0]) * g.in[2] + wlo;
  T m = in[best];
  for (int d = dr[0]; d < dr[1]; ++d)
    for (int h = hr[0]; h < hr[1]; ++h)
      for (int w = wlo; w < whi; ++w) {
        int const at = (d * g.in[1] + h) * g.in[2] + w;
        if (in[at] > m) {
          m = in[at];
          best = at;
        }
      }
  return best;
}

// Along axis a, the elements of the other grid that element j of a pass's
// grid reads: forward (j an output) its window clipped to the input,
// backward (j an input) the outputs whose windows cover it.
template <int Dims, bool Backward>
KOKKOS_INLINE_FUNCTION void pool_range(PoolGeometry const& g, int a, int j, int& lo, int& hi) {
  if constexpr (Backward) {
    if (a == 0)
      pool_cover_d<Dims>(g, j, lo, hi);
    else
      g.cover(a, j, lo, hi);
  } else {
    if (a == 0)
      pool_clip_d<Dims>(g, j, lo, hi);
    else
      g.clip(a, j, lo, hi);
  }
}

// The box sums of average pooling (both passes) and of max pooling's
// general backward, one thread per row (plane, d, h) of the grid z they
// write (the output forward, the input backward): element w of the row is
// scale(row, w) times the sum of term(row, w, a, b, c) over the elements
// (a, b, c) of the other grid's plane that pool_range gives it.
template <int Dims, bool Backward, class Exec, class Z, class Term, class Scale>
void pool_row_sums(char const* label, Exec const& exec, PoolGeometry const g, Z const& z, Term term,
                   Scale scale) {
  using T = typename Z::non_const_value_type;
  std::size_t const rows = Backward ? g.in_rows(z.extent(0)) : g.out_rows(z.extent(0));
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<Exec>(exec, 0, rows), KOKKOS_LAMBDA(std::size_t r) {
        int const* ext = Backward ? g.in : g.out;
        SpatialRow const row(r, ext[0], ext[1]);
        T* out = z.data() + r * std::size_t(ext[2]);
        int dlo, dhi, hlo, hhi;
        pool_range<Dims, Backward>(g, 0, row.d, dlo, dhi);
        pool_range<Dims, Backward>(g, 1, row.h, hlo, hhi);
        for (int w = 0; w < ext[2]; ++w) {
          int wlo, whi;
          pool_range<Dims, Backward>(g, 2, w, wlo, whi);
          T acc = 0;
          for (int a = dlo; a < dhi; ++a)
            for (int b = hlo; b < hhi; ++b)
              for (int c = wlo; c < whi; ++c)
                acc += term(row, w, a, b, c);
          out[w] = acc * scale(row, w);
        }
      });
}

// y = window maxima, idx = position of each maximum in its plane.
template <int Dims, bool Tiled, class Exec, class X, class Y, class I>
void maxpool_forward_kernel(Exec const& exec, PoolGeometry const g, X const& x, Y const& y,
                            I const& idx) {
  using T = typename Y::non_const_value_type;
  Kokkos::parallel_for(
      Tiled ? "telar::MaxPool::forward_tiled" : "telar::MaxPool::forward",
      Kokkos::RangePolicy<Exec>(exec, 0, g.out_rows(x.extent(0))), KOKKOS_LAMBDA(std::size_t r) {
        SpatialRow const o(r, g.out[0], g.out[1]);
        auto const* in = x.data() + o.plane * g.in_plane();
        T* out = y.data() + r * std::size_t(g.out[2]);
        int* arg = idx.data() + r * std::size_t(g.out[2]);
        int dr[2], hr[2];
        pool_clip_d<Dims>(g, o.d, dr[0], dr[1]);
        g.clip(1, o.h, hr[0], hr[1]);
        for (int ow = 0; ow < g.out[2]; ++ow) {
          int const best = pool_window_max<Tiled>(g, in, dr, hr, ow);
          out[ow] = in[best];
          arg[ow] = best;
        }
      });
}

template <int Dims, class Exec, class X, class Y, class I>
void maxpool_forward(Exec const& exec, PoolGeometry const& g, X const& x, Y const& y,
                     I const& idx) {
  if (pool_2x2(g))
    maxpool_2x2_forward(exec, g, x, y, idx);
  else if (pool_tiled(g))
    maxpool_forward_kernel<Dims, true>(exec, g, x, y, idx);
  else
    maxpool_forward_kernel<Dims, false>(exec, g, x, y, idx);
}

// dx = sum of dy over the windows whose maximum was that element.
template <int Dims, class Exec, class DY, class DX, class I>
void maxpool_backward(Exec const& exec, PoolGeometry const g, DY const& dy, DX const& dx,
                      I const& idx) {
  using T = typename DX::non_const_value_type;
  if (pool_2x2(g))
    return maxpool_2x2_backward(exec, g, dy, dx, idx);
  if (pool_tiled(g)) {
    // Input row (d, h) lies in output row (d / kd, h / kh) only: zero it, then
    // write the gradients of that output row's maxima that fall in it.
    Kokkos::parallel_for(
        "telar::MaxPool::backward_input_tiled",
        Kokkos::RangePolicy<Exec>(exec, 0, g.in_rows(dx.extent(0))), KOKKOS_LAMBDA(std::size_t r) {
          SpatialRow const i(r, g.in[0], g.in[1]);
          T* out = dx.data() + r * std::size_t(g.in[2]);
          for (int w = 0; w < g.in[2]; ++w)
            out[w] = T(0);
          int const od = i.d / g.k[0], oh = i.h / g.k[1];
          if (od >= g.out[0] || oh >= g.out[1])
            return;
          std::size_t const o0 =
              ((i.plane * g.out[0] + std::size_t(od)) * g.out[1] + std::size_t(oh)) * g.out[2];
          int const first = (i.d * g.in[1] + i.h) * g.in[2];
          for (int ow = 0; ow < g.out[2]; ++ow) {
            int const col = idx.data()[o0 + std::size_t(ow)] - first;
            if (col >= 0 && col < g.in[2])
              out[col] = dy.data()[o0 + std::size_t(ow)];
          }
        });
    return;
  }
  pool_row_sums<Dims, true>(
      "telar::MaxPool::backward_input", exec, g, dx,
      KOKKOS_LAMBDA(SpatialRow const& i, int w, int od, int oh, int ow) {
        std::size_t const o =
            i.plane * g.out_plane() + std::size_t((od * g.out[1] + oh) * g.out[2] + ow);
        return idx.data()[o] == (i.d * g.in[1] + i.h) * g.in[2] + w ? T(dy.data()[o]) : T(0);
      },
      KOKKOS_LAMBDA(SpatialRow const&, int) { return T(1); });
}

// 1 / the divisor of window (od, oh, ow) (see PoolGeometry::count), or 1
// when every window has the same divisor, applied once per output instead.
template <bool Uniform, class T>
KOKKOS_INLINE_FUNCTION T pool_inv_count(PoolGeometry const& g, int od, int oh, int ow) {
  if constexpr (Uniform)
    return T(1);
  else
    return T(1) / T(g.count(0, od) * g.count(1, oh) * g.count(2, ow));
}
// pool_inv_count's share applied once per output instead: 1 / (k0 k1 k2)
// when every window has the same divisor, else 1.
template <bool Uniform, class T>
T pool_uniform_scale(PoolGeometry const& g) {
  return Uniform ? T(1) / T(g.k[0] * g.k[1] * g.k[2]) : T(1);
}

// y = window sums / window counts. The divisor is applied as
// pool_inv_count * pool_uniform_scale, one of which is exactly 1.
template <int Dims, bool Uniform, class Exec, class X, class Y>
void avgpool_forward_kernel(Exec const& exec, PoolGeometry const g, X const& x, Y const& y) {
  using T = typename Y::non_const_value_type;
  T const post = pool_uniform_scale<Uniform, T>(g);
  pool_row_sums<Dims, false>(
      "telar::AvgPool::forward", exec, g, y,
      KOKKOS_LAMBDA(SpatialRow const& o, int, int d, int h, int w) {
        return T(x.data()[o.plane * g.in_plane() + std::size_t((d * g.in[1] + h) * g.in[2] + w)]);
      },
      KOKKOS_LAMBDA(SpatialRow const& o, int ow) {
        return pool_inv_count<Uniform, T>(g, o.d, o.h, ow) * post;
      });
}

// dx = sum over the windows covering the element of dy / window count.
template <int Dims, bool Uniform, class Exec, class DY, class DX>
void avgpool_backward_kernel(Exec const& exec, PoolGeometry const g, DY const& dy, DX const& dx) {
  using T = typename DX::non_const_value_type;
  T const post = pool_uniform_scale<Uniform, T>(g);
  pool_row_sums<Dims, true>(
      "telar::AvgPool::backward_input", exec, g, dx,
      KOKKOS_LAMBDA(SpatialRow const& i, int, int od, int oh, int ow) {
        std::size_t const o =
            i.plane * g.out_plane() + std::size_t((od * g.out[1] + oh) * g.out[2] + ow);
        return T(dy.data()[o]) * pool_inv_count<Uniform, T>(g, od, oh, ow);
      },
      KOKKOS_LAMBDA(SpatialRow const&, int) { return post; });
}

template <int Dims, class Exec, class X, class Y>
void avgpool_forward(Exec const& exec, PoolGeometry const& g, X const& x, Y const& y) {
  if (g.uniform)
    avgpool_forward_kernel<Dims, true>(exec, g, x, y);
  else
    avgpool_forward_kernel<Dims, false>(exec, g, x, y);
}

template <int Dims, class Exec, class DY, class DX>
void avgpool_backward(Exec const& exec, PoolGeometry const& g, DY const& dy, DX const& dx) {
  if (g.uniform)
    avgpool_backward_kernel<Dims, true>(exec, g, dy, dx);
  else
    avgpool_backward_kernel<Dims, false>(exec, g, dy, dx);
}

// y(s, c) = mean of x(s, c * S .. c * S + S).
template <class Exec, class X, class Y>
void global_avg_forward(Exec const& exec, X const& x, Y const& y) {
  using T = typename Y::non_const_value_type;
  std::size_t const C = y.extent(1), S = C ? x.extent(1) / C : 0;
  T const scale = T(1) / T(S ? S : 1);
  Kokkos::parallel_for(
      "telar::GlobalAvgPool::forward", Kokkos::RangePolicy<Exec>(exec, 0, y.extent(0) * C),
      KOKKOS_LAMBDA(std::size_t r) {
        auto const* in = x.data() + r * S;
        T acc = 0;
        for (std::size_t i = 0; i < S; ++i)
          acc += in[i];
        y.data()[r] = acc * scale;
      });
}

// dx(s, c * S + i) = dy(s, c) / S.
template <class Exec, class DY, class DX>
void global_avg_backward(Exec const& exec, DY const& dy, DX const& dx) {
  using T = typename DX::non_const_value_type;
  std::size_t const C = dy.extent(1), S = C ? dx.extent(1) / C : 0;
  T const scale = T(1) / T(S ? S : 1);
  Kokkos::parallel_for(
      "telar::GlobalAvgPool::backward_input",
      Kokkos::RangePolicy<Exec>(exec, 0, dx.extent(0) * dx.extent(1)),
      KOKKOS_LAMBDA(std::size_t i) { dx.data()[i] = dy.data()[i / S] * scale; });
}

// Settings of MaxPool and AvgPool.
struct PoolSettings {
  std::size_t k = 2, s = 2, p = 0;
  bool ceil_mode = false;
  bool count_include_pad = true;
};

// Shared settings and shape logic of MaxPool and AvgPool over Dims spatial
// dimensions (cubic windows).
template <int Dims>
class PoolBase {
  static_assert(Dims == 2 || Dims == 3, "telar::MaxPool/AvgPool: 2 or 3 spatial dimensions");

public:
  PoolBase() = default;
  explicit PoolBase(PoolSettings const& o) : o_(o) {
    if (!o_.s)
      o_.s = o_.k;
  }

protected:
  static constexpr char const* layout() { return Dims == 2 ? "[C, H, W]" : "[C, D, H, W]"; }
  // Output extent along one dimension, PyTorch's rule: with ceil_mode the
  // last window may overhang, but must start inside the input or the left
  // padding.
  std::size_t out_extent(std::size_t in) const {
    std::size_t const span = in + 2 * o_.p - o_.k;
    std::size_t out = (span + (o_.ceil_mode ? o_.s - 1 : 0)) / o_.s + 1;
    if (o_.ceil_mode && (out - 1) * o_.s >= in + o_.p)
      --out;
    return out;
  }
  PoolGeometry geometry(Shape const& in, char const* name) const {
    std::string const expect = std::string(name) + " expects inputs " + layout();
    if (in.rank != Dims + 1)
      throw ShapeError(expect + ", got " + in.str());
    if (o_.k < 1 || o_.s < 1 || 2 * o_.p > o_.k)
      throw ShapeError(std::string(name) +
                       ": kernel and stride must be >= 1 and padding at most kernel / 2");
    PoolGeometry g;
    g.C = int(in[0]);
    g.count_pad = o_.count_include_pad;
    for (int a = 3 - Dims, i = 1; a < 3; ++a, ++i) {
      if (in[i] + 2 * o_.p < o_.k)
        throw ShapeError(expect + " with every spatial extent + 2 padding >= kernel (" +
                         std::to_string(o_.k) + "), got " + in.str());
      g.in[a] = int(in[i]);
      g.k[a] = int(o_.k);
      g.s[a] = int(o_.s);
      g.p[a] = g.pb[a] = int(o_.p);
      g.out[a] = int(out_extent(in[i]));
      for (int o = 0; o < g.out[a]; ++o)
        g.uniform = g.uniform && g.count(a, o) == g.k[a];
    }
    return g;
  }
  // The geometry of a slab along the first spatial axis: `in` with its
  // halo rows, `front` / `back` padding rows at the volume's faces only,
  // `out_rows` outputs (see Convolution::build_slab).
  PoolGeometry slab_geometry(Shape const& in, char const* name, std::size_t front, std::size_t back,
                             std::size_t out_rows) const {
    if (o_.ceil_mode)
      throw ShapeError(std::string(name) +
                       ": ceil_mode is not supported on slabs (spatial parallelism)");
    PoolGeometry g = geometry(in, name);
    int const a = 3 - Dims;
    g.p[a] = int(front), g.pb[a] = int(back), g.out[a] = int(out_rows);
    g.uniform = true;
    for (int b = a; b < 3; ++b)
      for (int o = 0; o < g.out[b]; ++o)
        g.uniform = g.uniform && g.count(b, o) == g.k[b];
    return g;
  }

public:
  /*! \brief Window extent (every dimension). */
  std::size_t kernel() const { return o_.k; }
  /*! \brief Step between windows. */
  std::size_t stride() const { return o_.s; }
  /*! \brief Implicit padding on each side. */
  std::size_t padding() const { return o_.p; }

protected:
  Shape output(PoolGeometry const& g) const {
    if constexpr (Dims == 2)
      return Shape{std::size_t(g.C), std::size_t(g.out[1]), std::size_t(g.out[2])};
    else
      return Shape{std::size_t(g.C), std::size_t(g.out[0]), std::size_t(g.out[1]),
                   std::size_t(g.out[2])};
  }
  // Window elements visited in forward.
  double window_flops(std::size_t samples, PoolGeometry const& g) const {
    return double(samples) * g.C * double(g.out_plane()) * g.k[0] * g.k[1] * g.k[2];
  }
  void check(char const* name, char const* what, std::size_t xn, std::size_t xf, std::size_t yn,
             std::size_t yf) const {
    check_layer_call(name, what, built_, g_.C * g_.in_plane(), g_.C * g_.out_plane(), xn, xf, yn,
                     yf);
  }

  PoolSettings o_{};
  PoolGeometry g_{};
  bool built_ = false;
};

// MaxPool's and AvgPool's members over PoolBase that need the layer's
// name() (CRTP): types, shapes, builds, the window count and the checks.
template <class Derived, int Dims, class T, class MemorySpace>
class PoolLayer : protected PoolBase<Dims>, public LayerTypes<T, MemorySpace> {
  using Base = PoolBase<Dims>;
  static constexpr char const* name() { return Derived::name(); }

public:
  using Base::Base;
  /*! \brief [C, Ho, Wo] (or [C, Do, Ho, Wo]) for an input [C, H, W] (or
   *  [C, D, H, W]). \param in input shape
   *  \throws ShapeError for another rank or a window larger than the padded input */
  Shape output_shape(Shape const& in) const { return this->output(this->geometry(in, name())); }
  /*! \brief Builds for one slab of a sample split along its first spatial
   *  axis (spatial parallelism, telar/parallel/spatial_conv.hpp): \p in with
   *  its halo rows, padding only at the volume's faces. \param in the slab's
   *  shape \param front_padding padding rows before it \param back_padding
   *  padding rows after it \param out_rows output rows along the split axis
   *  \throws ShapeError with ceil_mode, or as build for the other axes */
  void build_slab(Shape const& in, std::size_t front_padding, std::size_t back_padding,
                  std::size_t out_rows) {
    this->g_ = this->slab_geometry(in, name(), front_padding, back_padding, out_rows);
    this->built_ = true;
  }
  /*! \brief Window extent. */
  using Base::kernel;
  /*! \brief Implicit padding on each side. */
  using Base::padding;
  /*! \brief Window step. */
  using Base::stride;
  /*! \brief Remembers the input's extents. \param in input shape */
  void build(Shape const& in) {
    this->g_ = this->geometry(in, name());
    this->built_ = true;
  }
  /*! \brief Comparisons or additions in forward. \param samples batch size
   *  \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    return this->window_flops(samples, this->geometry(in, name()));
  }

protected:
  // A call's matrices: `in` [n, input size], `out` [n, output size].
  template <class In, class Out>
  void check_call(char const* what, In const& in, Out const& out) const {
    this->check(name(), what, in.extent(0), in.extent(1), out.extent(0), out.extent(1));
  }
};

// [n, C * S] -> [n, C] with matching rows, for global pooling.
inline void check_global_pool(char const* name, char const* what, std::size_t xn, std::size_t xf,
                              std::size_t yn, std::size_t yf) {
  if (xn != yn || yf == 0 || xf % yf != 0)
    throw ShapeError(std::string("telar::") + name + "::" + what + ": expected [n, C * S] -> " +
                     "[n, C], got [" + std::to_string(xn) + ", " + std::to_string(xf) + "] -> [" +
                     std::to_string(yn) + ", " + std::to_string(yf) + "]");
}

// [C] for an input [C, ...] of rank 2 to 4.
inline Shape global_pool_shape(char const* name, Shape const& in) {
  if (in.rank < 2 || in.rank > Shape::max_rank || in.size() == 0)
    throw ShapeError(std::string(name) +
                     " expects inputs [C, H, W] (or [C, L], [C, D, H, W]), got " + in.str());
  return Shape(in[0]);
}

// y(s, c) = max of x(s, c * S .. c * S + S), idx = its offset (the first of ties).
template <class Exec, class X, class Y, class I>
void global_max_forward(Exec const& exec, X const& x, Y const& y, I const& idx) {
  using T = typename Y::non_const_value_type;
  std::size_t const C = y.extent(1), S = C ? x.extent(1) / C : 0;
  Kokkos::parallel_for(
      "telar::GlobalMaxPool::forward", Kokkos::RangePolicy<Exec>(exec, 0, y.extent(0) * C),
      KOKKOS_LAMBDA(std::size_t r) {
        auto const* in = x.data() + r * S;
        int best = 0;
        T m = in[0];
        for (std::size_t i = 1; i < S; ++i)
          if (in[i] > m) {
            m = in[i];
            best = int(i);
          }
        y.data()[r] = m;
        idx.data()[r] = best;
      });
}

// dx(s, c * S + i) = dy(s, c) where i is the channel's maximum, else 0.
template <class Exec, class DY, class DX, class I>
void global_max_backward(Exec const& exec, DY const& dy, DX const& dx, I const& idx) {
  using T = typename DX::non_const_value_type;
  std::size_t const C = dy.extent(1), S = C ? dx.extent(1) / C : 0;
  Kokkos::parallel_for(
      "telar::GlobalMaxPool::backward_input",
      Kokkos::RangePolicy<Exec>(exec, 0, dx.extent(0) * dx.extent(1)),
      KOKKOS_LAMBDA(std::size_t i) {
        std::size_t const r = i / S;
        dx.data()[i] = std::size_t(idx.data()[r]) == i % S ? T(dy.data()[r]) : T(0);
      });
}

// A per-micro-batch int matrix [rows, cols], reallocated only when its
// extents change.
template <class MemorySpace>
void ensure_index_matrix(Kokkos::View<int**, Kokkos::LayoutRight, MemorySpace>& v, std::size_t rows,
                         std::size_t cols, char const* label) {
  if (v.extent(0) != rows || v.extent(1) != cols)
    v = Kokkos::View<int**, Kokkos::LayoutRight, MemorySpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), rows, cols);
}

} // namespace detail

/*! \brief Max pooling over cubic windows of samples [C, H, W] (Dims = 2) or
 *  [C, D, H, W] (Dims = 3), with stride, (implicit -infinity) padding and
 *  PyTorch's ceil_mode; keeps the position of each maximum for backward
 *  (ties: the first in row-major order). Use telar::MaxPool2D or
 *  telar::MaxPool3D.
 *  \tparam Dims spatial dimensions (2 or 3) \tparam T value type
 *  \tparam MemorySpace memory space */
template <int Dims, class T = float, class MemorySpace = DefaultMemorySpace>
class MaxPool : public detail::PoolLayer<MaxPool<Dims, T, MemorySpace>, Dims, T, MemorySpace> {
  using Base = detail::PoolLayer<MaxPool, Dims, T, MemorySpace>;

public:
  /*! \brief Backward reads only the positions of the maxima. */
  static constexpr BackwardReads backward_reads = BackwardReads::nothing;
  /*! \brief Position ((d H + h) W + w within its channel) of each output's maximum. */
  struct saved_type {
    Kokkos::View<int**, Kokkos::LayoutRight, MemorySpace> argmax; //!< [n, output size]
  };

  /*! \brief 2-wide windows, stride 2. */
  MaxPool() = default;
  /*! \brief \param kernel window extent \param stride step (default: kernel)
   *  \param padding implicit padding on each side (at most kernel / 2)
   *  \param ceil_mode round the output extent up (PyTorch's ceil_mode): the
   *  last window may overhang the input, but starts inside it or the left padding */
  explicit MaxPool(std::size_t kernel, std::size_t stride = 0, std::size_t padding = 0,
                   bool ceil_mode = false)
      : Base({kernel, stride, padding, ceil_mode, true}) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return Dims == 2 ? "MaxPool2D" : "MaxPool3D"; }
  /*! \brief The argmax of every output. \param samples rows \param in input shape */
  std::size_t saved_bytes(std::size_t samples, Shape const& in) const {
    return detail::view_bytes<int>(samples * this->output_shape(in).size());
  }
  /*! \brief y = window maxima. \param exec execution space instance
   *  \param x input [n, C*D*H*W] \param y output [n, C*Do*Ho*Wo] \param saved keeps the argmax */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type& saved) const {
    this->check_call("forward", x, y);
    detail::ensure_index_matrix(saved.argmax, y.extent(0), y.extent(1), "telar::MaxPool::argmax");
    detail::maxpool_forward<Dims>(exec, this->g_, x, y, saved.argmax);
  }
  /*! \brief dx = dy routed to each window's maximum. \param exec execution space instance
   *  \param dy gradient of the output \param dx gradient of the input \param saved argmax */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      saved_type const& saved) const {
    this->check_call("backward_input", dx, dy);
    detail::maxpool_backward<Dims>(exec, this->g_, dy, dx, saved.argmax);
  }
};

/*! \brief Average pooling over cubic windows of samples [C, H, W] (Dims = 2)
 *  or [C, D, H, W] (Dims = 3), with stride, zero padding and PyTorch's
 *  ceil_mode and count_include_pad. Use telar::AvgPool2D or telar::AvgPool3D.
 *  \tparam Dims spatial dimensions (2 or 3) \tparam T value type
 *  \tparam MemorySpace memory space */
template <int Dims, class T = float, class MemorySpace = DefaultMemorySpace>
class AvgPool : public detail::PoolLayer<AvgPool<Dims, T, MemorySpace>, Dims, T, MemorySpace> {
  using Base = detail::PoolLayer<AvgPool, Dims, T, MemorySpace>;

public:
  /*! \brief 2-wide windows, stride 2. */
  AvgPool() = default;
  /*! \brief \param kernel window extent \param stride step (default: kernel)
   *  \param padding zero padding on each side (at most kernel / 2)
   *  \param ceil_mode round the output extent up (PyTorch's ceil_mode); an
   *  overhanging window divides by its part inside the padded input
   *  \param count_include_pad divide by the window's size including padding
   *  (PyTorch's default) rather than by the input elements it covers */
  explicit AvgPool(std::size_t kernel, std::size_t stride = 0, std::size_t padding = 0,
                   bool ceil_mode = false, bool count_include_pad = true)
      : Base({kernel, stride, padding, ceil_mode, count_include_pad}) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return Dims == 2 ? "AvgPool2D" : "AvgPool3D"; }
  /*! \brief 0: nothing is kept. */
  std::size_t saved_bytes(std::size_t, Shape const&) const { return 0; }
  /*! \brief y = window means. \param exec execution space instance
   *  \param x input [n, C*D*H*W] \param y output [n, C*Do*Ho*Wo] */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               NoSaved&) const {
    this->check_call("forward", x, y);
    detail::avgpool_forward<Dims>(exec, this->g_, x, y);
  }
  /*! \brief dx = dy spread evenly over each window. \param exec execution space instance
   *  \param dy gradient of the output \param dx gradient of the input */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      NoSaved const&) const {
    this->check_call("backward_input", dx, dy);
    detail::avgpool_backward<Dims>(exec, this->g_, dy, dx);
  }
};

/*! \brief Max pooling over samples [C, H, W]. \tparam T value type \tparam MemorySpace memory space
 */
template <class T = float, class MemorySpace = DefaultMemorySpace>
using MaxPool2D = MaxPool<2, T, MemorySpace>;
/*! \brief Max pooling over samples [C, D, H, W]. \tparam T value type \tparam MemorySpace memory
 * space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
using MaxPool3D = MaxPool<3, T, MemorySpace>;
/*! \brief Average pooling over samples [C, H, W]. \tparam T value type \tparam MemorySpace memory
 * space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
using AvgPool2D = AvgPool<2, T, MemorySpace>;
/*! \brief Average pooling over samples [C, D, H, W]. \tparam T value type \tparam MemorySpace
 * memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
using AvgPool3D = AvgPool<3, T, MemorySpace>;

/*! \brief Global max pooling: [C, H, W] (or [C, L], [C, D, H, W]) -> [C],
 *  the maximum of each channel; keeps its position for backward (ties: the
 *  first). \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct GlobalMaxPool : public detail::LayerTypes<T, MemorySpace> {
  /*! \brief Backward reads only the positions of the maxima. */
  static constexpr BackwardReads backward_reads = BackwardReads::nothing;
  /*! \brief Position of each channel's maximum within the channel. */
  struct saved_type {
    Kokkos::View<int**, Kokkos::LayoutRight, MemorySpace> argmax; //!< [n, C]
  };

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "GlobalMaxPool"; }
  /*! \brief [C] for an input [C, ...] of rank 2 to 4. \param in input shape
   *  \throws ShapeError for a rank-1 or unknown shape */
  Shape output_shape(Shape const& in) const { return detail::global_pool_shape(name(), in); }
  /*! \brief Comparisons in forward. \param samples batch size \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    return double(samples) * double(in.size());
  }
  /*! \brief The argmax of every channel. \param samples rows \param in input shape */
  std::size_t saved_bytes(std::size_t samples, Shape const& in) const {
    return samples * output_shape(in).size() * sizeof(int);
  }
  /*! \brief y = channel maxima. \param exec execution space instance
   *  \param x input [n, C*S] \param y output [n, C] \param saved keeps the argmax */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type& saved) const {
    detail::check_global_pool(name(), "forward", x.extent(0), x.extent(1), y.extent(0),
                              y.extent(1));
    detail::ensure_index_matrix(saved.argmax, y.extent(0), y.extent(1),
                                "telar::GlobalMaxPool::argmax");
    detail::global_max_forward(exec, x, y, saved.argmax);
  }
  /*! \brief dx = dy at each channel's maximum, 0 elsewhere. \param exec execution space
   *  instance \param dy gradient of the output \param dx gradient of the input
   *  \param saved argmax */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      saved_type const& saved) const {
    detail::check_global_pool(name(), "backward_input", dx.extent(0), dx.extent(1), dy.extent(0),
                              dy.extent(1));
    detail::global_max_backward(exec, dy, dx, saved.argmax);
  }
};

/*! \brief Global average pooling: [C, H, W] (or [C, L], [C, D, H, W]) -> [C],
 *  the mean of each channel.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct GlobalAvgPool : public detail::LayerTypes<T, MemorySpace> {
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "GlobalAvgPool"; }
  /*! \brief [C] for an input [C, ...] of rank 2 to 4. \param in input shape
   *  \throws ShapeError for a rank-1 or unknown shape */
  Shape output_shape(Shape const& in) const { return detail::global_pool_shape(name(), in); }
  /*! \brief Additions in forward. \param samples batch size \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    return double(samples) * double(in.size());
  }
  /*! \brief y = channel means. \param exec execution space instance
   *  \param x input [n, C*S] \param y output [n, C] */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               NoSaved&) const {
    detail::check_global_pool(name(), "forward", x.extent(0), x.extent(1), y.extent(0),
                              y.extent(1));
    detail::global_avg_forward(exec, x, y);
  }
  /*! \brief dx = dy / S spread over each channel. \param exec execution space instance
   *  \param dy gradient of the output \param dx gradient of the input */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      NoSaved const&) const {
    detail::check_global_pool(name(), "backward_input", dx.extent(0), dx.extent(1), dy.extent(0),
                              dy.extent(1));
    detail::global_avg_backward(exec, dy, dx);
  }
};

} // namespace telar
