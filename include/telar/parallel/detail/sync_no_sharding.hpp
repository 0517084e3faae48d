#pragma once
// Gradient sync without sharding: every data-parallel rank keeps all
// gradients and optimizer state; gradients are allreduced in buckets that
// start as soon as backward has produced them (see gradient_buckets.hpp).
#include <telar/core/parameters.hpp>
#include <telar/parallel/detail/gradient_buckets.hpp>
#include <telar/parallel/detail/gradient_sync_decl.hpp>
#include <telar/parallel/strategy.hpp>

#include <utility>
#include <vector>

namespace telar::detail {

template <class T, class MemorySpace, class Algorithm>
class GradientSync<NoSharding, T, MemorySpace, Algorithm> {
public:
  using Store = ParameterStore<T, MemorySpace>;

  explicit GradientSync(SyncContext const& ctx = {}) : ctx_(ctx) {}

  template <class Model>
  void bind(Model& model, std::vector<bool> const& owned, Store& store) {
    store.bind(model, owned);
    size_ = store.size();
    if (ctx_.data_parallel())
      buckets_ = Buckets(ctx_.dp, Algorithm{}, store, ctx_.bucket_bytes, ctx_.trace);
  }

  std::pair<std::size_t, std::size_t> shard() const { return {0, size_}; }
  std::size_t bucket_count() const { return buckets_.bucket_count(); }

  void begin_step(int calls) { buckets_.begin_step(calls); }
  void before_backward(std::size_t) {}
  template <class Exec>
  void gradient_ready(Exec const& exec, std::size_t layer) {
    buckets_.layer_done(exec, layer);
  }
  void poll() { buckets_.poll(); }
  template <class Exec>
  void end_backward(Exec const& exec) {
    buckets_.finish(exec);
  }

  template <class Exec>
  void reduce(Exec const&, Store const&) {} // the buckets did it
  auto values(Store const& store) const { return store.values(); }
  auto grads(Store const& store) const { return store.grads(); }
  // Every data-parallel replica holds the same norms: sum over one replica.
  void sum_norms(double* v, std::size_t n) const { ctx_.sum_model_parallel(v, n); }
  template <class Exec>
  void publish(Exec const&, Store const&) {} // every rank updated everything

private:
  using Buckets = GradientBuckets<T, MemorySpace, Algorithm>;
  SyncContext ctx_;
  Buckets buckets_;
  std::size_t size_ = 0;
};

} // namespace telar::detail
