#pragma once
/*! \file
 *  \brief Pooling layers over samples [C, H, W]: telar::MaxPool2D,
 *  telar::AvgPool2D and telar::GlobalAvgPool ([C, ...] -> [C]).
 *
 *  Backward passes are gathers (each input element sums the output gradients
 *  of the windows that cover it), so no atomics are needed.
 *  \code
 *  telar::MaxPool2D<float> pool(2);          // 2x2 windows, stride 2
 *  telar::GlobalAvgPool<float> gap;          // [C, H, W] -> [C]
 *  \endcode
 */
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>

namespace telar {

namespace detail {

// Sizes of a 2-D pooling over [C, H, W], passed by value to kernels.
struct PoolGeometry {
  int C = 0, H = 0, W = 0;
  int k = 1, s = 1, p = 0;
  int Ho = 0, Wo = 0;
};

// First and one-past-last output index whose window [o s - p, o s - p + k)
// covers input index i.
KOKKOS_INLINE_FUNCTION void pool_cover(int i, int k, int s, int p, int out, int& lo, int& hi) {
  int const t = i + p - k + 1;
  lo = t <= 0 ? 0 : (t + s - 1) / s;
  hi = (i + p) / s + 1;
  if (hi > out)
    hi = out;
}

// Windows that tile the input without padding or overlap (stride = kernel,
// the usual 2 x 2 / 2): fast paths with no bounds checks and, backward, a
// scatter of each output gradient to its maximum instead of a gather.
KOKKOS_INLINE_FUNCTION bool pool_tiled(PoolGeometry const& g) {
  return g.p == 0 && g.s == g.k;
}

// y = window maxima, idx = position (h * W + w) of each maximum in its plane.
template <class Exec, class X, class Y, class I>
void maxpool_forward(Exec const& exec, PoolGeometry const g, X const& x, Y const& y, I const& idx) {
  using T = typename Y::non_const_value_type;
  std::size_t const rows = x.extent(0) * std::size_t(g.C) * std::size_t(g.Ho);
  if (pool_tiled(g)) {
    Kokkos::parallel_for(
        "telar::MaxPool2D::forward_tiled", Kokkos::RangePolicy<Exec>(exec, 0, rows),
        KOKKOS_LAMBDA(std::size_t r) {
          int const oh = int(r % std::size_t(g.Ho));
          std::size_t const plane = r / std::size_t(g.Ho); // s * C + c
          int const h0 = oh * g.k;
          auto const* in = x.data() + plane * std::size_t(g.H) * std::size_t(g.W);
          T* out = y.data() + r * std::size_t(g.Wo);
          int* arg = idx.data() + r * std::size_t(g.Wo);
          for (int ow = 0; ow < g.Wo; ++ow) {
            int const w0 = ow * g.k;
            int best = h0 * g.W + w0;
            T m = in[best];
            for (int h = h0; h < h0 + g.k; ++h)
              for (int w = w0; w < w0 + g.k; ++w) {
                T const v = in[h * g.W + w];
                if (v > m) { // ties keep the first in row-major order
                  m = v;
                  best = h * g.W + w;
                }
              }
            out[ow] = m;
            arg[ow] = best;
          }
        });
    return;
  }
  Kokkos::parallel_for(
      "telar::MaxPool2D::forward", Kokkos::RangePolicy<Exec>(exec, 0, rows),
      KOKKOS_LAMBDA(std::size_t r) {
        int const oh = int(r % std::size_t(g.Ho));
        std::size_t const plane = r / std::size_t(g.Ho); // s * C + c
        auto const* in = x.data() + plane * std::size_t(g.H) * std::size_t(g.W);
        T* out = y.data() + plane * std::size_t(g.Ho) * std::size_t(g.Wo) +
                 std::size_t(oh) * std::size_t(g.Wo);
        int* arg = idx.data() + plane * std::size_t(g.Ho) * std::size_t(g.Wo) +
                   std::size_t(oh) * std::size_t(g.Wo);
        int const h0 = oh * g.s - g.p;
        for (int ow = 0; ow < g.Wo; ++ow) {
          int const w0 = ow * g.s - g.p;
          int best = -1;
          T m = T(0);
          for (int h = h0 < 0 ? 0 : h0; h < h0 + g.k && h < g.H; ++h)
            for (int w = w0 < 0 ? 0 : w0; w < w0 + g.k && w < g.W; ++w) {
              T const v = in[h * g.W + w];
              if (best < 0 || v > m) {
                m = v;
                best = h * g.W + w;
              }
            }
          out[ow] = m;
          arg[ow] = best;
        }
      });
}

// dx(h, w) = sum of dy over the windows whose maximum was (h, w).
template <class Exec, class DY, class DX, class I>
void maxpool_backward(Exec const& exec, PoolGeometry const g, DY const& dy, DX const& dx,
                      I const& idx) {
  using T = typename DX::non_const_value_type;
  std::size_t const rows = dx.extent(0) * std::size_t(g.C) * std::size_t(g.H);
  if (pool_tiled(g)) {
    // Input row h lies in output row h / k only: zero it, then write the
    // gradients of that output row's maxima that fall in it.
    Kokkos::parallel_for(
        "telar::MaxPool2D::backward_input_tiled", Kokkos::RangePolicy<Exec>(exec, 0, rows),
        KOKKOS_LAMBDA(std::size_t r) {
          int const h = int(r % std::size_t(g.H));
          std::size_t const plane = r / std::size_t(g.H);
          T* out = dx.data() + r * std::size_t(g.W);
          for (int w = 0; w < g.W; ++w)
            out[w] = T(0);
          int const oh = h / g.k;
          if (oh >= g.Ho)
            return;
          std::size_t const o0 = (plane * std::size_t(g.Ho) + std::size_t(oh)) * std::size_t(g.Wo);
          int const first = h * g.W;
          for (int ow = 0; ow < g.Wo; ++ow) {
            int const col = idx.data()[o0 + std::size_t(ow)] - first;
            if (col >= 0 && col < g.W)
              out[col] = dy.data()[o0 + std::size_t(ow)];
          }
        });
    return;
  }
  Kokkos::parallel_for(
      "telar::MaxPool2D::backward_input", Kokkos::RangePolicy<Exec>(exec, 0, rows),
      KOKKOS_LAMBDA(std::size_t r) {
        int const h = int(r % std::size_t(g.H));
        std::size_t const plane = r / std::size_t(g.H);
        std::size_t const obase = plane * std::size_t(g.Ho) * std::size_t(g.Wo);
        T* out = dx.data() + plane * std::size_t(g.H) * std::size_t(g.W) +
                 std::size_t(h) * std::size_t(g.W);
        int hlo, hhi;
        pool_cover(h, g.k, g.s, g.p, g.Ho, hlo, hhi);
        for (int w = 0; w < g.W; ++w) {
          int wlo, whi;
          pool_cover(w, g.k, g.s, g.p, g.Wo, wlo, whi);
          int const me = h * g.W + w;
          T acc = 0;
          for (int oh = hlo; oh < hhi; ++oh)
            for (int ow = wlo; ow < whi; ++ow) {
              std::size_t const o = obase + std::size_t(oh * g.Wo + ow);
              if (idx.data()[o] == me)
                acc += dy.data()[o];
            }
          out[w] = acc;
        }
      });
}

// y = window sums / k^2 (padding counts as zeros, as PyTorch's default).
template <class Exec, class X, class Y>
void avgpool_forward(Exec const& exec, PoolGeometry const g, X const& x, Y const& y) {
  using T = typename Y::non_const_value_type;
  std::size_t const rows = x.extent(0) * std::size_t(g.C) * std::size_t(g.Ho);
  T const scale = T(1) / T(g.k * g.k);
  Kokkos::parallel_for(
      "telar::AvgPool2D::forward", Kokkos::RangePolicy<Exec>(exec, 0, rows),
      KOKKOS_LAMBDA(std::size_t r) {
        int const oh = int(r % std::size_t(g.Ho));
        std::size_t const plane = r / std::size_t(g.Ho);
        auto const* in = x.data() + plane * std::size_t(g.H) * std::size_t(g.W);
        T* out = y.data() + plane * std::size_t(g.Ho) * std::size_t(g.Wo) +
                 std::size_t(oh) * std::size_t(g.Wo);
        int const h0 = oh * g.s - g.p;
        for (int ow = 0; ow < g.Wo; ++ow) {
          int const w0 = ow * g.s - g.p;
          T acc = 0;
          for (int h = h0 < 0 ? 0 : h0; h < h0 + g.k && h < g.H; ++h)
            for (int w = w0 < 0 ? 0 : w0; w < w0 + g.k && w < g.W; ++w)
              acc += in[h * g.W + w];
          out[ow] = acc * scale;
        }
      });
}

// dx(h, w) = sum of dy over the windows covering (h, w), / k^2.
template <class Exec, class DY, class DX>
void avgpool_backward(Exec const& exec, PoolGeometry const g, DY const& dy, DX const& dx) {
  using T = typename DX::non_const_value_type;
  std::size_t const rows = dx.extent(0) * std::size_t(g.C) * std::size_t(g.H);
  T const scale = T(1) / T(g.k * g.k);
  Kokkos::parallel_for(
      "telar::AvgPool2D::backward_input", Kokkos::RangePolicy<Exec>(exec, 0, rows),
      KOKKOS_LAMBDA(std::size_t r) {
        int const h = int(r % std::size_t(g.H));
        std::size_t const plane = r / std::size_t(g.H);
        auto const* src = dy.data() + plane * std::size_t(g.Ho) * std::size_t(g.Wo);
        T* out = dx.data() + plane * std::size_t(g.H) * std::size_t(g.W) +
                 std::size_t(h) * std::size_t(g.W);
        int hlo, hhi;
        pool_cover(h, g.k, g.s, g.p, g.Ho, hlo, hhi);
        for (int w = 0; w < g.W; ++w) {
          int wlo, whi;
          pool_cover(w, g.k, g.s, g.p, g.Wo, wlo, whi);
          T acc = 0;
          for (int oh = hlo; oh < hhi; ++oh)
            for (int ow = wlo; ow < whi; ++ow)
              acc += src[oh * g.Wo + ow];
          out[w] = acc * scale;
        }
      });
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

// Shared settings and shape logic of MaxPool2D and AvgPool2D.
class Pool2DBase {
public:
  Pool2DBase() = default;
  Pool2DBase(std::size_t kernel, std::size_t stride, std::size_t padding)
      : k_(kernel), s_(stride), p_(padding) {}

protected:
  PoolGeometry geometry(Shape const& in, char const* name) const {
    std::string const expect = std::string(name) + " expects inputs [C, H, W]";
    if (in.rank != 3)
      throw ShapeError(expect + ", got " + in.str());
    if (k_ < 1 || s_ < 1 || 2 * p_ > k_)
      throw ShapeError(std::string(name) +
                       ": kernel and stride must be >= 1 and padding at most kernel / 2");
    if (in[1] + 2 * p_ < k_ || in[2] + 2 * p_ < k_)
      throw ShapeError(expect + " with H + 2 padding and W + 2 padding >= kernel (" +
                       std::to_string(k_) + "), got " + in.str());
    PoolGeometry g;
    g.C = int(in[0]);
    g.H = int(in[1]);
    g.W = int(in[2]);
    g.k = int(k_);
    g.s = int(s_);
    g.p = int(p_);
    g.Ho = int((in[1] + 2 * p_ - k_) / s_ + 1);
    g.Wo = int((in[2] + 2 * p_ - k_) / s_ + 1);
    return g;
  }
  void check(char const* name, char const* what, std::size_t xn, std::size_t xf, std::size_t yn,
             std::size_t yf) const {
    if (!built_)
      throw Error(std::string("telar::") + name + "::" + what +
                  ": call build(input shape) first (telar::Sequential does)");
    std::size_t const in = std::size_t(g_.C) * g_.H * g_.W, out = std::size_t(g_.C) * g_.Ho * g_.Wo;
    if (xn != yn || xf != in || yf != out)
      throw ShapeError(std::string("telar::") + name + "::" + what + ": expected [n, " +
                       std::to_string(in) + "] -> [n, " + std::to_string(out) + "], got [" +
                       std::to_string(xn) + ", " + std::to_string(xf) + "] -> [" +
                       std::to_string(yn) + ", " + std::to_string(yf) + "]");
  }

  std::size_t k_ = 2, s_ = 2, p_ = 0;
  PoolGeometry g_{};
  bool built_ = false;
};

} // namespace detail

/*! \brief Max pooling over k x k windows of samples [C, H, W], with stride
 *  and (implicit -infinity) padding; keeps the position of each maximum for
 *  backward (ties: the first in row-major order).
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
class MaxPool2D : detail::Pool2DBase {
public:
  /*! \brief Scalar type. */
  using value_type = T;
  /*! \brief Memory space of activations. */
  using memory_space = MemorySpace;
  /*! \brief Position (h * W + w within its channel) of each output's maximum. */
  struct saved_type {
    Kokkos::View<int**, Kokkos::LayoutRight, MemorySpace> argmax; //!< [n, C * Ho * Wo]
  };

