#pragma once
/*! \file
 *  \brief Segmentation losses over channel-first outputs [C, (D,) H, W] (a
 *  U-Net's logits, one class per channel) and one label per voxel:
 *  telar::VoxelCrossEntropy and telar::SoftDice.
 *
 *  Both compute the softmax over the channels at each voxel. Cross entropy
 *  is a sum over voxels, so a slab's terms add up (count() and the loss are
 *  summed over a spatial group by the caller). Soft Dice divides sums over
 *  the whole sample, so it is computed in two phases: partial_sums() of a
 *  slab, summed over the group by the caller (telar/parallel/spatial_loss.hpp),
 *  then value() and backward() from the whole sample's sums.
 */
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/detail/math.hpp>
#include <telar/core/error.hpp>
#include <telar/core/loss.hpp>
#include <telar/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace telar {

/*! \brief Voxel labels [n, voxels]. \tparam MemorySpace memory space */
template <class MemorySpace>
using VoxelLabels = Kokkos::View<int**, Kokkos::LayoutRight, MemorySpace>;

namespace detail {

// ShapeError unless logits [n, C * V], labels [n, V] and the gradient match.
inline void voxel_check(char const* loss, std::size_t C, std::size_t n, std::size_t k,
                        std::size_t ln, std::size_t V, std::size_t gn, std::size_t gk) {
  if (C == 0 || ln != n || gn != n || gk != k || k != C * V)
    throw ShapeError(std::string("telar::") + loss + ": logits [" + std::to_string(n) + ", " +
                     std::to_string(k) + "], labels [" + std::to_string(ln) + ", " +
                     std::to_string(V) + "] and gradient [" + std::to_string(gn) + ", " +
                     std::to_string(gk) + "] do not match [n, " + std::to_string(C) +
                     " * voxels] and [n, voxels]");
}

// Softmax over the C channels of voxel v of sample row z (channel-first):
// returns the maximum and the sum of exp(z - max), so p_c = exp(z_c - m) / s.
template <class T>
KOKKOS_INLINE_FUNCTION void voxel_softmax(T const* z, std::size_t V, int C, T& m, T& s) {
  m = z[0];
  for (int c = 1; c < C; ++c)
    m = z[std::size_t(c) * V] > m ? z[std::size_t(c) * V] : m;
  s = 0;
  for (int c = 0; c < C; ++c)
    s += detail::exp(z[std::size_t(c) * V] - m);
}

// Sum over voxels of -log p_label; dz = scale (p - onehot). Labels outside
// [0, C) count as no class.
template <class Exec, class T, class M>
double voxel_ce(Exec const& exec, ConstMatrix<T, M> z, VoxelLabels<M> y, Matrix<T, M> dz, T scale,
                int C) {
  std::size_t const V = y.extent(1), k = z.extent(1);
  double loss = 0;
  Kokkos::parallel_reduce(
      "telar::VoxelCrossEntropy", Kokkos::RangePolicy<Exec>(exec, 0, y.extent(0) * V),
      KOKKOS_LAMBDA(std::size_t i, double& acc) {
        std::size_t const s = i / V, v = i % V;
        T const* row = z.data() + s * k + v;
        T m, sum;
        voxel_softmax(row, V, C, m, sum);
        int const label = y(s, v);
        for (int c = 0; c < C; ++c) {
          T const p = detail::exp(row[std::size_t(c) * V] - m) / sum;
          dz.data()[s * k + std::size_t(c) * V + v] = scale * (p - (c == label ? T(1) : T(0)));
          if (c == label)
            acc += double(m + detail::log(sum) - row[std::size_t(c) * V]);
        }
      },
      loss);
  return loss;
}

} // namespace detail

