#pragma once
/*! \file
 *  \brief telar::SpatialGlobalAvgPool and telar::SpatialGlobalMaxPool:
 *  global pooling over samples split into slabs, the head of a classifier
 *  or regressor (CosmoFlow, a ResNet on volumes) after split convolutions.
 *
 *  Each rank pools its slab per channel, one allreduce over the spatial
 *  group joins the slabs (a sum, or a maximum and then the rank that holds
 *  it), and every rank holds the whole pooled output [C]: the layers after
 *  it run replicated on the group, as on one rank. The input gradient is
 *  local: no message. See docs/spatial.md.
 *  \code
 *  telar::SpatialGlobalAvgPool<float> gap(sp_comm);
 *  gap.build({64, 32, 32, 32});   // the whole sample; this rank holds gap.input_shape()
 *  \endcode
 */
#include <telar/comm/communicator.hpp>
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/parallel/detail/spatial.hpp>
#include <telar/parallel/spatial_decomposition.hpp>

#include <Kokkos_Core.hpp>

#include <climits>
#include <cstddef>
#include <string>

namespace telar {
namespace detail {

// What both global pools over slabs share: the group, the split of the
// whole sample's first spatial axis, the shapes and the checks.
template <class T, class MemorySpace>
class SpatialGlobalPoolBase : public LayerTypes<T, MemorySpace> {
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible,
                "telar::SpatialGlobalAvgPool, telar::SpatialGlobalMaxPool: the memory space must "
                "be host-accessible (device staging is not implemented yet)");

public:
  explicit SpatialGlobalPoolBase(Communicator const& sp) : sp_(&sp) {}

  Shape input_shape() const { return in_; }
  Shape output_shape() const { return Shape(whole_[0]); }
  Shape whole_output_shape() const { return output_shape(); }
  Slab slab() const { return slab_; }

protected:
  void build_slab(char const* name, Shape const& in) {
    (void)global_pool_shape(name, in); // [C, ...] of rank 2 to 4
    check_split(name, in[1], "input", in[1], group_size(*sp_));
    slab_ = split_extent(in[1], group_size(*sp_), group_rank(*sp_));
    whole_ = in;
    in_ = in;
    in_.dims[1] = slab_.size();
  }
  void check(char const* name, char const* what, std::size_t xn, std::size_t xf, std::size_t yn,
             std::size_t yf) const {
    check_global_pool(name, what, xn, xf, yn, yf);
    check_slab_call(name, what, in_, whole_[0], xn, xf, yn, yf);
  }
  // Voxels per channel of this rank's slab, and of the whole sample.
  std::size_t slab_voxels() const { return in_.size() / whole_[0]; }
  std::size_t voxels() const { return whole_.size() / whole_[0]; }

  Communicator const* sp_;
  Slab slab_{};
  Shape in_{}, whole_{};
};

} // namespace detail

/*! \brief Global average pooling ([C, (D,) H, W] -> [C]) over slabs of
 *  samples split along their first spatial axis over a spatial group; the
 *  output is the unsplit layer's (telar::GlobalAvgPool) on every rank.
 *  \tparam T value type \tparam MemorySpace memory space (host-accessible) */
template <class T, class MemorySpace = DefaultMemorySpace>
class SpatialGlobalAvgPool : public detail::SpatialGlobalPoolBase<T, MemorySpace> {
  using Base = detail::SpatialGlobalPoolBase<T, MemorySpace>;

public:
  /*! \brief Nothing: backward needs only the voxel count. */
  struct saved_type {};

  /*! \brief Pools over the spatial group \p sp (kept by reference: it must
   *  outlive this object). \param sp the spatial group */
  explicit SpatialGlobalAvgPool(Communicator const& sp) : Base(sp) {}
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "SpatialGlobalAvgPool"; }
  /*! \brief Builds for this rank's slab of the whole sample shape \p in.
   *  \param in the unsplit input shape [C, (D,) H, W]
   *  \throws ShapeError for another rank or a split leaving a rank an empty slab */
  void build(Shape const& in) { this->build_slab(name(), in); }
  /*! \brief Nothing is kept for backward. */
  std::size_t saved_bytes(std::size_t, Shape const& = {}) const { return 0; }

  /*! \brief y(s, c) = the mean of channel c over every slab of the group.
   *  \param exec execution space instance \param x input slab [n, C * slab voxels]
   *  \param y output [n, C], the same on every rank */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type&) const {
    this->check(name(), "forward", x.extent(0), x.extent(1), y.extent(0), y.extent(1));
    std::size_t const S = this->slab_voxels();
    Kokkos::parallel_for(
        "telar::SpatialGlobalAvgPool::forward", Kokkos::RangePolicy<Exec>(exec, 0, y.size()),
        KOKKOS_LAMBDA(std::size_t r) {
          T const* in = x.data() + r * S;
          T acc = 0;
          for (std::size_t i = 0; i < S; ++i)
            acc += in[i];
          y.data()[r] = acc;
        });
    exec.fence();
    this->sp_->allreduce(y.data(), y.size()); // the slabs' sums
    T const scale = T(1) / T(this->voxels());
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
    this->check(name(), "backward_input", dx.extent(0), dx.extent(1), dy.extent(0), dy.extent(1));
    std::size_t const S = this->slab_voxels();
    T const scale = T(1) / T(this->voxels());
    Kokkos::parallel_for(
        "telar::SpatialGlobalAvgPool::backward_input",
        Kokkos::RangePolicy<Exec>(exec, 0, dx.size()),
        KOKKOS_LAMBDA(std::size_t i) { dx.data()[i] = dy.data()[i / S] * scale; });
  }
};