  /*! \brief 2 x 2 windows, stride 2. */
  MaxPool2D() = default;
  /*! \brief \param kernel window extent \param stride step (default: kernel)
   *  \param padding implicit padding on each side (at most kernel / 2) */
  explicit MaxPool2D(std::size_t kernel, std::size_t stride = 0, std::size_t padding = 0)
      : Pool2DBase(kernel, stride ? stride : kernel, padding) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "MaxPool2D"; }
  /*! \brief [C, Ho, Wo] for an input [C, H, W]. \param in input shape
   *  \throws ShapeError for another rank or a window larger than the padded input */
  Shape output_shape(Shape const& in) const {
    auto const g = geometry(in, name());
    return Shape{std::size_t(g.C), std::size_t(g.Ho), std::size_t(g.Wo)};
  }
  /*! \brief Remembers the input's extents. \param in input shape */
  void build(Shape const& in) {
    g_ = geometry(in, name());
    built_ = true;
  }
  /*! \brief Comparisons in forward. \param samples batch size \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    auto const g = geometry(in, name());
    return double(samples) * g.C * g.Ho * g.Wo * g.k * g.k;
  }
  /*! \brief The argmax of every output. \param samples rows \param in input shape */
  std::size_t saved_bytes(std::size_t samples, Shape const& in) const {
    return detail::view_bytes<int>(samples * output_shape(in).size());
  }
  /*! \brief y = window maxima. \param exec execution space instance
   *  \param x input [n, C*H*W] \param y output [n, C*Ho*Wo] \param saved keeps the argmax */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type& saved) const {
    check(name(), "forward", x.extent(0), x.extent(1), y.extent(0), y.extent(1));
    if (saved.argmax.extent(0) != y.extent(0) || saved.argmax.extent(1) != y.extent(1))
      saved.argmax = Kokkos::View<int**, Kokkos::LayoutRight, MemorySpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::MaxPool2D::argmax"), y.extent(0),
          y.extent(1));
    detail::maxpool_forward(exec, g_, x, y, saved.argmax);
  }
  /*! \brief dx = dy routed to each window's maximum. \param exec execution space instance
   *  \param dy gradient of the output \param dx gradient of the input \param saved argmax */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      saved_type const& saved) const {
    check(name(), "backward_input", dx.extent(0), dx.extent(1), dy.extent(0), dy.extent(1));
    detail::maxpool_backward(exec, g_, dy, dx, saved.argmax);
  }
};