/*! \brief Cross entropy of the softmax over channels at every voxel, summed
 *  over voxels (count() = voxels in the batch, so the Trainer's scale makes
 *  it the mean over voxels). Follows the Loss concept (telar/core/loss.hpp).
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
class VoxelCrossEntropy : public detail::LayerTypes<T, MemorySpace> {
public:
  /*! \brief One label in [0, classes) per voxel, [n, voxels]. */
  using target_type = VoxelLabels<MemorySpace>;

  /*! \brief \param classes channels of the logits */
  explicit VoxelCrossEntropy(std::size_t classes) : classes_(classes) {}
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "VoxelCrossEntropy"; }
  /*! \brief Loss terms: voxels in the batch. \param labels [n, voxels] */
  template <class Exec>
  long long count(Exec const&, target_type const& labels) const {
    return static_cast<long long>(labels.extent(0) * labels.extent(1));
  }
  /*! \brief The summed loss and scale times its gradient.
   *  \param exec execution space instance \param logits [n, classes * voxels]
   *  \param labels [n, voxels] \param dlogits output gradient, as logits
   *  \param scale gradient scale (1 / voxels in the global batch)
   *  \throws ShapeError when the extents do not match */
  template <class Exec>
  LossSum forward_backward(Exec const& exec, ConstMatrix<T, MemorySpace> logits,
                           target_type const& labels, Matrix<T, MemorySpace> dlogits,
                           T scale) const {
    detail::voxel_check(name(), classes_, logits.extent(0), logits.extent(1), labels.extent(0),
                        labels.extent(1), dlogits.extent(0), dlogits.extent(1));
    LossSum out;
    out.samples = static_cast<long long>(logits.extent(0));
    out.count = count(exec, labels);
    out.loss =
        detail::voxel_ce<Exec, T, MemorySpace>(exec, logits, labels, dlogits, scale, int(classes_));
    return out;
  }

private:
  std::size_t classes_;
};

