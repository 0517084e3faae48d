#pragma once
// Gradient sync for ZeRO stage 3: the gradients as in ZeRO-2 (group buffers
// reduce-scattered into this rank's shard while backward runs, never a full
// flat gradient), but the parameters are sharded too: the residency
// component (residency_gathered.hpp) laid the store out and holds the value
// shard the optimizer updates; nothing is published after the update, the
// next step's gathers read the shards.
//
// Unlike ZeRO-2 the shards exist with one data-parallel rank too (the
// gathers are then copies), so np 1 runs the same code; only a trainer
// without MPI binds the store as NoSharding does.
#include <telar/core/parameters.hpp>
#include <telar/parallel/detail/gradient_sync_decl.hpp>
#include <telar/parallel/detail/residency_gathered.hpp>
#include <telar/parallel/detail/sync_group_gradients.hpp>
#include <telar/parallel/strategy.hpp>

#include <utility>
#include <vector>

namespace telar::detail {

template <ZeRO3Gather G, class T, class MemorySpace, class Algorithm>
class GradientSync<ZeRO<3, G>, T, MemorySpace, Algorithm>
    : public GroupGradientSync<T, MemorySpace> {
  using Base = GroupGradientSync<T, MemorySpace>;

public:
  using typename Base::Store;
  using typename Base::Vec;

  GradientSync() = default;
  explicit GradientSync(SyncContext const& ctx) : Base(ctx) {}

  // The residency has laid `store` out (when there is MPI).
  template <class Model>
  void bind(Model& model, std::vector<bool> const& owned, Store& store) {
    if (this->ctx_.dp == nullptr)
      return this->bind_unsharded(model, owned, store);
    this->shard_gradients(model, store);
  }

  // Without MPI only (else the residency's shard is what the optimizer updates).
  Vec values(Store const& store) const { return store.values(); }
  template <class Exec>
  void publish(Exec const&, Store const&) {} // the next gathers read the shards
};

} // namespace telar::detail
