#pragma once
/*! \file
 *  \brief telar::SpatialConv: a Conv2D or Conv3D (also a ConvTranspose,
 *  MaxPool, AvgPool or Upsample: telar::SpatialPool, telar::SpatialUpsample)
 *  whose samples are split along their first spatial axis (depth in 3-D,
 *  height in 2-D) over the ranks of a spatial group, with halo exchange
 *  between neighbours.
 *
 *  Each rank holds the rows telar::split_extent gives it of every input and
 *  computes the output rows the same rule gives it. Forward: the halo rows
 *  are exchanged (telar::HaloExchange) and the unchanged layer runs on the
 *  halo-extended slab, with the volume's zero padding only at its faces
 *  (Convolution::build_slab). A convolution runs while the halo travels,
 *  which gives its interior output rows (those whose windows read no halo
 *  row), and computes the rows at its faces again once the exchange has
 *  completed (set_overlap).
 *  Backward: the layer's input gradient of the
 *  extended slab goes back through the reverse exchange (halo gradients are
 *  added to their owners); weight and bias gradients are summed over the
 *  group, so every rank ends with the gradient of the whole sample, equal to
 *  the unsplit layer's up to summation order. See docs/spatial.md.
 *  \code
 *  telar::SpatialConv<telar::Conv3D<double>> conv(sp_comm, telar::Conv3D<double>(4, 8, 3, 1, 1));
 *  conv.build({4, 64, 32, 32});   // the whole sample; this rank holds conv.input_shape()
 *  conv.initialize(seed);         // the same seed on every rank: the same weights
 *  \endcode
 */
#include <telar/comm/communicator.hpp>
#include <telar/comm/halo_exchange.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/conv.hpp>
#include <telar/parallel/detail/spatial.hpp>
#include <telar/parallel/detail/spatial_overlap.hpp>
#include <telar/parallel/spatial_decomposition.hpp>
#include <telar/profile/trace.hpp>

#include <Kokkos_Core.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace telar {

/*! \brief A layer with a window along the first spatial axis over slabs of
 *  samples split along that axis over a spatial group: telar::Conv2D,
 *  telar::Conv3D, telar::ConvTranspose2D/3D, telar::MaxPool,
 *  telar::AvgPool, telar::Upsample.
 *
 *  Any kernel, stride, dilation, padding and groups of a convolution; any
 *  pooling but ceil_mode; uneven splits (telar::split_extent). Refused with
 *  a telar::ShapeError naming the layer, the extent, sp and the rank: a
 *  split that leaves a rank an empty input or output slab, or a rank that
 *  needs more halo rows than its neighbour holds (telar::spatial_slab).
 *  \tparam Conv one of the layers above */
template <class Conv>
class SpatialConv {
public:
  /*! \brief Scalar type. */
  using value_type = typename Conv::value_type;
  /*! \brief Memory space of parameters and activations. */
  using memory_space = typename Conv::memory_space;
  /*! \brief What backward needs from forward: the halo-extended input slab. */
  struct saved_type {
    Matrix<value_type, memory_space> ext;          //!< the input slab with its halo rows
    typename layer_traits<Conv>::saved_type inner; //!< the layer's own saved state
  };

