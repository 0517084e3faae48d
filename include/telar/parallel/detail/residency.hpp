#pragma once
// The parameter-residency component of a sharding policy: resident for
// NoSharding, ZeRO-1 and ZeRO-2 (residency_resident.hpp), gathered on demand
// for ZeRO-3 (residency_gathered.hpp).
#include <telar/parallel/detail/residency_gathered.hpp>
#include <telar/parallel/detail/residency_resident.hpp>
#include <telar/parallel/strategy.hpp>

namespace telar::detail {

template <class Sharding, class T, class MemorySpace>
struct residency_of {
  using type = ResidentParameters<T, MemorySpace>;
  static type make(SyncContext const& ctx) { return type(ctx); }
};
template <ZeRO3Gather G, class T, class MemorySpace>
struct residency_of<ZeRO<3, G>, T, MemorySpace> {
  using type = GatheredParameters<T, MemorySpace>;
  static type make(SyncContext const& ctx) { return type(ctx, G); }
};

} // namespace telar::detail
