#pragma once
// Flat element loops over contiguous matrices. Activations are row-major row
// blocks, so a flat index is cheaper than a 2-D policy on CPUs and coalesced
// on GPUs.
#include <telar/core/error.hpp>
#include <telar/core/tensor.hpp>

#include <string>

namespace telar::detail {

template <class View>
auto flat(View const& v, char const* api) {
  if (!v.span_is_contiguous())
    throw ShapeError(std::string(api) + ": expected a contiguous matrix");
  using T = typename View::value_type;
  return Kokkos::View<T*, typename View::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
      v.data(), v.size());
}

} // namespace telar::detail
