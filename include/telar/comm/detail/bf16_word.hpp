#pragma once
// A bfloat16 value as it travels: the upper 16 bits of a float, rounded to
// nearest even. Adding two gives their float sum rounded again, which is
// what Telar's point-to-point allreduces do with received segments
// (schedule.hpp's add_into), so they sum bf16 buffers unchanged; MPI's
// reductions sum them through mpi_type.hpp's bf16 operation.
//
// narrow_in_place / widen_in_place let the words travel inside the float
// buffer they come from or go to (ZeRO's gathers and reduce-scatters), so
// nothing is allocated beside it: the memory plan stays the fp32 one.
#include <Kokkos_Macros.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace telar::detail {

struct Bf16Word {
  std::uint16_t bits = 0;

  // Also in device kernels (the cuBLAS bf16 GEMM's operands).
  KOKKOS_INLINE_FUNCTION static Bf16Word from_float(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) // NaN stays a (quiet) NaN
      return Bf16Word{std::uint16_t((u >> 16) | 0x40u)};
    u += 0x7fffu + ((u >> 16) & 1u); // round to nearest, ties to even
    return Bf16Word{std::uint16_t(u >> 16)};
  }
  float to_float() const {
    std::uint32_t const u = std::uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  Bf16Word& operator+=(Bf16Word o) { return *this = from_float(to_float() + o.to_float()); }
};

// The n floats at `data` rounded to n words in the buffer's first half,
// first to last (word k overwrites bytes of float k / 2, already read).
// Through bytes: words and floats share the storage.
inline Bf16Word* narrow_in_place(float* data, std::size_t n) {
  auto* bytes = reinterpret_cast<unsigned char*>(data);
  for (std::size_t k = 0; k < n; ++k) {
    float f;
    std::memcpy(&f, bytes + k * sizeof f, sizeof f);
    std::uint16_t const w = Bf16Word::from_float(f).bits;
    std::memcpy(bytes + k * sizeof w, &w, sizeof w);
  }
  return reinterpret_cast<Bf16Word*>(data);
}

// The n words in the first half of `data` widened to n floats in place,
// last first (float k overwrites words 2k and 2k + 1, already read).
inline void widen_in_place(float* data, std::size_t n) {
  auto* bytes = reinterpret_cast<unsigned char*>(data);
  for (std::size_t k = n; k-- > 0;) {
    Bf16Word w;
    std::memcpy(&w.bits, bytes + k * sizeof w.bits, sizeof w.bits);
    float const f = w.to_float();
    std::memcpy(bytes + k * sizeof f, &f, sizeof f);
  }
}

} // namespace telar::detail
