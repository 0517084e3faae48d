#pragma once
// The sizes of a pooling over [C, D, H, W] (telar/layers/pooling.hpp), passed
// by value to its kernels, and what they ask of them.
#include <Kokkos_Core.hpp>

#include <cstddef>

namespace telar::detail {

// Sizes of a pooling over [C, D, H, W], passed by value to kernels. 2-D
// pooling is the case D = 1 with a unit window along D, so one set of
// kernels serves both.
struct PoolGeometry {
  int C = 0;
  int in[3] = {1, 1, 1};  // D, H, W
  int out[3] = {1, 1, 1}; // Do, Ho, Wo
  int k[3] = {1, 1, 1}, s[3] = {1, 1, 1}, p[3] = {0, 0, 0};
  int pb[3] = {0, 0, 0}; // padding after the input: p, or a slab's own (spatial parallelism)
  bool count_pad = true; // average pooling: padding counts in the divisor
  bool uniform = true;   // every average divides by k[0] k[1] k[2] (see count)

  KOKKOS_INLINE_FUNCTION std::size_t in_plane() const {
    return std::size_t(in[0]) * std::size_t(in[1]) * std::size_t(in[2]);
  }
  KOKKOS_INLINE_FUNCTION std::size_t out_plane() const {
    return std::size_t(out[0]) * std::size_t(out[1]) * std::size_t(out[2]);
  }
  // Rows of W values, one per (sample, channel, depth, height), in n
  // samples of the input or of the output: a kernel's threads.
  std::size_t in_rows(std::size_t n) const {
    return n * std::size_t(C) * std::size_t(in[0]) * std::size_t(in[1]);
  }
  std::size_t out_rows(std::size_t n) const {
    return n * std::size_t(C) * std::size_t(out[0]) * std::size_t(out[1]);
  }
  // First input index of window o along dimension a (negative in padding).
  KOKKOS_INLINE_FUNCTION int start(int a, int o) const { return o * s[a] - p[a]; }
  // Window o along a clipped to the input, [lo, hi): never empty (the last
  // ceil_mode window starts inside the input or the left padding).
  KOKKOS_INLINE_FUNCTION void clip(int a, int o, int& lo, int& hi) const {
    int const b = start(a, o);
    lo = b > 0 ? b : 0;
    hi = b + k[a] < in[a] ? b + k[a] : in[a];
  }
  // Input elements of window o along a that the average divides by:
  // PyTorch's rule, the window clipped to the padded input, or to the input
  // itself without count_pad (ceil_mode windows may reach past both).
  KOKKOS_INLINE_FUNCTION int count(int a, int o) const {
    int const b = start(a, o), e = b + k[a];
    if (count_pad)
      return (e < in[a] + pb[a] ? e : in[a] + pb[a]) - b;
    return (e < in[a] ? e : in[a]) - (b > 0 ? b : 0);
  }
  // Outputs along a whose windows [o s - p, o s - p + k) cover input index
  // i, [lo, hi): what backward gathers from.
  KOKKOS_INLINE_FUNCTION void cover(int a, int i, int& lo, int& hi) const {
    int const t = i + p[a] - k[a] + 1;
    lo = t <= 0 ? 0 : (t + s[a] - 1) / s[a];
    hi = (i + p[a]) / s[a] + 1;
    if (hi > out[a])
      hi = out[a];
  }
};

// The window of output o along D clipped to the input, and the outputs
// covering input i along D: constants for 2-D pooling, so that its loops
// over D vanish at compile time.
template <int Dims>
KOKKOS_INLINE_FUNCTION void pool_clip_d(PoolGeometry const& g, int o, int& lo, int& hi) {
  if constexpr (Dims == 2)
    lo = 0, hi = 1;
  else
    g.clip(0, o, lo, hi);
}
template <int Dims>
KOKKOS_INLINE_FUNCTION void pool_cover_d(PoolGeometry const& g, int i, int& lo, int& hi) {
  if constexpr (Dims == 2)
    lo = 0, hi = 1;
  else
    g.cover(0, i, lo, hi);
}

// Windows that tile the input without padding or overlap (stride = kernel,
// the usual 2 x 2 / 2, every window whole): backward scatters each output
// gradient to its maximum instead of gathering over covering windows, and
// forward needs no clipping.
KOKKOS_INLINE_FUNCTION bool pool_tiled(PoolGeometry const& g) {
  for (int a = 0; a < 3; ++a)
    if (g.p[a] != 0 || g.s[a] != g.k[a] || g.out[a] * g.k[a] > g.in[a])
      return false;
  return true;
}

} // namespace telar::detail
