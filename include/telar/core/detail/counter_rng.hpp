#pragma once
// Counter-based random numbers: value i of stream `seed` is a pure function
// of (seed, i). Parameter initialisation uses it so that any shard of a
// tensor (tensor parallelism, ZeRO) draws exactly the values the serial model
// has at the same global index, on any device, without generating the rest.
#include <Kokkos_Core.hpp>

#include <cstdint>

namespace telar::detail {

KOKKOS_INLINE_FUNCTION constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// A new stream seed derived from a seed and a salt (layer index, tensor id).
KOKKOS_INLINE_FUNCTION constexpr std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t salt) {
  return splitmix64(seed ^ splitmix64(salt + 0x632be59bd9b4e019ull));
}

/// Uniform in [lo, hi) from element `i` of stream `seed` (24 random bits,
/// exactly representable in float).
template <class T>
KOKKOS_INLINE_FUNCTION T uniform_at(std::uint64_t seed, std::uint64_t i, T lo, T hi) {
  std::uint64_t const r = splitmix64(seed ^ splitmix64(i));
  T const u = T(r >> 40) * T(1.0 / 16777216.0);
  return lo + (hi - lo) * u;
}

} // namespace telar::detail
