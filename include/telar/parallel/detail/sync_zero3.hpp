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
#include <telar/parallel/detail/group_gradients.hpp>
#include <telar/parallel/detail/residency_gathered.hpp>
#include <telar/parallel/strategy.hpp>

#include <utility>
#include <vector>

namespace telar::detail {

template <ZeRO3Gather G, class T, class MemorySpace, class Algorithm>
class GradientSync<ZeRO<3, G>, T, MemorySpace, Algorithm> {
public:
  using Store = ParameterStore<T, MemorySpace>;
  using Vec = Vector<T, MemorySpace>;

  GradientSync() = default;
  explicit GradientSync(SyncContext const& ctx) : ctx_(ctx) {}

  // The residency has laid `store` out (when there is MPI).
  template <class Model>
  void bind(Model& model, std::vector<bool> const& owned, Store& store) {
    if (!active()) {
      store.bind(model, owned);
      size_ = chunk_ = store.size();
      return;
    }
    size_ = store.size();
    chunk_ = size_ / std::size_t(ctx_.dp->size());
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
  // Without MPI only (else the residency's shard is what the optimizer updates).
  Vec values(Store const& store) const { return store.values(); }
  Vec grads(Store const& store) const { return active() ? grads_.shard() : store.grads(); }
  // Shards are distinct on every rank of the world: norms sum over all.
  void sum_norms(double* v, std::size_t n) const {
    if (active())
      ctx_.world->allreduce(v, n);
    else
      ctx_.sum_model_parallel(v, n);
  }
  template <class Exec>
  void publish(Exec const&, Store const&) {} // the next gathers read the shards

private:
  bool active() const { return ctx_.dp != nullptr; }

  SyncContext ctx_;
  std::size_t size_ = 0, chunk_ = 0, lo_ = 0;
  GroupGradients<T, MemorySpace> grads_;
};

} // namespace telar::detail
