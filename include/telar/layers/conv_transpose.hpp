#pragma once
/*! \file
 *  \brief Transposed 2-D and 3-D convolutions (telar::ConvTranspose2D,
 *  telar::ConvTranspose3D) with PyTorch's semantics and weight layout.
 *
 *  A transposed convolution is the adjoint of a convolution: its forward is
 *  a convolution's input gradient, its input gradient a convolution's
 *  forward, and its weight gradient a convolution's weight gradient with the
 *  roles of input and output gradient swapped. So it runs the convolution
 *  code (telar::Convolution's engine: im2col + GEMM, or oneDNN's primitives
 *  under telar::AutoConv) of the convolution that maps its output shape back
 *  to its input shape, plus its own bias. The output extent per dimension is
 *  (in - 1) stride - 2 padding + dilation (kernel - 1) + output_padding + 1.
 *  \code
 *  telar::ConvTranspose2D<float> up(64, 32, 2, 2);  // 64 -> 32 channels, doubles H and W
 *  \endcode
 */
#include <telar/layers/conv.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace telar {

namespace detail {

// y(s, c * P + p) += b(c): one work item per (sample, channel) row of P.
template <class Exec, class Y, class B>
void conv_add_bias(Exec const& exec, Y const& y, B const& b, int P) {
  std::size_t const C = b.extent(0);
  auto* py = y.data();
  Kokkos::parallel_for(
      "telar::ConvTranspose::forward_bias", Kokkos::RangePolicy<Exec>(exec, 0, y.extent(0) * C),
      KOKKOS_LAMBDA(std::size_t r) {
        auto const v = b(r % C);
        auto* row = py + r * std::size_t(P);
        for (int q = 0; q < P; ++q)
          row[q] += v;
      });
}

} // namespace detail

/*! \brief A transposed convolution over samples [C, H, W] (Dims = 2) or
 *  [C, D, H, W] (Dims = 3), with stride, zero padding, output padding,
 *  dilation and groups as PyTorch's ConvTranspose2d/3d; use the aliases
 *  telar::ConvTranspose2D and telar::ConvTranspose3D.
 *
 *  The weight is stored as PyTorch's [in, out / groups, (kd,) kh, kw]
 *  flattened to a matrix [in, out / groups * kernel volume]: the weight of
 *  the convolution from out to in channels whose adjoint this layer is.
 *  initialize(seed) draws W and b uniform in ±1/sqrt(out / groups * kernel
 *  volume), PyTorch's default. output_padding (added on one side of the
 *  output, to pick one of the output sizes a strided convolution maps to the
 *  same input size) must be smaller than the stride or the dilation.
 *  \tparam T value type (float or double)
 *  \tparam Dims 2 or 3 spatial dimensions
 *  \tparam MemorySpace where parameters and activations live
 *  \tparam Gemm GEMM policy of the im2col path (see telar/core/gemm.hpp)
 *  \tparam ConvPolicy convolution policy (see telar/layers/conv_policy.hpp) */
template <class T, int Dims, class MemorySpace = DefaultMemorySpace, class Gemm = AutoGemm,
          class ConvPolicy = AutoConv>
