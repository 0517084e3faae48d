#pragma once
/*! \file
 *  \brief Segmentation losses over samples split into slabs: each rank holds
 *  its slab's logits and labels, the sums that span a sample are reduced
 *  over the spatial group, and every rank gets the whole batch's loss and
 *  the gradient of its own voxels (telar::spatial_voxel_cross_entropy,
 *  telar::spatial_soft_dice). The mean is over the group's batch; a
 *  data-parallel reduction on top is the Trainer's, as for any loss.
 */
#include <telar/comm/communicator.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/voxel_losses.hpp>

#include <vector>

namespace telar {

namespace detail {
// A non-deduced parameter type: logits convert from Matrix to ConstMatrix.
template <class X>
struct no_deduce {
  using type = X;
};
template <class T, class M>
using ConstLogits = typename no_deduce<ConstMatrix<T, M>>::type;
} // namespace detail

/*! \brief Voxel-wise cross entropy, mean over every voxel of the group's
 *  samples; dlogits gets the gradient of that mean for this rank's voxels.
 *  \param exec execution space instance \param loss the loss
 *  \param sp the spatial group \param logits this rank's slab [n, classes * voxels]
 *  \param labels its labels [n, voxels] \param dlogits output gradient
 *  \return the mean loss (the same on every rank) */
template <class Exec, class T, class M>
double spatial_voxel_cross_entropy(Exec const& exec, VoxelCrossEntropy<T, M> const& loss,
                                   Communicator const& sp, detail::ConstLogits<T, M> logits,
                                   VoxelLabels<M> const& labels, Matrix<T, M> dlogits) {
  long long count = loss.count(exec, labels);
  sp.allreduce(&count, 1);
  LossSum const s = loss.forward_backward(exec, logits, labels, dlogits, T(1.0 / double(count)));
  double sum = s.loss;
  sp.allreduce(&sum, 1);
  return sum / double(count);
}

/*! \brief Soft Dice, mean over the samples, with each sample's sums over
 *  every slab of the group; dlogits gets the gradient of that mean for this
 *  rank's voxels. \param exec execution space instance \param loss the loss
 *  \param sp the spatial group \param logits this rank's slab [n, classes * voxels]
 *  \param labels its labels [n, voxels] \param dlogits output gradient
 *  \return the mean loss (the same on every rank) */
template <class Exec, class T, class M>
double spatial_soft_dice(Exec const& exec, SoftDice<T, M> const& loss, Communicator const& sp,
                         detail::ConstLogits<T, M> logits, VoxelLabels<M> const& labels,
                         Matrix<T, M> dlogits) {
  std::vector<double> sums = loss.partial_sums(exec, logits, labels);
  sp.allreduce(sums.data(), sums.size());
  double const n = double(logits.extent(0));
  loss.backward(exec, logits, labels, sums, dlogits, T(1 / n));
  return loss.value(sums) / n;
}

} // namespace telar