/*! \brief Soft Dice loss (Milletari et al. 2016, squared-free form) over
 *  the softmax p of the logits and the one-hot labels t: per sample,
 *  1 - mean over classes c of (2 sum p_c t_c + eps) / (sum p_c + sum t_c +
 *  eps), the sums over the sample's voxels. count() is the samples.
 *
 *  The sums span the whole sample: with the sample split over ranks, sum
 *  partial_sums() over the group before value() and backward()
 *  (telar::spatial_soft_dice does). forward_backward() is the unsplit case.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
class SoftDice : public detail::LayerTypes<T, MemorySpace> {
public:
  /*! \brief One label in [0, classes) per voxel, [n, voxels]. */
  using target_type = VoxelLabels<MemorySpace>;

  /*! \brief \param classes channels of the logits \param eps smoothing */
  explicit SoftDice(std::size_t classes, double eps = 1) : classes_(classes), eps_(eps) {}
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "SoftDice"; }

  /*! \brief Per sample s and class c, sum p t, sum p and sum t over this
   *  rank's voxels, at [(s C + c) 3 + {0, 1, 2}].
   *  \param exec execution space instance \param logits [n, classes * voxels]
   *  \param labels [n, voxels] \throws ShapeError when the extents do not match */
  template <class Exec>
  std::vector<double> partial_sums(Exec const& exec, ConstMatrix<T, MemorySpace> logits,
                                   target_type const& labels) const {
    detail::voxel_check(name(), classes_, logits.extent(0), logits.extent(1), labels.extent(0),
                        labels.extent(1), logits.extent(0), logits.extent(1));
    std::size_t const n = logits.extent(0), V = labels.extent(1), k = logits.extent(1);
    int const C = int(classes_);
    Kokkos::View<double*, MemorySpace> sums("telar::SoftDice::sums", n * classes_ * 3);
    auto z = logits;
    auto y = labels;
    Kokkos::parallel_for(
        "telar::SoftDice::partial_sums", Kokkos::RangePolicy<Exec>(exec, 0, n * classes_),
        KOKKOS_LAMBDA(std::size_t i) {
          std::size_t const s = i / std::size_t(C);
          int const c = int(i % std::size_t(C));
          double pt = 0, p = 0, t = 0;
          for (std::size_t v = 0; v < V; ++v) {
            T const* row = z.data() + s * k + v;
            T m, sum;
            detail::voxel_softmax(row, V, C, m, sum);
            double const pc = double(detail::exp(row[std::size_t(c) * V] - m) / sum);
            double const tc = y(s, v) == c ? 1.0 : 0.0;
            pt += pc * tc, p += pc, t += tc;
          }
          sums(3 * i) = pt, sums(3 * i + 1) = p, sums(3 * i + 2) = t;
        });
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, sums);
    return std::vector<double>(h.data(), h.data() + h.extent(0));
  }

  /*! \brief The loss summed over samples, from the whole samples' sums.
   *  \param sums partial_sums() summed over the group */
  double value(std::vector<double> const& sums) const {
    double loss = 0;
    std::size_t const n = sums.size() / (3 * classes_);
    for (std::size_t s = 0; s < n; ++s) {
      double dice = 0;
      for (std::size_t c = 0; c < classes_; ++c) {
        double const* q = sums.data() + 3 * (s * classes_ + c);
        dice += (2 * q[0] + eps_) / (q[1] + q[2] + eps_);
      }
      loss += 1 - dice / double(classes_);
    }
    return loss;
  }

  /*! \brief dlogits = scale times the gradient of the summed loss, for this
   *  rank's voxels, from the whole samples' sums.
   *  \param exec execution space instance \param logits [n, classes * voxels]
   *  \param labels [n, voxels] \param sums partial_sums() summed over the group
   *  \param dlogits output gradient, as logits \param scale gradient scale */
  template <class Exec>
  void backward(Exec const& exec, ConstMatrix<T, MemorySpace> logits, target_type const& labels,
                std::vector<double> const& sums, Matrix<T, MemorySpace> dlogits, T scale) const {
    detail::voxel_check(name(), classes_, logits.extent(0), logits.extent(1), labels.extent(0),
                        labels.extent(1), dlogits.extent(0), dlogits.extent(1));
    std::size_t const n = logits.extent(0), V = labels.extent(1), k = logits.extent(1);
    int const C = int(classes_);
    // Per (s, c): dL/dp = a_c t - b_c with a = -2 / (C D), b = -N / (C D^2),
    // N = 2 sum p t + eps, D = sum p + sum t + eps.
    Kokkos::View<double*, MemorySpace> ab("telar::SoftDice::coefficients", n * classes_ * 2);
    auto hab = Kokkos::create_mirror_view(ab);
    for (std::size_t i = 0; i < n * classes_; ++i) {
      double const N = 2 * sums[3 * i] + eps_, D = sums[3 * i + 1] + sums[3 * i + 2] + eps_;
      hab(2 * i) = -2 / (double(C) * D);
      hab(2 * i + 1) = -N / (double(C) * D * D);
    }
    Kokkos::deep_copy(exec, ab, hab);
    auto z = logits;
    auto y = labels;
    auto dz = dlogits;
    Kokkos::parallel_for(
        "telar::SoftDice::backward", Kokkos::RangePolicy<Exec>(exec, 0, n * V),
        KOKKOS_LAMBDA(std::size_t i) {
          std::size_t const s = i / V, v = i % V;
          T const* row = z.data() + s * k + v;
          T m, sum;
          detail::voxel_softmax(row, V, C, m, sum);
          // Through the softmax: dz_c = p_c (g_c - sum_c' p_c' g_c').
          double dot = 0;
          for (int c = 0; c < C; ++c) {
            std::size_t const j = 2 * (s * std::size_t(C) + std::size_t(c));
            double const p = double(detail::exp(row[std::size_t(c) * V] - m) / sum);
            dot += p * (ab(j) * (y(s, v) == c ? 1.0 : 0.0) - ab(j + 1));
          }
          for (int c = 0; c < C; ++c) {
            std::size_t const j = 2 * (s * std::size_t(C) + std::size_t(c));
            double const p = double(detail::exp(row[std::size_t(c) * V] - m) / sum);
            double const g = ab(j) * (y(s, v) == c ? 1.0 : 0.0) - ab(j + 1);
            dz.data()[s * k + std::size_t(c) * V + v] = scale * T(p * (g - dot));
          }
        });
  }

  /*! \brief The unsplit loss (Loss concept): summed over samples, with
   *  scale times its gradient. \param exec execution space instance
   *  \param logits [n, classes * voxels] \param labels [n, voxels]
   *  \param dlogits output gradient \param scale gradient scale (1 / samples
   *  in the global batch) */
  template <class Exec>
  LossSum forward_backward(Exec const& exec, ConstMatrix<T, MemorySpace> logits,
                           target_type const& labels, Matrix<T, MemorySpace> dlogits,
                           T scale) const {
    auto const sums = partial_sums(exec, logits, labels);
    backward(exec, logits, labels, sums, dlogits, scale);
    LossSum out;
    out.samples = out.count = static_cast<long long>(logits.extent(0));
    out.loss = value(sums);
    return out;
  }

private:
  std::size_t classes_;
  double eps_;
};

} // namespace telar
