#pragma once
/*! \file
 *  \brief telar::SpatialGroupNorm: telar::GroupNorm on slabs of samples
 *  split along their first spatial axis over a spatial group.
 *
 *  GroupNorm's statistics are per (sample, group) over the group's channels
 *  and the whole sample's voxels, which a slab holds a part of: each rank
 *  sums its part (in double), one allreduce of 2 n groups values gives the
 *  sample's sums, and the layer normalises its own rows with them. Backward
 *  does the same with the two sums of the input gradient. Unlike BatchNorm
 *  there are no running statistics: training and evaluation agree, and the
 *  result does not depend on the batch (nor on dp). See docs/spatial.md.
 *  \code
 *  telar::SpatialGroupNorm<float> gn(sp_comm, telar::GroupNorm<float>(4, 16));
 *  gn.build({16, 64, 32, 32});   // the whole sample; this rank holds gn.input_shape()
 *  \endcode
 */
#include <telar/comm/communicator.hpp>
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/normalization.hpp>
#include <telar/parallel/detail/spatial.hpp>
#include <telar/parallel/spatial_decomposition.hpp>
#include <telar/profile/trace.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace telar {

/*! \brief telar::GroupNorm whose statistics span every slab of the spatial
 *  group: equal to the unsplit layer on every rank's rows.
 *  \tparam T value type \tparam M memory space (host-accessible) */
template <class T = float, class M = DefaultMemorySpace>
class SpatialGroupNorm : public detail::LayerTypes<T, M> {
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, M>::accessible,
                "telar::SpatialGroupNorm: the memory space must be host-accessible (device "
                "staging is not implemented yet)");

