#pragma once
// The one door from io/ into a telar::Trainer's internals (a friend of the
// Trainer): the optimizer's shard of the values and its state on the host,
// and setting them back with the step counts (then publishing the values to
// the ranks that hold copies, as after an optimizer step). These stay
// private because only a checkpoint's restore may set them, and the values
// the optimizer updates are a ZeRO-3 shard or a view into the store,
// depending on the residency; everything else io/ reads through the
// Trainer's public accessors (trainer_view.hpp).
#include <telar/train/trainer.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <vector>

namespace telar::detail {

// A flat view's values on the host (checkpoints, gather_model).
template <class V>
std::vector<typename V::non_const_value_type> host_copy(V const& v) {
  std::vector<typename V::non_const_value_type> out(v.size());
  if (v.size() == 0)
    return out;
  Kokkos::View<typename V::non_const_value_type*, Kokkos::HostSpace,
               Kokkos::MemoryTraits<Kokkos::Unmanaged>>
      h(out.data(), out.size());
  Kokkos::fence();
  Kokkos::deep_copy(h, Kokkos::View<typename V::const_value_type*, typename V::memory_space,
                                    Kokkos::MemoryTraits<Kokkos::Unmanaged>>(v.data(), v.size()));
  return out;
}

// Sets a flat view's values from the host (as many as it holds).
template <class T, class V>
void copy_from_host(std::vector<T> const& in, V const& v) {
  if (v.size() == 0)
    return;
  Kokkos::View<T const*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(in.data(),
                                                                                       v.size());
  Kokkos::deep_copy(
      Kokkos::View<T*, typename V::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(v.data(),
                                                                                          v.size()),
      h);
  Kokkos::fence();
}

struct TrainerAccess {
  // The shard's values (what the optimizer updates), on the host.
  template <class Tr>
  static std::vector<typename Tr::value_type> values(Tr const& t) {
    return host_copy(t.optimizer_values());
  }
  // The optimizer state, slot-major: slot k of element i at k * shard + i.
  template <class Tr>
  static std::vector<typename Tr::value_type> state(Tr const& t) {
    return host_copy(t.engine_.state());
  }

  // Sets the shard's values and optimizer state and the step counts; every
  // rank holding a copy of the values gets them (collective).
  template <class Tr>
  static void restore(Tr& t, std::vector<typename Tr::value_type> const& values,
                      std::vector<typename Tr::value_type> const& state, long long step,
                      long long skipped = 0) {
    copy_from_host(values, t.optimizer_values());
    copy_from_host(state, t.engine_.state());
    typename Tr::execution_space exec;
    t.sync_.publish(exec, t.params_);
    exec.fence();
    t.step_ = step;
    t.skipped_ = skipped;
  }
};

} // namespace telar::detail
