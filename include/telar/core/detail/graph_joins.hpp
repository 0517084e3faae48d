#pragma once
// Kernels of telar::DynamicGraph's join nodes over [samples, features]
// batches: Concat along the first per-sample dimension (a contiguous range of
// each row) and Mul with per-channel broadcasting.
#include <telar/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <utility>

namespace telar::detail {

// Columns [first, first + width) of a batch: one input's part of a Concat
// (the first per-sample dimension is the outermost, so each part is a
// contiguous range of every row).
template <class M>
auto graph_columns(M const& m, std::size_t first, std::size_t width) {
  return Kokkos::subview(m, Kokkos::ALL, std::make_pair(first, first + width));
}

// y[i, e] = a[i, e / (W / wa)] * b[i, e / (W / wb)]: an input narrower than
// y (W columns) holds one value per channel, spread over W / w columns.
template <class Exec, class Y, class A, class B>
void graph_mul(Exec const& exec, Y const& y, A const& a, B const& b) {
  std::size_t const W = y.extent(1), sa = W / a.extent(1), sb = W / b.extent(1);
  Kokkos::parallel_for(
      "telar::DynamicGraph::mul",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {y.extent(0), W}),
      KOKKOS_LAMBDA(std::size_t i, std::size_t e) { y(i, e) = a(i, e / sa) * b(i, e / sb); });
}

// Gradient of one input of a Mul: dx[i, k] = sum over the columns e of y
// that read x[i, k] of dy[i, e] * other[i, e / (W / w_other)]. A per-channel
// input sums over its channel's columns (no atomics: one thread per entry).
template <class Exec, class DX, class DY, class O>
void graph_mul_grad(Exec const& exec, DX const& dx, DY const& dy, O const& other) {
  std::size_t const W = dy.extent(1), spread = W / dx.extent(1), so = W / other.extent(1);
  Kokkos::parallel_for(
      "telar::DynamicGraph::mul_grad",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {dx.extent(0), dx.extent(1)}),
      KOKKOS_LAMBDA(std::size_t i, std::size_t k) {
        typename DX::non_const_value_type s = 0;
        for (std::size_t e = k * spread; e < (k + 1) * spread; ++e)
          s += dy(i, e) * other(i, e / so);
        dx(i, k) = s;
      });
}

} // namespace telar::detail
