#pragma once
// PyTorch's default initialisation of a weight and its bias (uniform in
// +-1/sqrt(fan in)), drawn from the counter-based streams so any block of a
// tensor gets exactly the serial values at the same global indices.
#include <telar/core/detail/counter_rng.hpp>
#include <telar/core/detail/math.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace telar::detail {

// Draws the block of a full [rows, fan_in] W (and the matching entries of b)
// whose first element is (row0, col0); kernels are labelled
// "<label>::initialize" and "<label>::initialize_bias". A free function
// rather than a member: nvcc rejects extended lambdas in protected or private
// member functions.
template <class W, class B>
void uniform_fill_block(char const* label, W const& w, B const& b, std::uint64_t seed,
                        std::size_t fan_in, std::size_t row0, std::size_t col0) {
  using T = typename W::non_const_value_type;
  using Exec = typename W::memory_space::execution_space;
  T const bound = T(1) / detail::sqrt(T(fan_in == 0 ? 1 : fan_in));
  std::uint64_t const wseed = mix_seed(seed, 0), bseed = mix_seed(seed, 1);
  Kokkos::parallel_for(
      std::string(label) + "::initialize",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>({0, 0}, {w.extent(0), w.extent(1)}),
      KOKKOS_LAMBDA(std::size_t i, std::size_t j) {
        w(i, j) = uniform_at(wseed, (row0 + i) * fan_in + (col0 + j), -bound, bound);
      });
  if (b.extent(0) > 0) {
    Kokkos::parallel_for(
        std::string(label) + "::initialize_bias", Kokkos::RangePolicy<Exec>(0, b.extent(0)),
        KOKKOS_LAMBDA(std::size_t i) { b(i) = uniform_at(bseed, row0 + i, -bound, bound); });
  }
  Kokkos::fence();
}

} // namespace telar::detail