public:
  /*! \brief What backward needs from forward: the input slab and each
   *  (sample, group)'s mean and 1/std over the whole sample. */
  struct saved_type {
    ConstMatrix<T, M> x;      //!< the input slab
    std::vector<double> mean; //!< [n * groups]
    std::vector<double> rstd; //!< [n * groups]
  };

  /*! \brief Runs \p gn (configured, not initialised) over slabs of the
   *  spatial group \p sp (kept by reference: it must outlive this object). */
  SpatialGroupNorm(Communicator const& sp, GroupNorm<T, M> gn) : layer(std::move(gn)), sp_(&sp) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "GroupNorm"; }
  /*! \brief This rank's slab of the whole sample shape \p in.
   *  \throws ShapeError for a shape GroupNorm refuses or a split leaving a
   *  rank an empty slab */
  void build(Shape const& in) {
    layer.output_shape(in);
    detail::check_split(name(), in[1], "input", in[1], detail::group_size(*sp_));
    slab_ = split_extent(in[1], detail::group_size(*sp_), detail::group_rank(*sp_));
    whole_ = in_ = in;
    in_.dims[1] = slab_.size();
  }
  /*! \brief This rank's input slab shape. */
  Shape input_shape() const { return in_; }
  /*! \brief This rank's output slab shape. */
  Shape output_shape() const { return in_; }
  /*! \brief The unsplit output shape. */
  Shape whole_output_shape() const { return whole_; }
  /*! \brief This rank's rows of the first spatial axis. */
  Slab slab() const { return slab_; }
  /*! \brief Mean and 1/std per (sample, group), in double.
   *  \param samples samples per rank */
  std::size_t saved_bytes(std::size_t samples, Shape const& = {}) const {
    return 2 * samples * layer.groups() * sizeof(double);
  }
  /*! \brief None in Kokkos (the sums are host vectors). */
  std::size_t workspace_bytes(std::size_t, Shape const& = {}) const { return 0; }

  /*! \brief gamma = 1, beta = 0 (the seed is unused). \param seed stream seed */
  void initialize(std::uint64_t seed) { layer.initialize(seed); }
  /*! \brief Records this layer's gradient sums over the group on \p trace
   *  (null: none; telar::SlabGraph::set_trace passes its own).
   *  \param trace the rank's recorder, kept by pointer */
  void set_trace(TraceRecorder* trace) { sum_.set_trace(trace); }
  /*! \brief Leaves this rank's part of the parameter gradients unsummed
   *  over the group (\p on; telar::SlabGraph::set_partial_gradients).
   *  \param on true: partial; false: summed (the default) */
  void set_partial_gradients(bool on) { sum_.set_partial(on); }
  /*! \brief Visits ("weight", gamma) and ("bias", beta) if affine. */
  template <class F>
  void parameters(F&& f) {
    layer.parameters(std::forward<F>(f));
  }

  /*! \brief y = gamma[c] (x - mean) rstd + beta[c] with the sample's
   *  statistics. \param exec execution space instance \param x input slab
   *  \param y output slab \param saved keeps x and the statistics */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, M> x, Matrix<T, M> y, saved_type& saved) {
    exec.fence();
    std::size_t const n = x.extent(0), G = layer.groups();
    std::vector<double> sums(2 * n * G, 0.0);
    each_group(n, [&](std::size_t s, std::size_t g, std::size_t, std::size_t lo, std::size_t hi) {
      double a = 0, b = 0;
      for (std::size_t k = lo; k < hi; ++k)
        a += double(x(s, k)), b += double(x(s, k)) * double(x(s, k));
      sums[2 * (s * G + g)] = a, sums[2 * (s * G + g) + 1] = b;
    });
    sp_->allreduce(sums.data(), sums.size());
    double const N = group_values();
    saved.x = x;
    saved.mean.assign(n * G, 0.0), saved.rstd.assign(n * G, 0.0);
    for (std::size_t i = 0; i < n * G; ++i) {
      double const mean = sums[2 * i] / N, var = std::max(0.0, sums[2 * i + 1] / N - mean * mean);
      saved.mean[i] = mean, saved.rstd[i] = 1 / std::sqrt(var + layer.eps());
    }
    each_channel(n,
                 [&](std::size_t s, std::size_t i, std::size_t c, std::size_t lo, std::size_t hi) {
                   double const w = gamma(c), b = beta(c);
                   for (std::size_t k = lo; k < hi; ++k)
                     y(s, k) = T(w * (double(x(s, k)) - saved.mean[i]) * saved.rstd[i] + b);
                 });
  }

  /*! \brief dx = rstd (dy gamma - mean(dy gamma) - x_hat mean(dy gamma
   *  x_hat)), the means over the whole sample's group. \param exec
   *  execution space instance \param dy output gradient \param dx input
   *  gradient \param saved from forward */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, M> dy, Matrix<T, M> dx,
                      saved_type const& saved) {
    exec.fence();
    std::size_t const n = dy.extent(0), G = layer.groups();
    std::vector<double> sums(2 * n * G, 0.0);
    each_channel(n,
                 [&](std::size_t s, std::size_t i, std::size_t c, std::size_t lo, std::size_t hi) {
                   double const w = gamma(c);
                   for (std::size_t k = lo; k < hi; ++k) {
                     double const g = double(dy(s, k)) * w;
                     sums[2 * i] += g;
                     sums[2 * i + 1] += g * (double(saved.x(s, k)) - saved.mean[i]) * saved.rstd[i];
                   }
                 });
    sp_->allreduce(sums.data(), sums.size());
    double const N = group_values();
    each_channel(n, [&](std::size_t s, std::size_t i, std::size_t c, std::size_t lo,
                        std::size_t hi) {
      double const w = gamma(c), a = sums[2 * i] / N, b = sums[2 * i + 1] / N, r = saved.rstd[i];
      for (std::size_t k = lo; k < hi; ++k) {
        double const xhat = (double(saved.x(s, k)) - saved.mean[i]) * r;
        dx(s, k) = T(r * (double(dy(s, k)) * w - a - xhat * b));
      }
    });
  }

  /*! \brief dgamma[c] += sum dy x_hat, dbeta[c] += sum dy over the whole
   *  sample (this rank's part, summed over the group). \param exec
   *  execution space instance \param dy output gradient \param saved from forward */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<T, M> dy, saved_type const& saved) {
    if (!layer.affine())
      return;
    exec.fence();
    sum_(layer, *sp_, [&] {
      each_channel(dy.extent(0), [&](std::size_t s, std::size_t i, std::size_t c, std::size_t lo,
                                     std::size_t hi) {
        double dw = 0, db = 0;
        for (std::size_t k = lo; k < hi; ++k) {
          dw += double(dy(s, k)) * (double(saved.x(s, k)) - saved.mean[i]) * saved.rstd[i];
          db += double(dy(s, k));
        }
        layer.weight_grad(c) += T(dw), layer.bias_grad(c) += T(db);
      });
    });
  }

  GroupNorm<T, M> layer; //!< the configuration and the parameters

private:
  // Values of one (sample, group) in the whole sample.
  double group_values() const {
    return double(layer.channels() / layer.groups() * whole_.size() / whole_[0]);
  }
  double gamma(std::size_t c) const { return layer.affine() ? double(layer.weight(c)) : 1.0; }
  double beta(std::size_t c) const { return layer.affine() ? double(layer.bias(c)) : 0.0; }
  // f(sample, group, first channel, [lo, hi) columns) for every (sample, group).
  template <class F>
  void each_group(std::size_t n, F&& f) const {
    std::size_t const G = layer.groups(), per = layer.channels() / G, cols = in_.size() / in_[0];
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t g = 0; g < G; ++g)
        f(s, g, g * per, g * per * cols, (g + 1) * per * cols);
  }
  // f(sample, sample * groups + group, channel, [lo, hi) columns) per channel.
  template <class F>
  void each_channel(std::size_t n, F&& f) const {
    std::size_t const G = layer.groups(), per = layer.channels() / G, cols = in_.size() / in_[0];
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t c = 0; c < layer.channels(); ++c)
        f(s, s * G + c / per, c, c * cols, (c + 1) * cols);
  }

  Communicator const* sp_;
  Slab slab_{};
  Shape in_{}, whole_{};
  detail::GroupGradientSum<T> sum_;
};

} // namespace telar
