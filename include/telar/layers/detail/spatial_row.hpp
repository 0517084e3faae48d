#pragma once
// Rows of a batch of [C, D, H, W] samples stored row-major: row r of the
// [n * C * D * H, W] matrix is (plane = n C + c, d, h). Pooling and
// resampling kernels run one row per work item.
#include <Kokkos_Core.hpp>

#include <cstddef>

namespace telar::detail {

struct SpatialRow {
  std::size_t plane;
  int d, h;
  KOKKOS_INLINE_FUNCTION SpatialRow(std::size_t r, int D, int H)
      : plane(r / (std::size_t(D) * std::size_t(H))), d(int(r / std::size_t(H) % std::size_t(D))),
        h(int(r % std::size_t(H))) {}
};

} // namespace telar::detail