  /*! \brief Splits \p conv over the spatial group \p sp (kept by reference:
   *  it must outlive this object). \param sp the spatial group
   *  \param conv the convolution (configured, not built) */
  SpatialConv(Communicator const& sp, Conv conv) : layer(std::move(conv)), sp_(&sp), halo_(sp) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return Conv::name(); }

  /*! \brief Whether forward computes the interior rows between posting and
   *  completing the halo exchange (default; a convolution only: pools,
   *  upsamplings and transposed convolutions always wait first). Off: the
   *  exchange completes before the layer runs (for measuring what overlap
   *  hides). Call before build. \param on overlap or not */
  void set_overlap(bool on) { overlap_ = on; }

  /*! \brief Computes this rank's slab of the whole sample shape \p in and
   *  builds the layer for it. \param in the unsplit input shape [C, (D,) H, W]
   *  \throws ShapeError for a shape the layer refuses or a split it cannot take */
  void build(Shape const& in) {
    Shape const whole = layer.output_shape(in);          // the layer's own checks first
    if constexpr (detail::has_input_rows<Conv>::value) { // resampling: its own tables
      slab_ = spatial_slab(name(), in[1], whole[1], detail::group_size(*sp_),
                           detail::group_rank(*sp_), [&](Slab o) {
                             auto const rows = layer.input_rows(in, o.begin, o.end);
                             return SlabWindow{rows[0], rows[1], 0, 0};
                           });
      layer.build_slab(in, slab_.out.begin, slab_.out.end, slab_.window.begin, slab_.window.end);
    } else { // a window along the axis: kernel, stride, padding, dilation
      slab_ = conv_slab(name(), in[1], detail::split_axis(layer), detail::group_size(*sp_),
                        detail::group_rank(*sp_));
      layer.build_slab(with_rows(in, slab_.halo.extended_rows()), slab_.window.pad_front,
                       slab_.window.pad_back, slab_.out.size());
    }
    parts_ = {};
    if constexpr (detail::is_convolution<Conv>::value)
      if (overlap_)
        parts_.build(layer, with_rows(in, slab_.halo.extended_rows()),
                     with_rows(whole, slab_.out.size()), detail::split_axis(layer), slab_.window,
                     slab_.halo);
    in_ = with_rows(in, slab_.in.size());
    whole_out_ = whole;
    out_ = with_rows(whole, slab_.out.size());
    plane_ = 1;
    for (int i = 2; i < in.rank; ++i)
      plane_ *= in[std::size_t(i)];
  }

  /*! \brief This rank's input slab shape (rows slab().in of the first spatial axis). */
  Shape input_shape() const { return in_; }
  /*! \brief This rank's output slab shape (rows slab().out). */
  Shape output_shape() const { return out_; }
  /*! \brief The unsplit output shape (of the whole sample). */
  Shape whole_output_shape() const { return whole_out_; }
  /*! \brief This rank's slabs, window and halo. */
  SpatialSlab const& slab() const { return slab_; }
  /*! \brief Output rows [first, last) of this rank's forward parts: 0 the
   *  face before the interior, 1 the interior (right from the run while the
   *  halo travels), 2 the face after (both computed again after it); all
   *  empty without overlap. \param i part */
  std::array<std::size_t, 2> overlap_rows(int i) const { return parts_.rows(i); }

  /*! \brief Bytes forward keeps for backward on this rank for \p samples:
   *  the halo-extended input slab and the layer's own saved state (memory
   *  plans; the shape argument of the layer convention is not needed: the
   *  slab is this rank's since build). \param samples samples per rank */
  std::size_t saved_bytes(std::size_t samples, Shape const& = {}) const {
    return detail::view_bytes<value_type>(samples * extended().size()) +
           detail::saved_bytes_of(layer, samples, extended());
  }
  /*! \brief Bytes kept between calls: the extended slab's gradient, the
   *  four halo buffers and the layer's workspace. \param samples samples per rank */
  std::size_t workspace_bytes(std::size_t samples, Shape const& = {}) const {
    std::size_t const halo_rows = slab_.halo.exchanged_rows();
    return detail::view_bytes<value_type>(samples * extended().size()) +
           detail::view_bytes<value_type>(halo_rows * samples * in_[0] * plane_) +
           detail::workspace_bytes_of(layer, samples, extended()) + parts_.workspace_bytes(samples);
  }

  /*! \brief Allocates and draws the parameters (the same \p seed on every
   *  rank of the group gives every rank the same weights). \param seed stream seed */
  void initialize(std::uint64_t seed) { detail::initialize_layer(layer, seed); }
  /*! \brief Records this layer's halo exchanges and gradient sums on
   *  \p trace (null: none; telar::SlabGraph::set_trace passes its own).
   *  \param trace the rank's recorder, kept by pointer */
  void set_trace(TraceRecorder* trace) {
    halo_.set_trace(trace);
    sum_.set_trace(trace);
  }
  /*! \brief Leaves this rank's part of the parameter gradients unsummed
   *  over the group (\p on; telar::SlabGraph::set_partial_gradients).
   *  \param on true: partial; false: summed (the default) */
  void set_partial_gradients(bool on) { sum_.set_partial(on); }
  /*! \brief Visits the layer's (name, value, gradient).
   *  \param f callable as f(char const*, View&, View&) */
  template <class F>
  void parameters(F&& f) {
    detail::visit_parameters(layer, std::forward<F>(f));
  }

  /*! \brief y (this rank's output rows) = conv(x) over the input slab x and
   *  the neighbours' halo rows. \param exec execution space instance
   *  \param x input slab [n, C * rows * plane] \param y output slab
   *  \param saved keeps the extended slab */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<value_type, memory_space> x,
               Matrix<value_type, memory_space> y, saved_type& saved) {
    std::size_t const n = x.extent(0), outer = n * in_[0];
    fit(saved.ext, n, "telar::SpatialConv::extended_input");
    halo_.post(exec, slab_.halo, x.data(), outer, plane_, saved.ext.data());
    if constexpr (detail::is_convolution<Conv>::value) {
      if (parts_.active()) {
        // Every row while the halo travels: the interior's are right, the
        // faces' read the last call's halo rows and are computed again.
        layer.forward(exec, saved.ext, y, saved.inner);
        halo_.finish(exec);
        parts_.run(exec, 0, layer, saved.ext, y);
        parts_.run(exec, 2, layer, saved.ext, y);
        // oneDNN's backward reuses the copy of ext the forward converted
        // (same call, same pointer), which has the last call's halo rows: a
        // new call id makes the weight gradient convert ext again (its
        // backward primitives still share dy).
        saved.inner.call = detail::next_conv_call();
        return;
      }
    }
    halo_.finish(exec);
    layer.forward(exec, saved.ext, y, saved.inner);
  }

  /*! \brief Rows beyond this rank's input slab, below and above, that its
   *  windows read (the halo it receives; 0 at the volume's faces). */
  std::array<std::size_t, 2> input_halo() const { return {slab_.halo.recv_lo, slab_.halo.recv_hi}; }
  /*! \brief forward() on an input slab that holds its halo rows already
   *  (input_halo(): read with them, telar::VolumeReader): no exchange.
   *  \param exec execution space instance \param x [n, C * (lo + rows +
   *  hi) * plane] \param y output slab \param saved keeps the extended slab
   *  \throws ShapeError for another width of x */
  template <class Exec>
  void forward_extended(Exec const& exec, ConstMatrix<value_type, memory_space> x,
                        Matrix<value_type, memory_space> y, saved_type& saved) {
    fit(saved.ext, x.extent(0), "telar::SpatialConv::extended_input");
    if (x.extent(1) != saved.ext.extent(1))
      throw ShapeError(std::string("telar::") + name() + "::forward_extended: expected [n, " +
                       std::to_string(saved.ext.extent(1)) + "] (the slab with its halo rows, " +
                       extended().str() + "), got [n, " + std::to_string(x.extent(1)) + "]");
    Kokkos::deep_copy(exec, saved.ext, x);
    layer.forward(exec, saved.ext, y, saved.inner);
  }

  /*! \brief dx (this rank's input rows) from dy: the layer's gradient of the
   *  extended slab, with the halo rows' gradients added by their owners.
   *  \param exec execution space instance \param dy output slab gradient
   *  \param dx input slab gradient \param saved from forward */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                      Matrix<value_type, memory_space> dx, saved_type const& saved) {
    post_input_gradient(exec, dy, dx, saved);
    halo_.finish_reverse(exec);
  }

  /*! \brief backward_input and backward_weight in one call. With overlap on
   *  (the default), the weight gradient and its sum over the spatial group
   *  run while the halo rows' gradients travel to their owners; dx is
   *  complete when it returns. \param exec execution space instance
   *  \param dy output slab gradient \param dx input slab gradient
   *  \param saved from forward */
  template <class Exec>
  void backward(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                Matrix<value_type, memory_space> dx, saved_type const& saved) {
    bool const hide = overlap_ && slab_.halo.exchanged_rows() > 0;
    post_input_gradient(exec, dy, dx, saved);
    if (hide)
      backward_weight(exec, dy, saved);
    halo_.finish_reverse(exec);
    if (!hide)
      backward_weight(exec, dy, saved);
  }

  /*! \brief dW, db += the gradient of the whole sample: this rank's part,
   *  summed over the spatial group. \param exec execution space instance
   *  \param dy output slab gradient \param saved from forward */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                       saved_type const& saved) {
    if constexpr (layer_traits<Conv>::has_backward_weight)
      sum_(layer, *sp_, [&] {
        layer.backward_weight(exec, dy, saved.inner);
        exec.fence();
      });
  }

  Conv layer; //!< the convolution, built for this rank's extended slab

