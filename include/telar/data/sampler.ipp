// What telar/data/sampler.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/data/sampler.hpp>

namespace telar {

TELAR_DECL DistributedSampler::DistributedSampler(std::size_t dataset_size, int num_replicas,
                                                  int rank, std::uint64_t seed, bool shuffle,
                                                  LastBatch last_batch)
    : size_(dataset_size), replicas_(num_replicas), rank_(rank), seed_(seed), shuffle_(shuffle),
      last_batch_(last_batch) {
  if (num_replicas < 1) {
    throw std::invalid_argument("telar::DistributedSampler: num_replicas = " +
                                std::to_string(num_replicas) + ", expected at least 1");
  }
  if (rank < 0 || rank >= num_replicas) {
    throw std::invalid_argument("telar::DistributedSampler: rank " + std::to_string(rank) +
                                " is out of range for " + std::to_string(num_replicas) +
                                " replicas");
  }
  if (last_batch != LastBatch::drop && last_batch != LastBatch::pad &&
      last_batch != LastBatch::keep) {
    throw std::invalid_argument("telar::DistributedSampler: unknown LastBatch value");
  }
  make_order();
}

TELAR_DECL void DistributedSampler::set_epoch(std::uint64_t epoch) {
  if (epoch != epoch_) {
    epoch_ = epoch;
    make_order();
  }
}

TELAR_DECL BatchSlice DistributedSampler::slice(std::size_t step, std::size_t local_batch,
                                                int rank) const {
  std::size_t const steps = num_steps(local_batch);
  if (step >= steps) {
    throw std::out_of_range("telar::DistributedSampler: step " + std::to_string(step) +
                            " is past the epoch's " + std::to_string(steps) + " steps");
  }
  if (rank < 0 || rank >= replicas_) {
    throw std::out_of_range("telar::DistributedSampler: rank " + std::to_string(rank) +
                            " is out of range for " + std::to_string(replicas_) + " replicas");
  }
  std::size_t const g = global_batch(local_batch);
  BatchSlice s;
  s.step = step;
  s.global_begin = step * g;
  std::size_t const r = std::size_t(rank);
  if (last_batch_ == LastBatch::keep && step + 1 == steps && size_ % g != 0) {
    // The short last batch, split evenly in rank order.
    s.global_size = size_ - s.global_begin;
    std::size_t const base = s.global_size / std::size_t(replicas_);
    std::size_t const extra = s.global_size % std::size_t(replicas_);
    s.local_size = base + (r < extra ? 1 : 0);
    s.local_begin = r * base + std::min(r, extra);
  } else {
    s.global_size = g;
    s.local_size = local_batch;
    s.local_begin = r * local_batch;
  }
  return s;
}

TELAR_DECL std::vector<std::size_t>
DistributedSampler::local_indices(std::size_t step, std::size_t local_batch) const {
  std::vector<std::size_t> out;
  local_indices(step, local_batch, out);
  return out;
}

TELAR_DECL std::vector<std::size_t>
DistributedSampler::global_indices(std::size_t step, std::size_t local_batch) const {
  BatchSlice const s = slice(step, local_batch);
  std::vector<std::size_t> out;
  copy_positions(s.global_begin, s.global_size, out);
  return out;
}

TELAR_DECL std::size_t DistributedSampler::global_batch(std::size_t local_batch) const {
  if (local_batch == 0) {
    throw std::invalid_argument("telar::DistributedSampler: local batch size must be positive");
  }
  if (local_batch > std::numeric_limits<std::size_t>::max() / std::size_t(replicas_)) {
    throw std::invalid_argument("telar::DistributedSampler: local batch size " +
                                std::to_string(local_batch) + " x " + std::to_string(replicas_) +
                                " replicas overflows");
  }
  return local_batch * std::size_t(replicas_);
}

TELAR_DECL void DistributedSampler::copy_positions(std::size_t first, std::size_t count,
                                                   std::vector<std::size_t>& out) const {
  out.resize(count);
  for (std::size_t k = 0; k < count; ++k) {
    out[k] = order_[(first + k) % size_];
  }
}

TELAR_DECL void DistributedSampler::make_order() {
  order_.resize(size_);
  std::iota(order_.begin(), order_.end(), std::size_t(0));
  if (shuffle_) {
    // A stream of its own, so the order does not repeat other uses of the seed.
    Rng rng(seed_combine(seed_, 0x73616D706C6572ull), epoch_); // "sampler"
    shuffle_range(order_.begin(), order_.end(), rng);
  }
}

} // namespace telar
