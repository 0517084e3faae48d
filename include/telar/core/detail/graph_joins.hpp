#pragma once
// Kernels of telar::DynamicGraph's join nodes over [samples, features]
// batches: Concat along the first per-sample dimension (a contiguous range of
// each row), Add of two, Mul, Sub and Div with per-channel broadcasting and a
// batched MatMul of two tensors (attention's Q K^T and weights x V).
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

// The element-wise joins of two tensors; either may be spread (below).
enum class GraphElementwise { add, mul, sub, div };

// y[i, e] = a[i, e / (W / wa)] (op) b[i, e / (W / wb)]: an input narrower
// than y (W columns) holds one value per channel (or per sample), spread over
// W / w columns.
template <class Exec, class Y, class A, class B>
void graph_elementwise(Exec const& exec, Y const& y, A const& a, B const& b, GraphElementwise op) {
  std::size_t const W = y.extent(1), sa = W / a.extent(1), sb = W / b.extent(1);
  Kokkos::parallel_for(
      "telar::DynamicGraph::elementwise",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {y.extent(0), W}),
      KOKKOS_LAMBDA(std::size_t i, std::size_t e) {
        auto const u = a(i, e / sa), v = b(i, e / sb);
        y(i, e) = op == GraphElementwise::add   ? u + v
                  : op == GraphElementwise::mul ? u * v
                  : op == GraphElementwise::sub ? u - v
                                                : u / v;
      });
}

// Gradient of input j (0: a, 1: b) of an element-wise join: dx[i, k] = sum
// over the columns e of y that read x[i, k] of dy[i, e] times d(a op b)/dx
// at e (add: 1; mul: the other; sub: 1, -1; div: 1 / b, -a / b^2). A spread input
// sums over its columns (no atomics: one thread per entry).
template <class Exec, class DX, class DY, class A, class B>
void graph_elementwise_grad(Exec const& exec, DX const& dx, DY const& dy, A const& a, B const& b,
                            GraphElementwise op, int j) {
  std::size_t const W = dy.extent(1), spread = W / dx.extent(1);
  std::size_t const sa = W / a.extent(1), sb = W / b.extent(1);
  Kokkos::parallel_for(
      "telar::DynamicGraph::elementwise_grad",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {dx.extent(0), dx.extent(1)}),
      KOKKOS_LAMBDA(std::size_t i, std::size_t k) {
        using V = typename DX::non_const_value_type;
        V s = 0;
        for (std::size_t e = k * spread; e < (k + 1) * spread; ++e) {
          V const u = a(i, e / sa), v = b(i, e / sb), g = dy(i, e);
          if (op == GraphElementwise::add)
            s += g;
          else if (op == GraphElementwise::mul)
            s += g * (j == 0 ? v : u);
          else if (op == GraphElementwise::sub)
            s += j == 0 ? g : -g;
          else
            s += j == 0 ? g / v : -g * u / (v * v);
        }
        dx(i, k) = s;
      });
}

// One sample's P products of a batched MatMul, each y = op(a) op(b) with
// y [M, N] and op(a) [M, K]: a is stored [M, K], or [K, M] when ta (its
// transpose is used); b [K, N], or [N, K] when tb. One thread per entry of
// y, no atomics; forward is (false, false), dA = dY B^T is (false, true),
// dB = A^T dY is (true, false).
struct MatmulDims {
  std::size_t P, M, K, N;
  bool ta, tb;
};
template <class Exec, class Y, class A, class B>
void graph_matmul(Exec const& exec, Y const& y, A const& a, B const& b, MatmulDims d) {
  std::size_t const W = d.P * d.M * d.N;
  Kokkos::parallel_for(
      "telar::DynamicGraph::matmul",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {y.extent(0), W}),
      KOKKOS_LAMBDA(std::size_t i, std::size_t e) {
        std::size_t const p = e / (d.M * d.N), m = e / d.N % d.M, n = e % d.N;
        std::size_t const a0 = p * d.M * d.K, b0 = p * d.K * d.N;
        typename Y::non_const_value_type s = 0;
        for (std::size_t k = 0; k < d.K; ++k)
          s += a(i, a0 + (d.ta ? k * d.M + m : m * d.K + k)) *
               b(i, b0 + (d.tb ? n * d.K + k : k * d.N + n));
        y(i, e) = s;
      });
}

} // namespace telar::detail
