#pragma once
// Gradient sync for ZeRO stage 2: rank r of the data-parallel group owns the
// flat range [r N/dp, (r+1) N/dp) of parameters, as in ZeRO<1>. Gradients
// are reduce-scattered group by group (the buckets of bucket_plan.hpp) as
// backward completes them: each group is one MPI_Ireduce_scatter whose block
// for rank r is the part of the group inside r's shard, received straight
// into r's shard-sized gradient buffer. So reduction overlaps backward as
// with NoSharding, and the optimizer updates the shard as in ZeRO<1>; the
// updated shards are then all-gathered (parameters stay resident).
//
// No rank holds the full flat gradient: the layers accumulate into the
// buffers of the groups in progress only (group_gradients.hpp), and a group
// is reduced once, after its last micro-batch.
#include <telar/core/parameters.hpp>
#include <telar/parallel/detail/gradient_sync_decl.hpp>
#include <telar/parallel/detail/sync_group_gradients.hpp>
#include <telar/parallel/detail/zero_sharding.hpp>
#include <telar/parallel/strategy.hpp>

#include <utility>
#include <vector>

namespace telar::detail {

// (Stage 3's gather policy means nothing here.)
template <ZeRO3Gather G, class T, class MemorySpace, class Algorithm>
class GradientSync<ZeRO<2, G>, T, MemorySpace, Algorithm>
    : public GroupGradientSync<T, MemorySpace> {
  using Base = GroupGradientSync<T, MemorySpace>;

public:
  using typename Base::Store;
  using typename Base::Vec;
  static constexpr bool resident = true; // store.values() holds every local parameter

  GradientSync() = default;
  explicit GradientSync(SyncContext const& ctx) : Base(ctx) {}

  // Equal shards: the store's length is rounded up to a multiple of dp; no
  // flat gradient buffer. With one data-parallel rank there is nothing to
  // shard: as NoSharding.
  template <class Model>
  void bind(Model& model, std::vector<bool> const& owned, Store& store) {
    if (!this->ctx_.data_parallel())
      return this->bind_unsharded(model, owned, store);
    store.bind(
        model, owned,
        [](std::size_t n) {
          return std::make_pair(Vec("telar::ParameterStore::values", n), Vec());
        },
        true, std::size_t(this->ctx_.dp->size()) * store.alignment);
    this->shard_gradients(model, store);
  }

  Vec values(Store const& store) const {
    return this->active_ ? Vec(store.values().data() + this->lo_, this->chunk_) : store.values();
  }
  template <class Exec>
  void publish(Exec const& exec, Store const& store) {
    if (this->active_)
      allgather_shards(exec, *this->ctx_.dp, store.values(), this->chunk_);
  }
};

} // namespace telar::detail
