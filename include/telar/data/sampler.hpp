#pragma once
/*! \file
 *  \brief `telar::DistributedSampler`: the seeded per-epoch order of a data
 *  set and each rank's part of every global batch.
 *
 *  Knows no MPI: a rank is just a number, so all ranks can be simulated in
 *  one process. */

#include <telar/core/detail/decl.hpp>
#include <telar/data/random.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace telar {

/*! \brief What to do with the last global batch of an epoch when the data
 *  set's size is not a multiple of the global batch (replicas x local batch). */
enum class LastBatch {
  /*! \brief Drop the incomplete last global batch: every step has exactly
   *  replicas x local batch samples; up to global batch - 1 samples (different
   *  ones each epoch when shuffling) are not seen. The default for training. */
  drop,
  /*! \brief Complete the last global batch by wrapping around to the start of
   *  the epoch's order (position `k` holds `order[k % size]`): every step is
   *  full and every sample is seen, a few twice. Use it where each sample must
   *  be seen and equal batches matter more than exact weighting. */
  pad,
  /*! \brief Keep a smaller last global batch of `t` samples, split over the
   *  ranks in order as evenly as possible: rank `r` gets `t / R` samples, plus
   *  one if `r < t % R` (so a rank may get none when `t < R`). Every sample is
   *  seen exactly once. Training with it must weight by sample: sum the
   *  per-sample losses and divide by the global batch size
   *  (`BatchSlice::global_size`), not average per-rank means, and a rank with
   *  no samples still joins the gradient reduction with zeros. */
  keep
};

/*! \brief The name of a `LastBatch` policy ("drop", "pad" or "keep"), for logs.
 *  \param policy the policy */
constexpr char const* to_string(LastBatch policy) noexcept {
  return policy == LastBatch::drop ? "drop" : policy == LastBatch::pad ? "pad" : "keep";
}

/*! \brief Where one step's global batch and one rank's part of it lie in the
 *  epoch's order. */
struct BatchSlice {
  std::size_t step = 0;         //!< the step, 0-based within the epoch
  std::size_t global_begin = 0; //!< position of the global batch's first sample in the epoch order
  std::size_t global_size = 0;  //!< samples in the global batch, all ranks together
  std::size_t local_begin = 0;  //!< offset of this rank's first sample within the global batch
  std::size_t local_size = 0;   //!< samples of this rank in this step
};

/*! \brief The per-epoch order of a data set's samples and each rank's share of
 *  each global batch, the same on every rank.
 *
 *  For an epoch `e`, the order is a permutation of `0 .. size-1` made by
 *  Fisher-Yates with `telar::Rng` from `(seed, e)` only (identity without
 *  shuffling): every rank computes the same order without communicating,
 *  whatever the number of replicas. With local batch `b` and `R` replicas the
 *  global batch is `G = R b`; step `s` takes the order's positions
 *  `[s G, s G + G)`, and rank `r` owns the contiguous slice
 *  `[s G + r b, s G + r b + b)` of them. Hence:
 *
 *  - the ranks' shares are disjoint and together cover the global batch;
 *  - the global batch at step `s` is the concatenation of ranks 0..R-1's
 *    local batches, and equals, in order, the batch at step `s` of a serial
 *    sampler (`R = 1`) with local batch `G`. Data-parallel training therefore
 *    sees the same batches as the serial reference.
 *
 *  Unlike PyTorch's DistributedSampler (rank `r` takes positions `r, r+R, ...`),
 *  shares are cut per global batch, which is what keeps that order; a rank's
 *  set of samples over an epoch thus depends on the local batch size, which
 *  is why the queries take it. The last incomplete global batch follows the
 *  `LastBatch` policy. With one replica this is a plain seeded shuffler.
 *
 *  \code
 *  telar::DistributedSampler sampler(data.size, comm.size(), comm.rank(), seed);
 *  for (std::uint64_t epoch = 0; epoch < epochs; ++epoch) {
 *    sampler.set_epoch(epoch);
 *    for (std::size_t s = 0; s < sampler.num_steps(batch); ++s) {
 *      std::vector<std::size_t> mine = sampler.local_indices(s, batch);
 *      ...
 *    }
 *  }
 *  \endcode */
class DistributedSampler {
public:
  /*! \brief Makes the sampler and computes epoch 0's order.
   *  \param dataset_size number of samples in the data set
   *  \param num_replicas number of data-parallel ranks (at least 1)
   *  \param rank this rank, in `[0, num_replicas)`
   *  \param seed the shuffling seed; must be the same on every rank
   *  \param shuffle whether to shuffle (false: samples in stored order)
   *  \param last_batch what to do with an incomplete last global batch
   *  \throws std::invalid_argument if `num_replicas` or `rank` is out of range */
  TELAR_DECL DistributedSampler(std::size_t dataset_size, int num_replicas = 1, int rank = 0,
                                std::uint64_t seed = 0, bool shuffle = true,
                                LastBatch last_batch = LastBatch::drop);

