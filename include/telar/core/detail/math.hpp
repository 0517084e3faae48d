#pragma once
// Math functions callable from device code on Kokkos 3.4 and 4.x: Kokkos 3.x
// keeps them in Kokkos::Experimental, 3.7+ and 4.x in Kokkos.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace telar::detail {
#if KOKKOS_VERSION >= 30700
using Kokkos::erf;
using Kokkos::exp;
using Kokkos::fabs;
using Kokkos::log;
using Kokkos::pow;
using Kokkos::sqrt;
using Kokkos::tanh;
#else
using Kokkos::Experimental::erf;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::fabs;
using Kokkos::Experimental::log;
using Kokkos::Experimental::pow;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::tanh;
#endif

template <class T>
KOKKOS_INLINE_FUNCTION constexpr T max(T a, T b) {
  return a < b ? b : a;
}
template <class T>
KOKKOS_INLINE_FUNCTION constexpr T min(T a, T b) {
  return b < a ? b : a;
}

// The bits of `from` as a `To`, on every backend: Kokkos::bit_cast where
// Kokkos has it (4.1 on: device code too; std::memcpy is a host function
// under HIP), std::memcpy on Kokkos 3.4 (the host only).
template <class To, class From>
KOKKOS_INLINE_FUNCTION To bit_cast(From const& from) {
  static_assert(sizeof(To) == sizeof(From), "telar::detail::bit_cast: sizes differ");
#if KOKKOS_VERSION >= 40100
  return Kokkos::bit_cast<To>(from);
#else
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
#endif
}

// x where `keep`, else +0, without a branch: GCC 12 at -O2 compiles
// `keep ? x : 0` in a loop to a jump on every value, which mispredicts on
// half of a network's activations (their signs are random): ReLU's forward
// and backward 13-20x slower than on one sign. A float or double is masked
// bit by bit; other types keep the select.
template <class T>
KOKKOS_INLINE_FUNCTION T zero_unless(bool keep, T x) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    return bit_cast<T>(bit_cast<Bits>(x) & (Bits(0) - Bits(keep)));
  } else {
    return keep ? x : T(0);
  }
}

// c ? a : b without a branch, as zero_unless: one of the two terms is +0, so
// the result is exact but for a -0 picked, which becomes +0.
template <class T>
KOKKOS_INLINE_FUNCTION T select(bool c, T a, T b) {
  return zero_unless(c, a) + zero_unless(!c, b);
}
} // namespace telar::detail
