// What telar/profile/detail/launches.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/profile/detail/launches.hpp>

namespace telar::detail {

TELAR_DECL void count_library_call(char const* name) {
  auto& s = launch_state();
  if (!s.active.load(std::memory_order_relaxed))
    return;
  ++s.library_calls;
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.names[name];
}

} // namespace telar::detail
