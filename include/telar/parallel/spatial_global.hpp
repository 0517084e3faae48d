#pragma once
/*! \file
 *  \brief telar::SpatialGlobalAvgPool: global average pooling over samples
 *  split into slabs, the head of a classifier or regressor (CosmoFlow, a
 *  ResNet on volumes) after split convolutions.
 *
 *  Each rank sums its slab's voxels per channel, one allreduce over the
 *  spatial group adds the slabs, and every rank holds the whole pooled
 *  output [C]: the layers after it run replicated on the group, as on one
 *  rank. The input gradient of a voxel is its channel's output gradient
 *  over the whole sample's voxel count: local, no message. See
 *  docs/spatial.md.
 *  \code
 *  telar::SpatialGlobalAvgPool<float> gap(sp_comm);
 *  gap.build({64, 32, 32, 32});   // the whole sample; this rank holds gap.input_shape()
 *  \endcode
 */
#include <telar/comm/communicator.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/parallel/detail/spatial.hpp>
#include <telar/parallel/spatial_decomposition.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>

namespace telar {

/*! \brief Global average pooling ([C, (D,) H, W] -> [C]) over slabs of
 *  samples split along their first spatial axis over a spatial group; the
 *  output is the unsplit layer's (telar::GlobalAvgPool) on every rank.
 *  \tparam T value type \tparam MemorySpace memory space (host-accessible) */
template <class T, class MemorySpace = DefaultMemorySpace>
class SpatialGlobalAvgPool {
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible,
                "telar::SpatialGlobalAvgPool: the memory space must be host-accessible (device "
                "staging is not implemented yet)");

public:
  /*! \brief Scalar type. */
  using value_type = T;
  /*! \brief Memory space of activations. */
  using memory_space = MemorySpace;
  /*! \brief Nothing: backward needs only the voxel count. */
  struct saved_type {};

  /*! \brief Pools over the spatial group \p sp (kept by reference: it must
   *  outlive this object). \param sp the spatial group */
  explicit SpatialGlobalAvgPool(Communicator const& sp) : sp_(&sp) {}

  /*! \brief Builds for this rank's slab of the whole sample shape \p in.
   *  \param in the unsplit input shape [C, (D,) H, W]
   *  \throws ShapeError for fewer than two axes or a split leaving a rank
   *  an empty slab */
  void build(Shape const& in) {
    if (in.rank < 2)
      throw ShapeError(std::string(name()) + " expects inputs [C, (D,) H, W], got " + in.str());
    detail::check_split(name(), in[1], "input", in[1], detail::group_size(*sp_));
    slab_ = split_extent(in[1], detail::group_size(*sp_), detail::group_rank(*sp_));
    whole_ = in;
    in_ = in;
    in_.dims[1] = slab_.size();
  }
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "SpatialGlobalAvgPool"; }
  /*! \brief This rank's input slab shape. */
  Shape input_shape() const { return in_; }
  /*! \brief The output [C], whole on every rank. */
  Shape output_shape() const { return Shape(whole_[0]); }
  /*! \brief The unsplit output shape (the same: [C]). */
  Shape whole_output_shape() const { return output_shape(); }
  /*! \brief This rank's rows of the first spatial axis. */
  Slab slab() const { return slab_; }
  /*! \brief Nothing is kept for backward. */
  std::size_t saved_bytes(std::size_t, Shape const& = {}) const { return 0; }

  /*! \brief y(s, c) = the mean of channel c over every slab of the group.
   *  \param exec execution space instance \param x input slab [n, C * slab voxels]
   *  \param y output [n, C], the same on every rank */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type&) const {
    std::size_t const C = whole_[0], S = in_.size() / C;
    Kokkos::parallel_for(
        "telar::SpatialGlobalAvgPool::forward", Kokkos::RangePolicy<Exec>(exec, 0, y.extent(0) * C),
        KOKKOS_LAMBDA(std::size_t r) {
          T const* in = x.data() + r * S;
          T acc = 0;
          for (std::size_t i = 0; i < S; ++i)
            acc += in[i];
          y.data()[r] = acc;
        });
    exec.fence();
    sp_->allreduce(y.data(), y.size()); // the slabs' sums
    T const scale = T(1) / T(voxels());
    Kokkos::parallel_for(
        "telar::SpatialGlobalAvgPool::scale", Kokkos::RangePolicy<Exec>(exec, 0, y.size()),
        KOKKOS_LAMBDA(std::size_t i) { y.data()[i] *= scale; });
  }
  /*! \brief dx(s, c, voxel) = dy(s, c) / the whole sample's voxels.
   *  \param exec execution space instance \param dy output gradient [n, C]
   *  (the same on every rank) \param dx input gradient of the slab */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      saved_type const&) const {
    std::size_t const S = in_.size() / whole_[0];
    T const scale = T(1) / T(voxels());
    Kokkos::parallel_for(
        "telar::SpatialGlobalAvgPool::backward_input",
        Kokkos::RangePolicy<Exec>(exec, 0, dx.extent(0) * dx.extent(1)),
        KOKKOS_LAMBDA(std::size_t i) { dx.data()[i] = dy.data()[i / S] * scale; });
  }

private:
  // Voxels of one channel of the whole sample.
  std::size_t voxels() const { return whole_.size() / whole_[0]; }

  Communicator const* sp_;
  Slab slab_{};
  Shape in_{}, whole_{};
};

} // namespace telar
