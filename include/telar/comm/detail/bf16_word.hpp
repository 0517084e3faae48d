#pragma once
// A bfloat16 value as it travels: the upper 16 bits of a float, rounded to
// nearest even. Adding two gives their float sum rounded again, which is
// what Telar's point-to-point allreduces do with received segments
// (schedule.hpp's add_into), so they sum bf16 buffers unchanged.
#include <cstdint>
#include <cstring>

namespace telar::detail {

struct Bf16Word {
  std::uint16_t bits = 0;

  static Bf16Word from_float(float f) {
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

} // namespace telar::detail
