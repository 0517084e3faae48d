#pragma once
// A Kokkos Tools region for the lifetime of the object, named
// "telar::Class::method" so Kokkos Tools users see Telar's phases.
#include <Kokkos_Core.hpp>

#include <string>

namespace telar::detail {

struct ScopedRegion {
  explicit ScopedRegion(std::string const& name) { Kokkos::Profiling::pushRegion(name); }
  ~ScopedRegion() { Kokkos::Profiling::popRegion(); }
  ScopedRegion(ScopedRegion const&) = delete;
  ScopedRegion& operator=(ScopedRegion const&) = delete;
};

} // namespace telar::detail
