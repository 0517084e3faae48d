#pragma once
// Row copies between tensors split along one axis: a tensor [n, C * rows *
// plane] is `outer` = n * C blocks of `rows` rows of `plane` elements each
// (the split axis is the first spatial one, so its rows are contiguous within
// a channel). Halo packing, unpacking and the gradient sums are all this copy.
#include <Kokkos_Core.hpp>

#include <cstddef>

namespace telar::detail {

// One side of a row copy: base pointer, rows per block, first row used.
template <class P>
struct RowBlocks {
  P* data;
  std::size_t rows; // rows per block
  std::size_t row0; // first row read or written in each block
};

// dst rows [dst.row0, + count) (= or +=) src rows [src.row0, + count), in
// every one of `outer` blocks; zeros where src.data is null.
template <class T, class Exec>
void copy_rows(Exec const& exec, RowBlocks<T const> src, RowBlocks<T> dst, std::size_t count,
               std::size_t outer, std::size_t plane, bool add) {
  std::size_t const per = count * plane;
  if (per == 0 || outer == 0)
    return;
  Kokkos::parallel_for(
      "telar::HaloExchange::copy_rows", Kokkos::RangePolicy<Exec>(exec, 0, outer * per),
      KOKKOS_LAMBDA(std::size_t i) {
        std::size_t const b = i / per, r = i % per;
        T const v = src.data ? src.data[(b * src.rows + src.row0) * plane + r] : T(0);
        T& out = dst.data[(b * dst.rows + dst.row0) * plane + r];
        out = add ? out + v : v;
      });
}

// dst rows [row0, + count) = 0 in every block.
template <class T, class Exec>
void zero_rows(Exec const& exec, RowBlocks<T> dst, std::size_t count, std::size_t outer,
               std::size_t plane) {
  copy_rows<T>(exec, {nullptr, 0, 0}, dst, count, outer, plane, false);
}

} // namespace telar::detail