class TransposedConvolution
    : public detail::ConvLayer<TransposedConvolution<T, Dims, MemorySpace, Gemm, ConvPolicy>, T,
                               Dims, MemorySpace, Gemm, ConvPolicy, true> {
  using Base =
      detail::ConvLayer<TransposedConvolution, T, Dims, MemorySpace, Gemm, ConvPolicy, true>;
  using Ext = typename Base::Extents;
  using Saved = typename Base::saved_type;
  friend Base;

public:
  /*! \brief An empty layer; assign a configured one before use. */
  TransposedConvolution() = default;
  /*! \brief The same kernel extent, stride, padding, output padding and
   *  dilation in every dimension.
   *  \param in input channels \param out output channels \param kernel kernel extent
   *  \param stride stride \param padding padding removed from each side of the output
   *  \param output_padding extent added on one side of the output
   *  \param bias add a bias per output channel \param dilation kernel dilation
   *  \param groups channel groups (in and out must be multiples of it)
   *  \throws ShapeError when in or out is not a multiple of groups */
  TransposedConvolution(std::size_t in, std::size_t out, std::size_t kernel, std::size_t stride = 1,
                        std::size_t padding = 0, std::size_t output_padding = 0, bool bias = true,
                        std::size_t dilation = 1, std::size_t groups = 1)
      : TransposedConvolution(in, out, Base::fill(kernel), Base::fill(stride), Base::fill(padding),
                              Base::fill(output_padding), bias, Base::fill(dilation), groups) {}
  /*! \brief Settings per dimension.
   *  \param in input channels \param out output channels \param kernel kernel extents
   *  \param stride strides \param padding padding removed from each side of the output
   *  \param output_padding extents added on one side of the output
   *  \param bias add a bias per output channel \param dilation kernel dilations
   *  \param groups channel groups (in and out must be multiples of it)
   *  \throws ShapeError when in or out is not a multiple of groups */
  TransposedConvolution(std::size_t in, std::size_t out, Ext kernel, Ext stride, Ext padding,
                        Ext output_padding = Base::fill(0), bool bias = true,
                        Ext dilation = Base::fill(1), std::size_t groups = 1)
      : Base(in, out, kernel, stride, padding, bias, dilation, groups),
        output_padding_(output_padding) {}
  /*! \brief The same layer under other GEMM and convolution policies
   *  (telar::Precision), as Convolution's. \tparam G the other GEMM policy
   *  \tparam P the other convolution policy \param o the layer */
  template <class G, class P,
            class = std::enable_if_t<!std::is_same_v<
                TransposedConvolution<T, Dims, MemorySpace, G, P>, TransposedConvolution>>>
  explicit TransposedConvolution(TransposedConvolution<T, Dims, MemorySpace, G, P> const& o)
      : Base(o), output_padding_(o.output_padding_) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return Dims == 2 ? "ConvTranspose2D" : "ConvTranspose3D"; }

  /*! \brief [out, (Do,) Ho, Wo] for an input [in, (D,) H, W].
   *  \param in the input shape
   *  \throws ShapeError for another rank or channel count, an output padding
   *  not smaller than stride or dilation, or an empty output */
  Shape output_shape(Shape const& in) const { return shape_of(geometry(in)); }

  /*! \brief Input rows [first, last) of the first spatial axis that output
   *  rows [out_begin, out_end) read (spatial parallelism): those whose
   *  kernel taps reach them. \param in the whole input shape
   *  \param out_begin first output row \param out_end one past the last
   *  \return {first, last} (first == last: no input reaches those rows) */
  std::array<std::size_t, 2> input_rows(Shape const& in, std::size_t out_begin,
                                        std::size_t out_end) const {
    long const s = long(this->stride_[0]), p = long(this->padding_[0]);
    long const reach = long(this->dilation_[0]) * (long(this->kernel_[0]) - 1);
    long const lo = std::max(0L, (long(out_begin) + p - reach + s - 1 + s * reach) / s - reach);
    long const hi = std::min(long(in[1]), (long(out_end) - 1 + p) / s + 1);
    check_slab_offset(long(out_begin) + p - lo * s);
    return {std::size_t(lo), std::size_t(std::max(lo, hi))};
  }
  /*! \brief Builds for one slab of the whole input \p in split along its
   *  first spatial axis: output rows [out_begin, out_end) from the input rows
   *  [in_begin, in_end) the slab holds with its halo (see input_rows).
   *  \param in the whole input shape \param out_begin first output row
   *  \param out_end one past the last \param in_begin first input row held
   *  \param in_end one past the last
   *  \throws ShapeError as build, or for a stride longer than the kernel's
   *  span (a slab would start between taps) */
  void build_slab(Shape const& in, std::size_t out_begin, std::size_t out_end, std::size_t in_begin,
                  std::size_t in_end) {
    detail::ConvGeometry g = geometry(in);
    long const front =
        long(out_begin) + long(this->padding_[0]) - long(in_begin) * long(this->stride_[0]);
    check_slab_offset(front);
    detail::conv_set_dim(g, 3 - Dims, int(out_end - out_begin), int(this->kernel_[0]),
                         int(this->stride_[0]), int(front), int(this->dilation_[0]),
                         int(in_end - in_begin));
    this->g_ = g;
    this->built_ = true;
  }

  /*! \brief y = conv^T(x) + b: the adjoint convolution's input gradient.
   *  \param exec execution space instance \param x input [n, in * (D *) H * W]
   *  \param y output [n, out * (Do *) Ho * Wo] \param saved keeps x: a view,
   *  or (compact) x rounded to bf16, as the primitive read it */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               Saved& saved) const {
    check("forward", x.extent(0), x.extent(1), y.extent(0), y.extent(1));
    saved.x = saved.compact ? ConstMatrix<T, MemorySpace>() : x;
    saved.call = detail::next_conv_call();
    // The adjoint's dy is x, its x is our dy: backward_weight reuses both
    // conversions (detail/onednn_conv.hpp), or reads x's from the copy.
    this->engine_.backward_data(exec, this->g_, x, this->weight.data(), y, false, saved.call,
                                keep(exec, x, saved));
    if (this->use_bias_)
      detail::conv_add_bias(exec, y, this->bias, this->g_.in_size() / this->g_.C);
  }

  /*! \brief dx = conv(dy): the adjoint convolution's forward, without bias.
   *  \param exec execution space instance \param dy gradient of the output
   *  \param dx gradient of the input \param saved the forward's state (its call id) */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      Saved const& saved) const {
    check("backward_input", dx.extent(0), dx.extent(1), dy.extent(0), dy.extent(1));
    this->engine_.forward(exec, this->g_, dy, this->weight.data(), Vector<T, MemorySpace>{}, dx,
                          saved.call);
  }

  /*! \brief dW += the adjoint convolution's weight gradient for input dy and
   *  output gradient x; db += sums of dy over positions.
   *  \param exec execution space instance \param dy gradient of the output
   *  \param saved the input of the matching forward */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Saved const& saved) const {
    if (!weight_from_copy(exec, dy, saved)) {
      check("backward_weight", saved.x.extent(0), saved.x.extent(1), dy.extent(0), dy.extent(1));
      this->engine_.backward_weights(exec, this->g_, dy, saved.x, this->weight_grad.data(),
                                     Vector<T, MemorySpace>{}, saved.call);
    }
    if (this->use_bias_)
      detail::conv_bias_grad(exec, dy, this->bias_grad, this->g_.in_size() / this->g_.C);
  }

