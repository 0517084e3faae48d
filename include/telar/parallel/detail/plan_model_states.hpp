#pragma once
// Model states (parameters, gradients, optimizer state, and what sharding
// gathers) per ZeRO stage, as the gradient-sync components allocate them.
// The ONE place that knows these formulas: when a sync component changes
// what it allocates, change the matching branch here (memory_plan.hpp and
// the budget search use nothing else).
#include <telar/profile/memory.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace telar::detail {

// Whether ZeRO-3 under bf16 compute gathers values of T in MemorySpace as
// bf16 words: float values the host reaches (the rounding and the words'
// buffers are the host's); in device memory the gathers stay fp32.
template <class T, class MemorySpace>
inline constexpr bool
    bf16_gathers_v = (std::is_same_v<T, float> &&
                      Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible);

struct ModelStateInput {
  std::size_t elements = 0;  // the rank's parameter store, tensors padded to `alignment`
  std::size_t alignment = 1; // ParameterStore::alignment
  std::size_t value_bytes = 4;
  int dp = 1;
  int stage = 0;                   // ZeRO stage (0: NoSharding)
  bool shared = false;             // ZeRO<1> shared windows (one node, or per node)
  int node_dp = 0;                 // shared per node: dp ranks on each node (0: all on one)
  bool node_leader = true;         // shared mode: the node rank that holds the parameter window
  std::size_t state_size = 0;      // optimizer state values per parameter
  bool layerwise = false;          // the optimizer keeps a direction buffer (LAMB)
  std::vector<std::size_t> groups; // ZeRO<2, 3>: bucket groups' elements, backward order
  int microbatches = 1;            // > 1: every group's gradient lives for the whole step
  bool gather_per_step = false;    // ZeRO<3, PerStep>: every group stays gathered
  bool gather_words = false;       // ... as bf16 words where that saves (bf16 compute)
  bool bf16_copy = false;          // the store's values rounded to bf16 (bf16_weights.hpp)
};

// Peak elements of the group buffers: a group and the one before it (whose
// reduction or gather is still in flight), or all of them.
inline std::size_t plan_group_peak(std::vector<std::size_t> const& groups, bool all) {
  std::size_t sum = 0, pair = 0;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    sum += groups[i];
    pair = std::max(pair, groups[i] + (i > 0 ? groups[i - 1] : 0));
  }
  return all ? sum : pair;
}

// Whether PerStep gathers under bf16 compute keep the groups as 2-byte
// words and widen one at a time to 4 (residency_gathered.hpp): where that
// holds less than every group at 4, i.e. no group is half the model or more.
inline bool gather_words_save(std::vector<std::size_t> const& groups) {
  std::size_t const sum = plan_group_peak(groups, true);
  std::size_t const widest = groups.empty() ? 0 : *std::max_element(groups.begin(), groups.end());
  return 2 * widest < sum;
}

// ZeRO-3's gathered groups at their peak: the group in use and the one
// prefetched, or every group (PerStep); or every group as words and the
// widest widened.
inline std::size_t plan_gathered(ModelStateInput const& in) {
  if (!in.gather_words || !gather_words_save(in.groups))
    return plan_group_peak(in.groups, in.gather_per_step) * in.value_bytes;
  std::size_t const widest = *std::max_element(in.groups.begin(), in.groups.end());
  return plan_group_peak(in.groups, true) * sizeof(std::uint16_t) + widest * in.value_bytes;
}

// How a flat store of `elements` (padded tensors) is split over `dp` ranks
// at ZeRO `stage`: the store padded to a multiple of dp * alignment, each
// rank's shard a dp-th of it.
struct FlatShard {
  bool sharded = false;   // each rank keeps a shard (else the whole store)
  std::size_t padded = 0; // the store with the sharding's padding
  std::size_t shard = 0;  // elements per rank (padded when not sharded)
};

inline FlatShard flat_shard(std::size_t elements, std::size_t alignment, int dp, int stage) {
  FlatShard f;
  // ZeRO-1/2 over one rank are the plain store; ZeRO-3 keeps its gathers
  // (its shard is everything, the gathers are copies).
  f.sharded = stage == 3 || (stage > 0 && dp > 1);
  std::size_t const multiple = f.sharded ? std::size_t(dp) * alignment : 1;
  f.padded = (elements + multiple - 1) / multiple * multiple;
  f.shard = f.sharded ? f.padded / std::size_t(dp) : f.padded;
  return f;
}

// What the ZeRO stage keeps where, as the sync components allocate it.
inline MemoryBytes plan_sharded_states(ModelStateInput const& in) {
  MemoryBytes out;
  auto bytes = [&](std::size_t elements) { return elements * in.value_bytes; };
  FlatShard const f = flat_shard(in.elements, in.alignment, in.dp, in.stage);
  bool const sharded = f.sharded;
  std::size_t const psi = f.padded, shard = f.shard;
  out[MemoryCategory::optimizer_state] = bytes(shard * in.state_size + (in.layerwise ? shard : 0));
  if (!sharded) { // NoSharding, or ZeRO over one rank: the plain store
    out[MemoryCategory::parameters] = bytes(psi);
    out[MemoryCategory::gradients] = bytes(psi);
    return out;
  }
  // Group gradient buffers (group_gradients.hpp) and gathered groups
  // (residency_gathered.hpp) are temporary buffers of the collectives:
  // communication, as the ZeRO paper counts them apart from model states.
  std::size_t const group_grads = plan_group_peak(in.groups, in.microbatches > 1);
  switch (in.stage) {
  case 1:
    out[MemoryCategory::gradients] = bytes(psi);
    if (in.shared) { // one parameter window per node, a gradient window per rank
      out[MemoryCategory::parameters] = in.node_leader ? bytes(psi) : 0;
      // Per node: the cross group's chunks, one per node (zero_sharding.hpp).
      if (in.node_dp > 0)
        out[MemoryCategory::communication] = bytes(shard * std::size_t(in.dp / in.node_dp));
      return out;
    }
    out[MemoryCategory::parameters] = bytes(psi);
    out[MemoryCategory::communication] = bytes(shard); // the all-gather's shard copy
    return out;
  case 2: // full parameters; the gradient shard; group buffers, then the shard copy
    out[MemoryCategory::parameters] = bytes(psi);
    out[MemoryCategory::gradients] = bytes(shard);
    out[MemoryCategory::communication] = bytes(std::max(group_grads, shard));
    return out;
  default: // 3: parameter and gradient shards; gathered groups and group gradients
    out[MemoryCategory::parameters] = bytes(shard);
    out[MemoryCategory::gradients] = bytes(shard);
    out[MemoryCategory::communication] = plan_gathered(in) + bytes(group_grads);
    return out;
  }
}

// The above, and the bf16 copy of the values (parallel/detail/bf16_weights.hpp).
inline MemoryBytes plan_model_states(ModelStateInput const& in) {
  MemoryBytes out = plan_sharded_states(in);
  if (in.bf16_copy) // 2 bytes per value of the store (never under ZeRO-3)
    out[MemoryCategory::parameters] +=
        flat_shard(in.elements, in.alignment, in.dp, in.stage).padded * sizeof(std::uint16_t);
  return out;
}

} // namespace telar::detail
