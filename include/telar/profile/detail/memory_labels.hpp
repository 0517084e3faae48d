#pragma once
// Which telar::MemoryCategory an allocation label belongs to. Labels decide
// first; an unknown label takes the category of the scope it was made in.
#include <telar/profile/memory_category.hpp>

#include <cstring>
#include <string>

namespace telar::detail {

inline bool is_telar_label(std::string const& label) {
  return label.rfind("telar::", 0) == 0;
}

inline bool label_starts(std::string const& label, char const* prefix) {
  return label.rfind(prefix, 0) == 0;
}
inline bool label_ends(std::string const& label, char const* suffix) {
  std::size_t const n = std::strlen(suffix);
  return label.size() >= n && label.compare(label.size() - n, n, suffix) == 0;
}

// Counted: what is allocated inside a scope (a Trainer's construction, step
// or evaluation), except the Kokkos runtime's own (reduction scratch:
// process-wide, allocated once). Data sets and loaders allocate outside.
inline bool counts_label(std::string const& label, bool in_scope) {
  return in_scope && !label_starts(label, "Kokkos::");
}

// `fallback`: the category of the innermost scope (workspace outside any).
inline MemoryCategory memory_category_of(std::string const& label, MemoryCategory fallback) {
  using C = MemoryCategory;
  // Host mirrors of device views are message staging (HostBuffer).
  if (label_ends(label, "_mirror"))
    return C::communication;
  struct Exact {
    char const* label;
    C category;
  };
  static Exact const exact[] = {{"telar::ParameterStore::values", C::parameters},
                                {"telar::ZeRO::param_shard", C::parameters},
                                {"telar::ParameterStore::bf16_copy", C::parameters},
                                {"telar::ParameterStore::grads", C::gradients},
                                {"telar::ZeRO::shard_grads", C::gradients},
                                {"telar::ZeRO::group_grads", C::communication},
                                {"telar::activation", C::activations},
                                {"telar::activation_grad", C::activations},
                                {"telar::stage_input", C::activations},
                                {"telar::ZeRO::gathered", C::communication},
                                {"telar::ZeRO::shard_values", C::communication},
                                {"telar::ZeRO::across_nodes", C::communication},
                                {"telar::scratch", C::workspace}};
  for (Exact const& e : exact)
    if (label == e.label)
      return e.category;
  if (label_starts(label, "telar::Optimizer::"))
    return C::optimizer_state;
  if (label_starts(label, "telar::Recompute::"))
    return C::activations;
  // Buffers layers keep for one call only (convolution columns, loss scratch).
  if (label_ends(label, "::workspace") || label_ends(label, "::scratch"))
    return C::workspace;
  return fallback;
}

} // namespace telar::detail