  /*! \brief Moves to epoch `epoch` and recomputes the order from `(seed, epoch)`.
   *  Call it with the same epoch on every rank before each epoch.
   *  \param epoch the epoch */
  TELAR_DECL void set_epoch(std::uint64_t epoch);

  /*! \brief The current epoch. */
  std::uint64_t epoch() const noexcept { return epoch_; }
  /*! \brief Number of samples in the data set. */
  std::size_t dataset_size() const noexcept { return size_; }
  /*! \brief Number of data-parallel ranks. */
  int num_replicas() const noexcept { return replicas_; }
  /*! \brief This rank. */
  int rank() const noexcept { return rank_; }
  /*! \brief The shuffling seed. */
  std::uint64_t seed() const noexcept { return seed_; }
  /*! \brief Whether the order is shuffled. */
  bool shuffle() const noexcept { return shuffle_; }
  /*! \brief The policy for the last global batch. */
  LastBatch last_batch() const noexcept { return last_batch_; }

  /*! \brief The current epoch's order: a permutation of `0 .. dataset_size-1`,
   *  the same on every rank. */
  std::vector<std::size_t> const& order() const noexcept { return order_; }

  /*! \brief Number of steps in an epoch: `size / G` for `drop`, `ceil(size / G)`
   *  for `pad` and `keep` (`G` = replicas x local batch); the same on every rank.
   *  \param local_batch samples per rank per step (at least 1) */
  std::size_t num_steps(std::size_t local_batch) const {
    std::size_t const g = global_batch(local_batch);
    return last_batch_ == LastBatch::drop ? size_ / g : size_ / g + (size_ % g != 0);
  }

  /*! \brief Samples this rank sees in an epoch (with `pad`, including repeats).
   *  \param local_batch samples per rank per step */
  std::size_t num_local_samples(std::size_t local_batch) const {
    std::size_t const steps = num_steps(local_batch);
    return steps == 0 ? 0 : (steps - 1) * local_batch + slice(steps - 1, local_batch).local_size;
  }

  /*! \brief Where step `step`'s global batch and this rank's part of it lie.
   *  \param step the step, below `num_steps(local_batch)`
   *  \param local_batch samples per rank per step
   *  \throws std::out_of_range if `step` is past the epoch */
  BatchSlice slice(std::size_t step, std::size_t local_batch) const {
    return slice(step, local_batch, rank_);
  }

  /*! \brief Where step `step`'s global batch and rank `rank`'s part of it lie
   *  (any rank, to simulate or check others).
   *  \param step the step, below `num_steps(local_batch)`
   *  \param local_batch samples per rank per step
   *  \param rank the rank, in `[0, num_replicas)`
   *  \throws std::out_of_range if `step` is past the epoch or `rank` out of range */
  TELAR_DECL BatchSlice slice(std::size_t step, std::size_t local_batch, int rank) const;

  /*! \brief This rank's sample indices at step `step`, in order, into `out`
   *  (its capacity is reused).
   *  \param step the step, below `num_steps(local_batch)`
   *  \param local_batch samples per rank per step
   *  \param out receives `slice(step, local_batch).local_size` indices */
  void local_indices(std::size_t step, std::size_t local_batch,
                     std::vector<std::size_t>& out) const {
    BatchSlice const s = slice(step, local_batch);
    copy_positions(s.global_begin + s.local_begin, s.local_size, out);
  }

  /*! \brief This rank's sample indices at step `step`, in order.
   *  \param step the step, below `num_steps(local_batch)`
   *  \param local_batch samples per rank per step */
  TELAR_DECL std::vector<std::size_t> local_indices(std::size_t step,
                                                    std::size_t local_batch) const;

  /*! \brief All ranks' sample indices at step `step`: ranks 0..R-1's local
   *  batches concatenated, which is also the serial sampler's batch.
   *  \param step the step, below `num_steps(local_batch)`
   *  \param local_batch samples per rank per step */
  TELAR_DECL std::vector<std::size_t> global_indices(std::size_t step,
                                                     std::size_t local_batch) const;

private:
  TELAR_DECL std::size_t global_batch(std::size_t local_batch) const;

  // Positions past the end wrap around (only LastBatch::pad reaches them).
  TELAR_DECL void copy_positions(std::size_t first, std::size_t count,
                                 std::vector<std::size_t>& out) const;

  TELAR_DECL void make_order();

  std::size_t size_;
  int replicas_;
  int rank_;
  std::uint64_t seed_;
  bool shuffle_;
  LastBatch last_batch_;
  std::uint64_t epoch_ = 0;
  std::vector<std::size_t> order_;
};

} // namespace telar

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/data/sampler.ipp>
#endif
