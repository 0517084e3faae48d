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
#include <telar/parallel/detail/group_gradients.hpp>
#include <telar/parallel/detail/zero_sharding.hpp>
#include <telar/parallel/strategy.hpp>

#include <utility>
#include <vector>

namespace telar::detail {

// (Stage 3's gather policy means nothing here.)
template <ZeRO3Gather G, class T, class MemorySpace, class Algorithm>
class GradientSync<ZeRO<2, G>, T, MemorySpace, Algorithm> {
public:
  using Store = ParameterStore<T, MemorySpace>;
  using Vec = Vector<T, MemorySpace>;
  static constexpr bool resident = true; // store.values() holds every local parameter

  GradientSync() = default;
  explicit GradientSync(SyncContext const& ctx) : ctx_(ctx) {}

  // Equal shards: the store's length is rounded up to a multiple of dp; no
  // flat gradient buffer. With one data-parallel rank there is nothing to
  // shard: as NoSharding.
  template <class Model>
  void bind(Model& model, std::vector<bool> const& owned, Store& store) {
    if (!active()) {
      store.bind(model, owned);
      size_ = chunk_ = store.size();
      return;
    }
    std::size_t const p = std::size_t(ctx_.dp->size());
    store.bind(
        model, owned,
        [](std::size_t n) {
          return std::make_pair(Vec("telar::ParameterStore::values", n), Vec());
        },
        true, p * store.alignment);
    size_ = store.size();
    chunk_ = size_ / p;
    lo_ = std::size_t(ctx_.dp->rank()) * chunk_;
    grads_ = GroupGradients<T, MemorySpace>(
        ctx_, store, [&model, &store](std::size_t b, std::size_t e, Vec const& buf) {
          store.rebind(model, b, e, buf, Store::Part::grads);
        });
  }

  std::pair<std::size_t, std::size_t> shard() const { return {lo_, lo_ + chunk_}; }
  std::size_t bucket_count() const { return active() ? grads_.group_count() : 0; }

  void begin_step(int calls) {
    if (active())
      grads_.begin_step(calls);
  }
  void before_backward(std::size_t layer) {
    if (active())
      grads_.before_backward(layer);
  }
  template <class Exec>
  void gradient_ready(Exec const& exec, std::size_t layer) {
    if (active())
      grads_.gradient_ready(exec, layer);
  }
  void poll() {
    if (active())
      grads_.poll();
  }
  template <class Exec>
  void end_backward(Exec const& exec) {
    if (active())
      grads_.end_backward(exec);
  }

  template <class Exec>
  void reduce(Exec const&, Store const&) {} // the groups did it
  Vec values(Store const& store) const {
    return active() ? Vec(store.values().data() + lo_, chunk_) : store.values();
  }
  Vec grads(Store const& store) const { return active() ? grads_.shard() : store.grads(); }
  // Shards are distinct on every rank of the world: norms sum over all.
  void sum_norms(double* v, std::size_t n) const {
    if (active())
      ctx_.world->allreduce(v, n);
    else
      ctx_.sum_model_parallel(v, n);
  }
  template <class Exec>
  void publish(Exec const& exec, Store const& store) {
    if (active())
      allgather_shards(exec, *ctx_.dp, store.values(), chunk_);
  }

private:
  bool active() const { return ctx_.data_parallel(); }

  SyncContext ctx_;
  std::size_t size_ = 0, chunk_ = 0, lo_ = 0;
  GroupGradients<T, MemorySpace> grads_;
};

} // namespace telar::detail
