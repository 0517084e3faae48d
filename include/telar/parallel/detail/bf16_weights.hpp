#pragma once
// The parameters rounded to bf16 once per step (Precision<bf16, float>).
//
// Without it, a bf16 matmul converts its fp32 weight operand on every call:
// a Dense layer's weight once in forward and once in backward, for every
// micro-batch (2048x2048: about 2.4 ms each on this project's machine, the
// largest cost after the products themselves). With it, the Trainer keeps
// one bf16 buffer the size of its parameter store,
// "telar::ParameterStore::bf16_copy" (2 bytes per parameter, counted with
// the parameters by the plan and the meter), and registers it for the
// length of a step or an evaluation (detail::Bf16CopyScope). A matmul whose
// B operand lies in the store rounds it into the buffer the first time in
// that step and reads the words after (core/detail/bf16_copy.hpp). The
// rounding is the matmul's own (the same oneDNN reorder), so results are
// bit for bit those without the copy; nothing is carried from one step to
// the next, so changes made between steps (through Trainer::model(), a
// checkpoint's restore) are always seen. Parameters no matmul reads
// (convolution weights: oneDNN reorders them into a blocked layout of its
// own; biases) are never converted. Not under ZeRO-3 (the values live in
// gathered groups, not in the store) or on devices.
#include <telar/config.hpp>
#include <telar/core/detail/bf16_copy.hpp>
#include <telar/core/parameters.hpp>
#include <telar/parallel/layout_options.hpp>
#include <telar/parallel/precision.hpp>

#include <cstdint>
#include <type_traits>

namespace telar::detail {

// Whether a run of this strategy keeps the copy: bf16 compute on float
// values in host memory (where oneDNN runs), parameters in the store (not
// ZeRO-3), and the option on. The plan and the Trainer both ask this.
template <class StrategyT, class T, class MemorySpace>
bool keeps_bf16_copy(LayoutOptions const& options, int zero_stage) {
#if TELAR_HAVE_ONEDNN
  return strategy_precision_t<StrategyT>::bf16_compute && std::is_same_v<T, float> &&
         Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible &&
         zero_stage != 3 && options.bf16_weight_copy;
#else
  (void)options, (void)zero_stage;
  return false;
#endif
}

template <class T, class MemorySpace>
class Bf16Weights {
public:
  // Allocates the copy for `store` (when `keep`).
  void bind(ParameterStore<T, MemorySpace> const& store, bool keep) {
    if (keep)
      words_ = Kokkos::View<std::uint16_t*, MemorySpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::ParameterStore::bf16_copy"),
          store.size());
  }

  // Registers the copy's room for the store's values until the returned
  // scope ends (a scope that registers nothing without a copy).
  Bf16CopyScope use(ParameterStore<T, MemorySpace> const& store) {
    if constexpr (std::is_same_v<T, float>)
      if (words_.size() != 0)
        return Bf16CopyScope(store.values().data(), words_.size(), words_.data());
    (void)store;
    return Bf16CopyScope(nullptr, 0, nullptr);
  }

private:
  Kokkos::View<std::uint16_t*, MemorySpace> words_;
};

} // namespace telar::detail
