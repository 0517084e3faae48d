#pragma once
// The process's launch counts behind telar::LaunchCounter, and the hook the
// GEMM and convolution policies call before each library call (oneDNN,
// Kokkos Kernels): Kokkos Tools never sees those, a device still launches them.
#include <Kokkos_Core.hpp>
#include <telar/core/detail/decl.hpp>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace telar::detail {

struct LaunchState {
  std::mutex mutex;
  int counters = 0; // live LaunchCounters
  std::atomic<bool> active{false};
  std::atomic<std::uint64_t> kernels{0}, library_calls{0};
  std::map<std::string, std::uint64_t> names;
  std::map<std::uint32_t, std::uint64_t> device_types; // kernels by device_type_of(devID)
  Kokkos::Tools::Experimental::EventSet previous{};
};

// The execution space type of a Kokkos Tools devID: its top 8 bits, a
// Kokkos::Tools::Experimental::DeviceType (Kokkos 3 and 4 alike).
inline std::uint32_t device_type_of(std::uint32_t dev) {
  return dev >> 24;
}
template <class Exec>
std::uint32_t device_type_v() {
  return static_cast<std::uint32_t>(Kokkos::Tools::Experimental::DeviceTypeTraits<Exec>::id);
}

inline LaunchState& launch_state() {
  static LaunchState s;
  return s;
}

// One library call by policy `name` (e.g. "telar::gemm::onednn"); a relaxed
// load and nothing else while no LaunchCounter lives.
TELAR_DECL void count_library_call(char const* name);

} // namespace telar::detail

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/profile/detail/launches.ipp>
#endif