/*! \brief Global max pooling ([C, (D,) H, W] -> [C]) over slabs of samples
 *  split along their first spatial axis over a spatial group; the output
 *  is the unsplit layer's (telar::GlobalMaxPool) on every rank, and so is
 *  the voxel a tie sends the gradient to (the first along the channel: the
 *  lowest rank holding the maximum, its first voxel).
 *  \tparam T value type \tparam MemorySpace memory space (host-accessible) */
template <class T, class MemorySpace = DefaultMemorySpace>
class SpatialGlobalMaxPool : public detail::SpatialGlobalPoolBase<T, MemorySpace> {
  using Base = detail::SpatialGlobalPoolBase<T, MemorySpace>;
  using Index = Kokkos::View<int**, Kokkos::LayoutRight, MemorySpace>;

public:
  /*! \brief Each channel's maximum in this slab, and the rank that holds
   *  the whole sample's. */
  struct saved_type {
    Index argmax; //!< [n, C]: position of the slab's maximum within its channel
    Index owner;  //!< [n, C]: the group rank whose slab holds the sample's maximum
  };

  /*! \brief Pools over the spatial group \p sp (kept by reference: it must
   *  outlive this object). \param sp the spatial group */
  explicit SpatialGlobalMaxPool(Communicator const& sp) : Base(sp) {}
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "SpatialGlobalMaxPool"; }
  /*! \brief Builds for this rank's slab of the whole sample shape \p in.
   *  \param in the unsplit input shape [C, (D,) H, W]
   *  \throws ShapeError for another rank or a split leaving a rank an empty slab */
  void build(Shape const& in) { this->build_slab(name(), in); }
  /*! \brief The argmax and owner of every channel. \param samples rows */
  std::size_t saved_bytes(std::size_t samples, Shape const& = {}) const {
    return 2 * samples * this->whole_[0] * sizeof(int);
  }

  /*! \brief y(s, c) = the maximum of channel c over every slab of the group.
   *  \param exec execution space instance \param x input slab [n, C * slab voxels]
   *  \param y output [n, C], the same on every rank \param saved for backward */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type& saved) const {
    this->check(name(), "forward", x.extent(0), x.extent(1), y.extent(0), y.extent(1));
    std::size_t const n = y.extent(0), C = y.extent(1);
    detail::ensure_index_matrix(saved.argmax, n, C, "telar::SpatialGlobalMaxPool::argmax");
    detail::ensure_index_matrix(saved.owner, n, C, "telar::SpatialGlobalMaxPool::owner");
    Matrix<T, MemorySpace> local("telar::scratch", n, C);
    detail::global_max_forward(exec, x, local, saved.argmax);
    Kokkos::deep_copy(exec, y, local);
    exec.fence();
    this->sp_->allreduce(y.data(), y.size(), ReduceOp::max);
    // Ties between slabs go to the lowest rank (the first voxel along the channel).
    int const rank = detail::group_rank(*this->sp_);
    Index owner = saved.owner;
    Kokkos::parallel_for(
        "telar::SpatialGlobalMaxPool::candidates", Kokkos::RangePolicy<Exec>(exec, 0, y.size()),
        KOKKOS_LAMBDA(std::size_t r) {
          owner.data()[r] = local.data()[r] == y.data()[r] ? rank : INT_MAX;
        });
    exec.fence();
    this->sp_->allreduce(owner.data(), owner.size(), ReduceOp::min);
  }
  /*! \brief dx = dy at each channel's maximum if this slab holds it, 0
   *  elsewhere. \param exec execution space instance \param dy output
   *  gradient [n, C] (the same on every rank) \param dx input gradient of
   *  the slab \param saved from forward */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      saved_type const& saved) const {
    this->check(name(), "backward_input", dx.extent(0), dx.extent(1), dy.extent(0), dy.extent(1));
    std::size_t const S = this->slab_voxels();
    int const rank = detail::group_rank(*this->sp_);
    Index const argmax = saved.argmax, owner = saved.owner;
    Kokkos::parallel_for(
        "telar::SpatialGlobalMaxPool::backward_input",
        Kokkos::RangePolicy<Exec>(exec, 0, dx.size()), KOKKOS_LAMBDA(std::size_t i) {
          std::size_t const r = i / S;
          bool const here = owner.data()[r] == rank && std::size_t(argmax.data()[r]) == i % S;
          dx.data()[i] = here ? T(dy.data()[r]) : T(0);
        });
  }
};

} // namespace telar
