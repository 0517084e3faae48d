#pragma once
/*! \file
 *  \brief telar::SpatialDense: Flatten → Dense over samples split into
 *  slabs, the head that reads the whole sample (a CosmoFlow regressor, a
 *  classifier without global pooling).
 *
 *  The Dense holds the whole layer's parameters on every rank of the
 *  spatial group (the same values as unsplit). Flattened channel-first, a
 *  slab is C runs of columns of W, one per channel; each rank multiplies its
 *  slab by a copy of those columns and one allreduce over the group adds
 *  the partial outputs (a row-parallel layer whose split is the slab's).
 *  The input gradient is local; the weight gradient of each rank's columns
 *  is summed over the group into the whole gradient, and the bias gradient
 *  counted once. See docs/spatial.md.
 *  \code
 *  telar::SpatialDense<float> head(sp_comm, telar::Dense<float>(16 * 8 * 8 * 8, 4));
 *  head.build({16, 8, 8, 8});   // the whole sample; this rank holds head.input_shape()
 *  \endcode
 */
#include <telar/comm/communicator.hpp>
#include <telar/core/detail/column_sums.hpp>
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/error.hpp>
#include <telar/core/gemm.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/dense.hpp>
#include <telar/parallel/detail/spatial.hpp>
#include <telar/parallel/spatial_decomposition.hpp>
#include <telar/profile/trace.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace telar {

/*! \brief A telar::Dense over the flattened whole sample [C, (D,) H, W],
 *  run on slabs split along the first spatial axis over a spatial group;
 *  outputs, input gradients and parameter gradients are the unsplit
 *  layer's (up to summation order).
 *  \tparam T value type \tparam MemorySpace memory space (host-accessible)
 *  \tparam Gemm GEMM policy */
template <class T, class MemorySpace = DefaultMemorySpace, class Gemm = AutoGemm>
class SpatialDense : public detail::LayerTypes<T, MemorySpace> {
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible,
                "telar::SpatialDense: the memory space must be host-accessible (device "
                "staging is not implemented yet)");