private:
  // Under a compact copy: where forward's primitive copies x as it
  // converted it to bf16, or null (x then copied in fp32 where bf16 falls
  // back, or no copy asked).
  template <class Exec>
  std::uint16_t* keep(Exec const& exec, ConstMatrix<T, MemorySpace> const& x, Saved& saved) const {
#if TELAR_HAVE_ONEDNN
    if constexpr (std::is_same_v<typename Base::conv_policy, OneDnnConvBf16>)
      if (saved.compact) {
        if (detail::conv_extents_consistent(this->g_) &&
            detail::bf16_check_isa("telar::TransposedConvolution (telar::OneDnnConvBf16)"))
          return saved.kept.room(x.extent(0), x.extent(1));
        saved.kept.keep(exec, x, false);
      }
#endif
    (void)exec, (void)x, (void)saved;
    return nullptr;
  }
  // The weight gradient from the compact copy, if forward kept one.
  template <class Exec>
  bool weight_from_copy(Exec const& exec, ConstMatrix<T, MemorySpace> const& dy,
                        Saved const& saved) const {
#if TELAR_HAVE_ONEDNN
    if constexpr (std::is_same_v<typename Base::conv_policy, OneDnnConvBf16>)
      if (saved.compact) {
        auto const& kept = saved.kept;
        check("backward_weight", kept.rows(), kept.cols(), dy.extent(0), dy.extent(1));
        if (kept.rounded())
          this->engine_.backward_weights(exec, this->g_, dy.extent(0), dy.data(), kept.words(),
                                         this->weight_grad.data(), Vector<T, MemorySpace>{},
                                         saved.call);
        else
          this->engine_.backward_weights(exec, this->g_, dy, kept.values(),
                                         this->weight_grad.data(), Vector<T, MemorySpace>{},
                                         saved.call);
        return true;
      }
#endif
    (void)exec, (void)dy, (void)saved;
    return false;
  }
  // ShapeError when a slab's first output row lies before its first input
  // row's taps (a stride longer than the kernel's span): the adjoint's front
  // padding would be negative. input_rows checks it for every rank's slab.
  void check_slab_offset(long front) const {
    if (front < 0)
      throw ShapeError(std::string(name()) + ": a stride (" + std::to_string(this->stride_[0]) +
                       ") longer than the kernel's span is not supported on slabs (spatial "
                       "parallelism)");
  }
  // The adjoint convolution's sizes (its input is this layer's output, its
  // output this layer's input) for input shape `in`, or ShapeError.
  detail::ConvGeometry geometry(Shape const& in) const {
    if (in.rank != Dims + 1 || in[0] != this->in_)
      throw ShapeError(this->expected() + ", got " + in.str());
    detail::conv_check_settings<Dims>(name(), this->kernel_, this->stride_, this->dilation_);
    detail::ConvGeometry g;
    g.C = int(this->out_);
    g.Co = int(this->in_);
    g.G = int(this->groups_);
    for (std::size_t i = 0; i < Dims; ++i) {
      long const k = long(this->kernel_[i]), s = long(this->stride_[i]),
                 p = long(this->padding_[i]), op = long(output_padding_[i]),
                 d = long(this->dilation_[i]);
      if (op >= s && op >= d)
        throw ShapeError(std::string(name()) + ": output_padding (" + std::to_string(op) +
                         ") must be smaller than stride (" + std::to_string(s) + ") or dilation (" +
                         std::to_string(d) + ")");
      long const out = (long(in[i + 1]) - 1) * s - 2 * p + d * (k - 1) + op + 1;
      if (out < 1 || in[i + 1] < 1)
        throw ShapeError(this->expected() + " whose output is not empty, got " + in.str() +
                         " (output extent " + std::to_string(out) + ")");
      detail::conv_set_dim(g, int(i) + 3 - Dims, int(out), int(k), int(s), int(p), int(d),
                           int(in[i + 1]));
    }
    return g;
  }
  static Shape shape_of(detail::ConvGeometry const& g) {
    if (Dims == 2)
      return Shape{std::size_t(g.C), std::size_t(g.H), std::size_t(g.W)};
    return Shape{std::size_t(g.C), std::size_t(g.D), std::size_t(g.H), std::size_t(g.W)};
  }
  void check(char const* what, std::size_t xn, std::size_t xf, std::size_t yn,
             std::size_t yf) const {
    Base::check(what, std::size_t(this->g_.Co) * std::size_t(this->g_.P()),
                std::size_t(this->g_.in_size()), xn, xf, yn, yf);
  }

  template <class, int, class, class, class>
  friend class TransposedConvolution; // the converting constructor reads another policy's

  Ext output_padding_ = Base::fill(0);
};

