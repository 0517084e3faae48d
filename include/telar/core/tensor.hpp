#pragma once
/*! \file
 *  \brief Tensor aliases over Kokkos::View used throughout Telar.
 *
 *  Activations and gradients between layers are row-major matrices of shape
 *  [samples, features]; parameters are matrices or vectors. The memory space
 *  is always a template parameter so the same code runs on host and device.
 */
#include <Kokkos_Core.hpp>

#include <cstddef>
#include <limits>

namespace telar {

/*! \brief Memory space Telar uses when none is named: the default execution
 *  space's. */
using DefaultMemorySpace = Kokkos::DefaultExecutionSpace::memory_space;

/*! \brief Marks a feature count that is only known at run time. */
inline constexpr std::size_t dynamic_extent = std::numeric_limits<std::size_t>::max();

/*! \brief Row-major [rows, cols] matrix in \p MemorySpace.
 *  \tparam T value type \tparam MemorySpace a Kokkos memory space */
template <class T, class MemorySpace = DefaultMemorySpace>
using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>;

/*! \brief Read-only view of a Matrix.
 *  \tparam T value type \tparam MemorySpace a Kokkos memory space */
template <class T, class MemorySpace = DefaultMemorySpace>
using ConstMatrix = Kokkos::View<const T**, Kokkos::LayoutRight, MemorySpace>;

/*! \brief Contiguous vector in \p MemorySpace.
 *  \tparam T value type \tparam MemorySpace a Kokkos memory space */
template <class T, class MemorySpace = DefaultMemorySpace>
using Vector = Kokkos::View<T*, Kokkos::LayoutRight, MemorySpace>;

/*! \brief Class labels of a batch, one per sample.
 *  \tparam MemorySpace a Kokkos memory space */
template <class MemorySpace = DefaultMemorySpace>
using Labels = Kokkos::View<int*, Kokkos::LayoutRight, MemorySpace>;

/*! \brief Rows [first, last) of a matrix, without copying.
 *  \param m the matrix \param first first row \param last one past the last row */
template <class T, class... P>
auto rows(Kokkos::View<T**, P...> const& m, std::size_t first, std::size_t last) {
  return Kokkos::subview(m, Kokkos::make_pair(first, last), Kokkos::ALL);
}

/*! \brief Elements [first, last) of a vector, without copying.
 *  \param v the vector \param first first element \param last one past the last */
template <class T, class... P>
auto rows(Kokkos::View<T*, P...> const& v, std::size_t first, std::size_t last) {
  return Kokkos::subview(v, Kokkos::make_pair(first, last));
}

} // namespace telar