public:
  /*! \brief What backward needs: the slab input. */
  using saved_type = typename Dense<T, MemorySpace, Gemm>::saved_type;

  /*! \brief Runs \p dense (of the whole sample's features) over slabs of the
   *  spatial group \p sp (kept by reference: it must outlive this object).
   *  \param sp the spatial group \param dense the layer, configured */
  SpatialDense(Communicator const& sp, Dense<T, MemorySpace, Gemm> dense)
      : layer(std::move(dense)), sp_(&sp) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "SpatialDense"; }
  /*! \brief Builds for this rank's slab of the whole sample shape \p in.
   *  \param in the unsplit input shape [C, (D,) H, W]
   *  \throws ShapeError when \p in is not the Dense's input size, has fewer
   *  than two axes, or the split leaves a rank an empty slab */
  void build(Shape const& in) {
    if (in.rank < 2 || in.size() != layer.in_features())
      throw ShapeError(std::string(name()) + ": expected a sample [C, (D,) H, W] of " +
                       std::to_string(layer.in_features()) + " features (the Dense's input), got " +
                       in.str());
    detail::check_split(name(), in[1], "input", in[1], detail::group_size(*sp_));
    slab_ = split_extent(in[1], detail::group_size(*sp_), detail::group_rank(*sp_));
    whole_ = in;
    in_ = in;
    in_.dims[1] = slab_.size();
  }
  /*! \brief This rank's input slab shape. */
  Shape input_shape() const { return in_; }
  /*! \brief The output [out], whole on every rank. */
  Shape output_shape() const { return Shape(layer.out_features()); }
  /*! \brief The unsplit output shape (the same). */
  Shape whole_output_shape() const { return output_shape(); }
  /*! \brief This rank's rows of the first spatial axis. */
  Slab slab() const { return slab_; }
  /*! \brief The slab's columns of W and their gradient, per rank. */
  std::size_t workspace_bytes(std::size_t = 0, Shape const& = {}) const {
    return 2 * layer.out_features() * in_.size() * sizeof(T);
  }

  /*! \brief Allocates and draws the whole layer's parameters (the same \p
   *  seed on every rank gives every rank the unsplit layer's). \param seed stream seed */
  void initialize(std::uint64_t seed) { layer.initialize(seed); }
  /*! \brief Records this layer's gradient sums over the group on \p trace
   *  (null: none; telar::SlabGraph::set_trace passes its own).
   *  \param trace the rank's recorder, kept by pointer */
  void set_trace(TraceRecorder* trace) { sum_.set_trace(trace); }
  /*! \brief Leaves this rank's part of the parameter gradients unsummed
   *  over the group (\p on; telar::SlabGraph::set_partial_gradients).
   *  \param on true: partial; false: summed (the default) */
  void set_partial_gradients(bool on) { sum_.set_partial(on); }
  /*! \brief Visits the layer's (name, value, gradient).
   *  \param f callable as f(char const*, View&, View&) */
  template <class F>
  void parameters(F&& f) {
    layer.parameters(std::forward<F>(f));
  }

  /*! \brief y = the slabs' x W_slab^T summed over the group, + b.
   *  \param exec execution space instance \param x input slab [n, slab features]
   *  \param y output [n, out], the same on every rank \param saved keeps x */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type& saved) {
    check("forward", x.extent(0), x.extent(1), y.extent(0), y.extent(1));
    saved.x = x;
    gather_columns(exec); // W changes between steps only; backward reuses this copy
    gemm(Gemm{}, exec, 'N', 'T', T(1), x, w_slab_, T(0), y);
    exec.fence();
    sp_->allreduce(y.data(), y.size());
    if (!layer.has_bias())
      return;
    auto const b = layer.bias;
    std::size_t const out = y.extent(1);
    Kokkos::parallel_for(
        "telar::SpatialDense::forward_bias", Kokkos::RangePolicy<Exec>(exec, 0, y.size()),
        KOKKOS_LAMBDA(std::size_t i) { y.data()[i] += b(i % out); });
  }
  /*! \brief dx = dy W_slab (local). \param exec execution space instance
   *  \param dy output gradient [n, out] (the same on every rank)
   *  \param dx input gradient of the slab */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      saved_type const&) const {
    check("backward_input", dx.extent(0), dx.extent(1), dy.extent(0), dy.extent(1));
    gemm(Gemm{}, exec, 'N', 'N', T(1), dy, w_slab_, T(0), dx);
  }
  /*! \brief dW += the slabs' dy^T x_slab at their columns, summed over the
   *  group; db += column sums of dy, once. \param exec execution space
   *  instance \param dy output gradient \param saved the slab input */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<T, MemorySpace> dy, saved_type const& saved) {
    sum_(layer, *sp_, [&] {
      gemm(Gemm{}, exec, 'T', 'N', T(1), dy, saved.x, T(0), dw_slab_);
      scatter_columns(exec);
      if (layer.has_bias() && detail::group_rank(*sp_) == 0) { // every rank has the same dy
        detail::add_column_sums(
            "telar::SpatialDense::backward_bias", exec, dy.extent(0), dy.extent(1),
            KOKKOS_LAMBDA(std::size_t i, std::size_t j) { return dy(i, j); }, layer.bias_grad);
      }
      exec.fence();
    });
  }

  Dense<T, MemorySpace, Gemm> layer; //!< the whole layer (every rank holds all of it)

  // Public only because nvcc refuses an extended lambda (KOKKOS_LAMBDA) in a
  // private or protected member function; not part of the interface.
  /// \cond TELAR_INTERNAL
  // This slab's columns of W into w_slab_; dw_slab_ added into W's gradient.
  template <class Exec>
  void gather_columns(Exec const& exec) {
    std::size_t const out = layer.out_features(), cols = in_.size();
    if (w_slab_.extent(0) != out || w_slab_.extent(1) != cols) {
      w_slab_ = Matrix<T, MemorySpace>("telar::scratch", out, cols);
      dw_slab_ = Matrix<T, MemorySpace>("telar::scratch", out, cols);
    }
    auto const w = layer.weight;
    auto const ws = w_slab_;
    for_each_column([&](std::size_t to, std::size_t from, std::size_t n) {
      Kokkos::parallel_for(
          "telar::SpatialDense::gather_columns",
          Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {out, n}),
          KOKKOS_LAMBDA(std::size_t o, std::size_t j) { ws(o, to + j) = w(o, from + j); });
    });
  }
  template <class Exec>
  void scatter_columns(Exec const& exec) {
    auto const dw = layer.weight_grad;
    auto const ds = dw_slab_;
    for_each_column([&](std::size_t from, std::size_t to, std::size_t n) {
      Kokkos::parallel_for(
          "telar::SpatialDense::scatter_columns",
          Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {dw.extent(0), n}),
          KOKKOS_LAMBDA(std::size_t o, std::size_t j) { dw(o, to + j) += ds(o, from + j); });
    });
  }
  /// \endcond

private:
  // Column k of this slab's flattened features (channel c, offset j within
  // the channel's slab) is column c * whole + begin * plane + j of W.
  template <class F>
  void for_each_column(F const& f) const {
    std::size_t const C = whole_[0], plane = whole_.size() / (C * whole_[1]);
    std::size_t const per = in_.size() / C, whole = whole_.size() / C;
    std::size_t const first = slab_.begin * plane;
    for (std::size_t c = 0; c < C; ++c)
      f(c * per, c * whole + first, per);
  }
  void check(char const* what, std::size_t xn, std::size_t xf, std::size_t yn,
             std::size_t yf) const {
    detail::check_slab_call(name(), what, in_, layer.out_features(), xn, xf, yn, yf);
  }

  Communicator const* sp_;
  Slab slab_{};
  Shape in_{}, whole_{};
  Matrix<T, MemorySpace> w_slab_, dw_slab_;
  detail::GroupGradientSum<T> sum_;
};

} // namespace telar