private:
  // The extended slab's gradient, and its halo rows' posted to their owners
  // (dx is complete after halo_.finish_reverse).
  template <class Exec>
  void post_input_gradient(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                           Matrix<value_type, memory_space> dx, saved_type const& saved) {
    std::size_t const n = dy.extent(0);
    fit(dext_, n, "telar::SpatialConv::extended_gradient");
    layer.backward_input(exec, dy, dext_, saved.inner);
    halo_.post_reverse(exec, slab_.halo, dext_.data(), n * in_[0], plane_, dx.data());
  }
  static Shape with_rows(Shape s, std::size_t rows) {
    s.dims[1] = rows;
    return s;
  }
  // The input slab with its halo rows.
  Shape extended() const { return with_rows(in_, slab_.halo.extended_rows()); }
  // m = [n, C * extended rows * plane], reallocated when the batch changes.
  void fit(Matrix<value_type, memory_space>& m, std::size_t n, char const* label) const {
    std::size_t const cols = extended().size();
    if (m.extent(0) != n || m.extent(1) != cols)
      m = Matrix<value_type, memory_space>(std::string(label), n, cols);
  }
  Communicator const* sp_;
  HaloExchange<value_type, memory_space> halo_;
  SpatialSlab slab_{};
  Shape in_{}, out_{}, whole_out_{};
  std::size_t plane_ = 1;
  Matrix<value_type, memory_space> dext_;
  detail::GroupGradientSum<value_type> sum_;
  detail::RowParts<Conv> parts_;
  bool overlap_ = true;
};

/*! \brief Pooling (telar::MaxPool, telar::AvgPool) over slabs: the same
 *  wrapper, a pooling window is a convolution's for the decomposition.
 *  \tparam Pool a telar::MaxPool or telar::AvgPool */
template <class Pool>
using SpatialPool = SpatialConv<Pool>;

/*! \brief Upsampling (telar::Upsample, nearest or linear) over slabs: the
 *  same wrapper; output rows read the input rows of the layer's
 *  interpolation tables (Upsample::input_rows), which the halo supplies.
 *  \tparam Up a telar::Upsample */
template <class Up>
using SpatialUpsample = SpatialConv<Up>;

} // namespace telar