/*! \brief Average pooling over k x k windows of samples [C, H, W], with
 *  stride and zero padding counted in the average (PyTorch's default).
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
class AvgPool2D : detail::Pool2DBase {
public:
  /*! \brief Scalar type. */
  using value_type = T;
  /*! \brief Memory space of activations. */
  using memory_space = MemorySpace;

  /*! \brief 2 x 2 windows, stride 2. */
  AvgPool2D() = default;
  /*! \brief \param kernel window extent \param stride step (default: kernel)
   *  \param padding zero padding on each side (at most kernel / 2) */
  explicit AvgPool2D(std::size_t kernel, std::size_t stride = 0, std::size_t padding = 0)
      : Pool2DBase(kernel, stride ? stride : kernel, padding) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "AvgPool2D"; }
  /*! \brief [C, Ho, Wo] for an input [C, H, W]. \param in input shape
   *  \throws ShapeError for another rank or a window larger than the padded input */
  Shape output_shape(Shape const& in) const {
    auto const g = geometry(in, name());
    return Shape{std::size_t(g.C), std::size_t(g.Ho), std::size_t(g.Wo)};
  }
  /*! \brief Remembers the input's extents. \param in input shape */
  void build(Shape const& in) {
    g_ = geometry(in, name());
    built_ = true;
  }
  /*! \brief Additions in forward. \param samples batch size \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    auto const g = geometry(in, name());
    return double(samples) * g.C * g.Ho * g.Wo * g.k * g.k;
  }
  /*! \brief y = window means. \param exec execution space instance
   *  \param x input [n, C*H*W] \param y output [n, C*Ho*Wo] */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               NoSaved&) const {
    check(name(), "forward", x.extent(0), x.extent(1), y.extent(0), y.extent(1));
    detail::avgpool_forward(exec, g_, x, y);
  }
  /*! \brief dx = dy spread evenly over each window. \param exec execution space instance
   *  \param dy gradient of the output \param dx gradient of the input */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      NoSaved const&) const {
    check(name(), "backward_input", dx.extent(0), dx.extent(1), dy.extent(0), dy.extent(1));
    detail::avgpool_backward(exec, g_, dy, dx);
  }
};

