#pragma once
// Parameter residency, resident: every rank keeps the full values of its
// layers for the whole run (NoSharding, ZeRO-1, ZeRO-2); the gradient-sync
// component binds them into the ParameterStore. Every hook is a no-op.
//
// A residency component offers (see residency_gathered.hpp for the other):
//   bind(model, owned, store, init)  draw the layers (init(k) draws layer k)
//                                    and, if it shards them, lay out the store
//   sharded()                        the values live in shard() only
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

  void begin_step(int) {}
  void before_forward(std::size_t) {}
  void before_backward(std::size_t) {}
  void progress() {}
  void end_step() {}
};

} // namespace telar::detail
