#pragma once
// What ZeRO-2 and ZeRO-3 share as gradient syncs: the gradients live in
// group buffers reduce-scattered into this rank's shard while backward runs
// (group_gradients.hpp). The stages differ only in where the values live
// (bind), what the optimizer updates (values) and what follows the update
// (publish): see sync_zero2.hpp and sync_zero3.hpp.
#include <telar/core/parameters.hpp>
#include <telar/parallel/detail/gradient_sync_decl.hpp>
#include <telar/parallel/detail/group_gradients.hpp>

#include <utility>
#include <vector>

namespace telar::detail {

template <class T, class MemorySpace>
class GroupGradientSync {
public:
  using Store = ParameterStore<T, MemorySpace>;
  using Vec = Vector<T, MemorySpace>;

  GroupGradientSync() = default;
  explicit GroupGradientSync(SyncContext const& ctx) : ctx_(ctx) {}

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

protected:
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
