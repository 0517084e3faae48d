#pragma once
// Model states (parameters, gradients, optimizer state, and what sharding
// gathers) per ZeRO stage, as the gradient-sync components allocate them.
// The ONE place that knows these formulas: when a sync component changes
// what it allocates, change the matching branch here (memory_plan.hpp and
// the budget search use nothing else).
#include <telar/profile/memory.hpp>

#include <cstddef>

namespace telar::detail {

struct ModelStateInput {
  std::size_t elements = 0;  // the rank's parameter store, tensors padded to `alignment`
  std::size_t alignment = 1; // ParameterStore::alignment
  std::size_t value_bytes = 4;
  int dp = 1;
  int stage = 0;                  // ZeRO stage (0: NoSharding)
  bool shared = false;            // ZeRO<1> shared-memory mode (every dp rank on one node)
  bool node_leader = true;        // shared mode: the node rank that holds the parameter window
  std::size_t state_size = 0;     // optimizer state values per parameter
  bool layerwise = false;         // the optimizer keeps a direction buffer (LAMB)
  std::size_t group_elements = 0; // ZeRO<3>: the two largest adjacent bucket groups
};

inline MemoryBytes plan_model_states(ModelStateInput const& in) {
  MemoryBytes out;
  auto bytes = [&](std::size_t elements) { return elements * in.value_bytes; };
  bool const sharded = in.stage > 0 && in.dp > 1;
  std::size_t const multiple = sharded ? std::size_t(in.dp) * in.alignment : 1;
  std::size_t const psi = (in.elements + multiple - 1) / multiple * multiple;
  std::size_t const shard = sharded ? psi / std::size_t(in.dp) : psi;
  out[MemoryCategory::optimizer_state] = bytes(shard * in.state_size + (in.layerwise ? shard : 0));
  if (!sharded) { // NoSharding, or ZeRO over one rank: the plain store
    out[MemoryCategory::parameters] = bytes(psi);
    out[MemoryCategory::gradients] = bytes(psi);
    return out;
  }
  switch (in.stage) {
  case 1:
    if (in.shared) { // one parameter window per node, a gradient window per rank
      out[MemoryCategory::parameters] = in.node_leader ? bytes(psi) : 0;
      out[MemoryCategory::gradients] = bytes(psi);
      return out;
    }
    [[fallthrough]];
  case 2: // today's ZeRO-2 keeps the full gradient buffer too (sync_zero2.hpp)
    out[MemoryCategory::parameters] = bytes(psi);
    out[MemoryCategory::gradients] = bytes(psi + shard);
    out[MemoryCategory::communication] = bytes(shard); // the all-gather's shard copy
    return out;
  default: // 3: parameter and gradient shards; gathered bucket groups in flight
    out[MemoryCategory::parameters] = bytes(shard);
    out[MemoryCategory::gradients] = bytes(shard + in.group_elements);
    out[MemoryCategory::communication] = bytes(in.group_elements);
    return out;
  }
}

} // namespace telar::detail
