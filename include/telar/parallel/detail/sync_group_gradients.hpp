#pragma once
// Gradient sync for ZeRO stages 2 and 3: rank r of the data-parallel group
// owns the flat range [r N/dp, (r+1) N/dp) of the gradients. They are
// reduce-scattered group by group (the buckets of bucket_plan.hpp) as
// backward completes them: each group is one MPI_Ireduce_scatter whose block
// for rank r is the part of the group inside r's shard, received straight
// into r's shard-sized gradient buffer. So reduction overlaps backward as
// with NoSharding. No rank holds the full flat gradient: the layers
// accumulate into the buffers of the groups in progress only
// (group_gradients.hpp), and a group is reduced once, after its last
// micro-batch.
//
// The stages differ in where the values live:
// - ZeRO-2: resident, as in ZeRO<1>; the optimizer updates the shard and the
//   updated shards are then all-gathered. With one data-parallel rank there
//   is nothing to shard: as NoSharding.
// - ZeRO-3: the residency component (residency_gathered.hpp) laid the store
//   out and holds the value shard the optimizer updates; nothing is
//   published after the update, the next step's gathers read the shards.
//   The shards exist with one data-parallel rank too (the gathers are then
//   copies), so np 1 runs the same code; only a trainer without MPI binds
//   the store as NoSharding does.
#include <telar/core/parameters.hpp>
#include <telar/parallel/detail/gradient_sync_decl.hpp>
#include <telar/parallel/detail/group_gradients.hpp>
#include <telar/parallel/detail/zero_sharding.hpp>
#include <telar/parallel/strategy.hpp>

#include <utility>
#include <vector>

namespace telar::detail {

// (Stage 3's gather policy means nothing here: it is the residency's.)
template <int Stage, ZeRO3Gather G, class T, class MemorySpace, class Algorithm>
class GradientSync<ZeRO<Stage, G>, T, MemorySpace, Algorithm> {
  static_assert(Stage == 2 || Stage == 3); // ZeRO<1> has its own (sync_zero1.hpp)

public:
  using Store = ParameterStore<T, MemorySpace>;
  using Vec = Vector<T, MemorySpace>;

  explicit GradientSync(SyncContext const& ctx = {}) : ctx_(ctx) {}

  template <class Model>
  void bind(Model& model, std::vector<bool> const& owned, Store& store) {
    if constexpr (Stage == 2) {
      if (!ctx_.data_parallel())
        return bind_unsharded(model, owned, store);
      // Equal shards: the store's length rounded up to a multiple of dp; no
      // flat gradient buffer.
      store.bind(
          model, owned,
          [](std::size_t n) {
            return std::make_pair(Vec("telar::ParameterStore::values", n), Vec());
          },
          true, std::size_t(ctx_.dp->size()) * store.alignment);
    } else if (ctx_.dp == nullptr) {
      return bind_unsharded(model, owned, store);
    } // else the residency has laid `store` out
    shard_gradients(model, store);
  }

  // ZeRO-3: without MPI only (else the residency's shard is what the
  // optimizer updates).
  Vec values(Store const& store) const {
    if constexpr (Stage == 2)
      return active_ ? Vec(store.values().data() + lo_, chunk_) : store.values();
    else
      return store.values();
  }
  // ZeRO-3: nothing (the next gathers read the shards).
  template <class Exec>
  void publish(Exec const& exec, Store const& store) {
    if (Stage == 2 && active_)
      allgather_shards(exec, *ctx_.dp, store.values(), chunk_);
  }

  std::pair<std::size_t, std::size_t> shard() const { return {lo_, lo_ + chunk_}; }
  std::size_t bucket_count() const { return active_ ? grads_.group_count() : 0; }

  void begin_step(int calls) {
    if (active_)
      grads_.begin_step(calls);
  }
  void before_backward(std::size_t layer) {
    if (active_)
      grads_.before_backward(layer);
  }
  template <class Exec>
  void gradient_ready(Exec const& exec, std::size_t layer) {
    if (active_)
      grads_.gradient_ready(exec, layer);
  }
  void poll() {
    if (active_)
      grads_.poll();
  }
  template <class Exec>
  void end_backward(Exec const& exec) {
    if (active_)
      grads_.end_backward(exec);
  }

  template <class Exec>
  void reduce(Exec const&, Store const&) {} // the groups did it
  Vec grads(Store const& store) const { return active_ ? grads_.shard() : store.grads(); }
  // Shards are distinct on every rank of the world: norms sum over all.
  void sum_norms(double* v, std::size_t n) const {
    if (active_)
      ctx_.world->allreduce(v, n);
    else
      ctx_.sum_model_parallel(v, n);
  }

private:
  // Nothing to shard: the plain store, as NoSharding.
  template <class Model>
  void bind_unsharded(Model& model, std::vector<bool> const& owned, Store& store) {
    store.bind(model, owned);
    size_ = chunk_ = store.size();
  }
  // `store` is laid out in equal shards (its length a multiple of dp): this
  // rank's shard, and the layers' gradient views follow the group buffers.
  template <class Model>
  void shard_gradients(Model& model, Store& store) {
    active_ = true;
    size_ = store.size();
    chunk_ = size_ / std::size_t(ctx_.dp->size());
    lo_ = std::size_t(ctx_.dp->rank()) * chunk_;
    grads_ = GroupGradients<T, MemorySpace>(
        ctx_, store, [&model, &store](std::size_t b, std::size_t e, Vec const& buf) {
          store.rebind(model, b, e, buf, Store::Part::grads);
        });
  }

  bool active_ = false;
  SyncContext ctx_;
  std::size_t size_ = 0, chunk_ = 0, lo_ = 0;
  GroupGradients<T, MemorySpace> grads_;
};

} // namespace telar::detail
