#pragma once
// Gradient sync for ZeRO stage 1: rank r of the data-parallel group owns the
// optimizer state of the flat range [r N/dp, (r+1) N/dp). After backward the
// gradients of each rank's shard are summed into it (straight out of the
// other ranks' memory on one node; on each node first, then across, when
// nodes hold several ranks; else by reduce-scatter), the rank updates its
// shard, and the parameters are all-gathered (see zero_sharding.hpp).
#include <telar/core/parameters.hpp>
#include <telar/parallel/detail/gradient_sync_decl.hpp>
#include <telar/parallel/detail/zero_sharding.hpp>
#include <telar/parallel/strategy.hpp>

#include <utility>
#include <vector>

namespace telar::detail {

// (Stage 3's gather policy means nothing here.)
template <ZeRO3Gather G, class T, class MemorySpace, class Algorithm>
class GradientSync<ZeRO<1, G>, T, MemorySpace, Algorithm> {
public:
  using Store = ParameterStore<T, MemorySpace>;

  explicit GradientSync(SyncContext const& ctx = {}) : ctx_(ctx) {}

  // With one data-parallel rank there is nothing to shard: as NoSharding.
  template <class Model>
  void bind(Model& model, std::vector<bool> const& owned, Store& store) {
    if (ctx_.data_parallel()) {
      zero_ = ZeroOneSharding<T, MemorySpace>(ctx_.dp, ctx_.shared_memory, ctx_.bf16_gradients);
      store.bind(model, owned, zero_.allocator(), zero_.copy_values(),
                 std::size_t(ctx_.dp->size()) * store.alignment);
      zero_.bound(store);
    } else {
      store.bind(model, owned);
    }
    size_ = store.size();
  }

  std::pair<std::size_t, std::size_t> shard() const {
    return zero_.active() ? std::make_pair(zero_.begin(), zero_.end())
                          : std::make_pair(std::size_t(0), size_);
  }
  std::size_t bucket_count() const { return 0; }

  // Nothing overlaps backward: the shard is reduced once it is complete.
  void begin_step(int) {}
  void before_backward(std::size_t) {}
  template <class Exec>
  void gradient_ready(Exec const&, std::size_t) {}
  void poll() {}
  template <class Exec>
  void end_backward(Exec const&) {}

  template <class Exec>
  void reduce(Exec const& exec, Store const& store) {
    if (!zero_.active())
      return;
    double const t0 = ctx_.trace ? ctx_.trace->now() : 0;
    zero_.reduce(exec, store);
    if (ctx_.trace)
      ctx_.trace->add("reduce shard" + zero_.where(), "comm", t0, ctx_.trace->now(), 1);
  }
  auto values(Store const& store) const {
    return zero_.active() ? zero_.values_shard(store) : store.values();
  }
  auto grads(Store const& store) const {
    return zero_.active() ? zero_.grads_shard(store) : store.grads();
  }
  // Shards are distinct on every rank of the world: norms sum over all.
  void sum_norms(double* v, std::size_t n) const {
    if (zero_.active())
      ctx_.world->allreduce(v, n);
    else
      ctx_.sum_model_parallel(v, n);
  }
  template <class Exec>
  void publish(Exec const& exec, Store const& store) {
    if (!zero_.active())
      return;
    double const t0 = ctx_.trace ? ctx_.trace->now() : 0;
    zero_.publish(exec, store); // shared memory: waits for every peer's shard
    if (ctx_.trace)
      ctx_.trace->add("publish shards" + zero_.where(), "comm", t0, ctx_.trace->now(), 1);
  }

private:
  SyncContext ctx_;
  ZeroOneSharding<T, MemorySpace> zero_;
  std::size_t size_ = 0;
};

} // namespace telar::detail