/*! \brief Transposed 2-D convolution over samples [C, H, W]:
 *  `ConvTranspose2D<T>(in, out, kernel, stride = 1, padding = 0, output_padding = 0,
 *  bias = true, dilation = 1, groups = 1)`.
 *  \tparam T value type \tparam MemorySpace memory space \tparam Gemm GEMM policy
 *  \tparam ConvPolicy convolution policy */
template <class T, class MemorySpace = DefaultMemorySpace, class Gemm = AutoGemm,
          class ConvPolicy = AutoConv>
using ConvTranspose2D = TransposedConvolution<T, 2, MemorySpace, Gemm, ConvPolicy>;

/*! \brief Transposed 3-D convolution over samples [C, D, H, W]:
 *  `ConvTranspose3D<T>(in, out, kernel, stride = 1, padding = 0, output_padding = 0,
 *  bias = true, dilation = 1, groups = 1)`.
 *  \tparam T value type \tparam MemorySpace memory space \tparam Gemm GEMM policy
 *  \tparam ConvPolicy convolution policy */
template <class T, class MemorySpace = DefaultMemorySpace, class Gemm = AutoGemm,
          class ConvPolicy = AutoConv>
using ConvTranspose3D = TransposedConvolution<T, 3, MemorySpace, Gemm, ConvPolicy>;

} // namespace telar
