#pragma once
/*! \file
 *  \brief telar::SpatialLocal: a layer without a spatial footprint
 *  (BatchNorm, activations) on slabs of samples split over a spatial group.
 *
 *  Such a layer reads, for each output row, the same input row only, so it
 *  runs unchanged on the slab and exchanges no halo. What spans the sample
 *  is reduced over the group: a layer that takes a telar::DataParallelContext
 *  (telar::BatchNorm with telar::SyncStats) is given one over the spatial
 *  group, so its statistics count every slab; parameter gradients are summed
 *  over the group. See docs/spatial.md.
 *  \code
 *  using BN = telar::BatchNorm<double, telar::DefaultMemorySpace, telar::SyncStats>;
 *  telar::SpatialLocal<BN> bn(sp_comm, BN(8));
 *  bn.build({8, 64, 32, 32});   // the whole sample; this rank holds bn.input_shape()
 *  \endcode
 */
#include <telar/comm/communicator.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/parallel/data_parallel.hpp>
#include <telar/parallel/detail/spatial.hpp>
#include <telar/parallel/spatial_decomposition.hpp>
#include <telar/profile/trace.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <utility>

namespace telar {

/*! \brief A layer whose output row r reads input row r only, over slabs of
 *  samples split along their first spatial axis over a spatial group.
 *
 *  With a spatial group that spans data-parallel replicas too (a
 *  communicator over dp x sp), BatchNorm's statistics cover the whole
 *  global batch, as telar::SyncStats does over dp. A telar::BatchNorm with
 *  telar::LocalStats is refused: its statistics would be a slab's.
 *  \tparam Layer a Telar layer (BatchNorm with SyncStats, an activation) */
template <class Layer>
class SpatialLocal {
  static_assert(
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Layer::memory_space>::accessible,
      "telar::SpatialLocal: the memory space must be host-accessible (device "
      "staging is not implemented yet)");
  static_assert(!layer_traits<Layer>::has_buffers || layer_traits<Layer>::has_data_parallel,
                "telar::SpatialLocal: a layer with statistics must reduce them over the spatial "
                "group (telar::BatchNorm: use telar::SyncStats)");

public:
  /*! \brief Scalar type. */
  using value_type = typename Layer::value_type;
  /*! \brief Memory space of parameters and activations. */
  using memory_space = typename Layer::memory_space;
  /*! \brief What backward needs from forward: the layer's own. */
  using saved_type = typename layer_traits<Layer>::saved_type;

  /*! \brief Runs \p l over slabs of the spatial group \p sp (kept by
   *  reference: it must outlive this object). \param sp the spatial group
   *  \param l the layer (configured, not built) */
  SpatialLocal(Communicator const& sp, Layer l) : layer(std::move(l)), sp_(&sp) {
    if constexpr (layer_traits<Layer>::has_data_parallel)
      layer.set_data_parallel(DataParallelContext(sp));
  }

  /*! \brief Builds the layer for this rank's slab of the whole sample shape
   *  \p in. \param in the unsplit input shape [C, (D,) H, W]
   *  \throws ShapeError for a shape the layer refuses or a split leaving a
   *  rank an empty slab */
  void build(Shape const& in) {
    detail::check_split(name(), in[1], "input", in[1], detail::group_size(*sp_));
    slab_ = split_extent(in[1], detail::group_size(*sp_), detail::group_rank(*sp_));
    whole_ = in;
    in_ = in;
    in_.dims[1] = slab_.size();
    if constexpr (layer_traits<Layer>::has_build)
      layer.build(in_);
  }
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return Layer::name(); }
  /*! \brief This rank's input slab shape. */
  Shape input_shape() const { return in_; }
  /*! \brief This rank's output slab shape. */
  Shape output_shape() const { return layer.output_shape(in_); }
  /*! \brief The unsplit output shape (of the whole sample). */
  Shape whole_output_shape() const { return layer.output_shape(whole_); }
  /*! \brief This rank's rows of the first spatial axis. */
  Slab slab() const { return slab_; }
  /*! \brief Bytes the layer keeps for backward on this rank's slab.
   *  \param samples samples per rank */
  std::size_t saved_bytes(std::size_t samples, Shape const& = {}) const {
    return detail::saved_bytes_of(layer, samples, in_);
  }
  /*! \brief Bytes of workspace the layer keeps on this rank's slab.
   *  \param samples samples per rank */
  std::size_t workspace_bytes(std::size_t samples, Shape const& = {}) const {
    return detail::workspace_bytes_of(layer, samples, in_);
  }

  /*! \brief Allocates and draws the parameters (the same \p seed on every
   *  rank gives every rank the same ones). \param seed stream seed */
  void initialize(std::uint64_t seed) { detail::initialize_layer(layer, seed); }
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
    detail::visit_parameters(layer, std::forward<F>(f));
  }

  /*! \brief The layer's forward on the slab. \param exec execution space
   *  instance \param x input slab \param y output slab \param saved for backward */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<value_type, memory_space> x,
               Matrix<value_type, memory_space> y, saved_type& saved) {
    layer.forward(exec, x, y, saved);
  }
  /*! \brief The layer's input gradient on the slab. \param exec execution
   *  space instance \param dy output gradient \param dx input gradient
   *  \param saved from forward */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                      Matrix<value_type, memory_space> dx, saved_type const& saved) {
    layer.backward_input(exec, dy, dx, saved);
  }
  /*! \brief Parameter gradients += this rank's part summed over the group.
   *  \param exec execution space instance \param dy output gradient
   *  \param saved from forward */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                       saved_type const& saved) {
    if constexpr (layer_traits<Layer>::has_backward_weight)
      sum_(layer, *sp_, [&] {
        layer.backward_weight(exec, dy, saved);
        exec.fence();
      });
  }

  Layer layer; //!< the layer, built for this rank's slab

private:
  Communicator const* sp_;
  Slab slab_{};
  Shape in_{}, whole_{};
  detail::GroupGradientSum<value_type> sum_;
};

} // namespace telar
