#pragma once
// Parameter residency, resident: every rank keeps the full values of its
// layers for the whole run (NoSharding, ZeRO-1, ZeRO-2); the gradient-sync
// component binds them into the ParameterStore. Every hook is a no-op.
//
// A residency component offers (see residency_gathered.hpp for the other):
//   bind(model, owned, store, init)  draw the layers (init(k) draws layer k)
//                                    and, if it shards them, lay out the store
//   sharded()                        the values live in shard() only
//   optimizer_values(sync, store)    what the optimizer updates
//   full_values(exec, store)         every value of this rank's layers, flat
//                                    (ZeRO-3: all-gathered, collective)
//   sq_norms(tensors, engine, exec, store, sync, model_sum)
//                                    per-tensor squared norms, the same on
//                                    every rank, from where the values live
//   begin_step(calls), before_forward(layer), before_backward(layer),
//   progress(), end_step()           the step hooks (step_hooks.hpp)
#include <telar/core/parameters.hpp>
#include <telar/parallel/detail/gradient_sync_decl.hpp>

#include <cstddef>
#include <vector>

namespace telar::detail {

template <class T, class MemorySpace>
class ResidentParameters {
public:
  using Store = ParameterStore<T, MemorySpace>;
  using Vec = Vector<T, MemorySpace>;

  ResidentParameters() = default;
  explicit ResidentParameters(SyncContext const&) {}

  template <class Model, class Init>
  void bind(Model&, std::vector<bool> const& owned, Store&, Init&& init) {
    for (std::size_t k = 0; k < owned.size(); ++k)
      if (owned[k])
        init(k);
  }
  bool sharded() const { return false; }
  Vec shard() const { return Vec(); }

  // The sync's range of the store.
  template <class Sync>
  Vec optimizer_values(Sync const& sync, Store const& store) const {
    return sync.values(store);
  }
  template <class Exec>
  Vec full_values(Exec const&, Store const& store) const {
    return store.values();
  }
  // The store's values, summed over the ranks of one replica (`model_sum`).
  template <class Tensors, class Engine, class Exec, class Sync, class Sum>
  std::vector<double> sq_norms(Tensors const& tensors, Engine const& engine, Exec const& exec,
                               Store const& store, Sync const&, Sum&& model_sum) const {
    return tensors.sq_norms(engine, exec, store.values(), tensors.local(), model_sum);
  }

  void begin_step(int) {}
  void before_forward(std::size_t) {}
  void before_backward(std::size_t) {}
  void progress() {}
  void end_step() {}
};

} // namespace telar::detail