/*! \brief Global average pooling: [C, H, W] (or [C, L], [C, D, H, W]) -> [C],
 *  the mean of each channel.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct GlobalAvgPool {
  /*! \brief Scalar type. */
  using value_type = T;
  /*! \brief Memory space of activations. */
  using memory_space = MemorySpace;

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "GlobalAvgPool"; }
  /*! \brief [C] for an input [C, ...] of rank 2 to 4. \param in input shape
   *  \throws ShapeError for a rank-1 or unknown shape */
  Shape output_shape(Shape const& in) const {
    if (in.rank < 2 || in.rank > Shape::max_rank || in.size() == 0)
      throw ShapeError("GlobalAvgPool expects inputs [C, H, W] (or [C, L], [C, D, H, W]), got " +
                       in.str());
    return Shape(in[0]);
  }
  /*! \brief Additions in forward. \param samples batch size \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    return double(samples) * double(in.size());
  }
  /*! \brief y = channel means. \param exec execution space instance
   *  \param x input [n, C*S] \param y output [n, C] */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               NoSaved&) const {
    check("forward", x.extent(0), x.extent(1), y.extent(0), y.extent(1));
    detail::global_avg_forward(exec, x, y);
  }
  /*! \brief dx = dy / S spread over each channel. \param exec execution space instance
   *  \param dy gradient of the output \param dx gradient of the input */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      NoSaved const&) const {
    check("backward_input", dx.extent(0), dx.extent(1), dy.extent(0), dy.extent(1));
    detail::global_avg_backward(exec, dy, dx);
  }

private:
  static void check(char const* what, std::size_t xn, std::size_t xf, std::size_t yn,
                    std::size_t yf) {
    if (xn != yn || yf == 0 || xf % yf != 0)
      throw ShapeError(std::string("telar::GlobalAvgPool::") + what + ": expected [n, C * S] -> " +
                       "[n, C], got [" + std::to_string(xn) + ", " + std::to_string(xf) + "] -> [" +
                       std::to_string(yn) + ", " + std::to_string(yf) + "]");
  }
};

} // namespace telar
