#pragma once
// Which telar::MemoryCategory an allocation label belongs to. Labels decide
// first; an unknown label takes the category of the scope it was made in.
#include <cstring>
#include <string>

namespace telar {
enum class MemoryCategory : int;
} // namespace telar

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
template <class Category>
Category memory_category_of(std::string const& label, Category fallback) {
  // Host mirrors of device views are message staging (HostBuffer).
  if (label_ends(label, "_mirror"))
    return Category(4);
  static char const* const exact[][2] = {{"telar::ParameterStore::values", "0"},
                                         {"telar::ZeRO::param_shard", "0"},
                                         {"telar::ParameterStore::grads", "1"},
                                         {"telar::ZeRO::shard_grads", "1"},
                                         {"telar::ZeRO::group_grads", "1"},
                                         {"telar::activation", "3"},
                                         {"telar::activation_grad", "3"},
                                         {"telar::stage_input", "3"},
                                         {"telar::ZeRO::gathered", "4"},
                                         {"telar::ZeRO::shard_values", "4"},
                                         {"telar::scratch", "5"}};
  for (auto const& e : exact)
    if (label == e[0])
      return Category(e[1][0] - '0');
  if (label_starts(label, "telar::Optimizer::"))
    return Category(2);
  if (label_starts(label, "telar::Recompute::"))
    return Category(3);
  // Buffers layers keep for one call only (convolution columns, loss scratch).
  if (label_ends(label, "::workspace") || label_ends(label, "::scratch"))
    return Category(5);
  return fallback;
}

} // namespace telar::detail
