#pragma once
// out(j) += sum over rows i of term(i, j): bias and norm-parameter gradients.
// Each column is summed over its rows in order, so every backend gives the
// same sums; what differs is who reads what. On a device one thread takes a
// column and a warp reads a row's consecutive values. On a host thread that
// reading order strides through memory by a row per value, so there a thread
// takes a block of columns, walks the rows once and reads each row's block
// contiguously (vectorisable: 5% of a transformer block's step before; a
// block of columns is one call of a simd_for, so 16 wide where the CPU has
// AVX-512).
#include <telar/core/detail/host_simd.hpp>

#include <cstddef>

namespace telar::detail {

template <class Exec, class Term, class Out>
void add_column_sums(char const* label, Exec const& exec, std::size_t rows, std::size_t cols,
                     Term term, Out out) {
  using T = typename Out::non_const_value_type;
  if constexpr (runs_on_host_v<Exec>) {
    constexpr std::size_t B = 64;
    simd_for(
        label, exec, (cols + B - 1) / B,
        [=](std::size_t b) {
          std::size_t const j0 = b * B, w = cols - j0 < B ? cols - j0 : B;
          T acc[B] = {};
          if (w == B) { // the compiler sees a fixed trip count
            for (std::size_t i = 0; i < rows; ++i)
              for (std::size_t c = 0; c < B; ++c)
                acc[c] += term(i, j0 + c);
          } else {
            for (std::size_t i = 0; i < rows; ++i)
              for (std::size_t c = 0; c < w; ++c)
                acc[c] += term(i, j0 + c);
          }
          for (std::size_t c = 0; c < w; ++c)
            out(j0 + c) += acc[c];
        },
        1);
  } else {
    Kokkos::parallel_for(
        label, Kokkos::RangePolicy<Exec>(exec, 0, cols), KOKKOS_LAMBDA(std::size_t j) {
          T s = 0;
          for (std::size_t i = 0; i < rows; ++i)
            s += term(i, j);
          out(j) += s;
        });
  }
}

} // namespace telar::detail
