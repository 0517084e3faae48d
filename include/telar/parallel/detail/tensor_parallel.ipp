// What telar/parallel/detail/tensor_parallel.hpp declares with TELAR_DECL: inline in the
// header-only build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/parallel/detail/tensor_parallel.hpp>

namespace telar::detail {

TELAR_DECL TpBlock tp_block(std::size_t n, int parts, int b) {
  std::size_t const p = std::size_t(parts), i = std::size_t(b);
  std::size_t const first = n * i / p, last = n * (i + 1) / p;
  return {first, last - first};
}

TELAR_DECL void tp_check_pair(char const* layer, char const* method, int rank, int size,
                              char const* a_name, std::size_t an, std::size_t af,
                              std::size_t a_cols, char const* b_name, std::size_t bn,
                              std::size_t bf, std::size_t b_cols) {
  // Position-wise: [n, p * a_cols] against [n, p * b_cols] for p positions.
  std::size_t p = a_cols > 0 ? af / a_cols : b_cols > 0 ? bf / b_cols : 1;
  p = p == 0 ? 1 : p;
  if (af != p * a_cols || bf != p * b_cols || an != bn)
    throw ShapeError(tp_where(layer, method, rank, size) + "expected " + a_name + " [n, " +
                     std::to_string(a_cols) + "] and " + b_name + " [n, " + std::to_string(b_cols) +
                     "], got " + a_name + " " + tp_shape(an, af) + " and " + b_name + " " +
                     tp_shape(bn, bf));
}

TELAR_DECL void tp_check_weight(char const* layer, char const* method, int rank, int size,
                                std::size_t w_rows, std::size_t w_cols, std::size_t rows,
                                std::size_t cols) {
  if (w_rows != rows || w_cols != cols)
    throw ShapeError(tp_where(layer, method, rank, size) + "W is " + tp_shape(w_rows, w_cols) +
                     ", expected " + tp_shape(rows, cols) +
                     " (call set_tensor_parallel, then initialize)");
}

TELAR_DECL void tp_check_resplit(char const* layer, bool initialized, TpBlock have, TpBlock want) {
  if (initialized && (have.begin != want.begin || have.size != want.size))
    throw Error(std::string("telar::") + layer +
                "::set_tensor_parallel: called after initialize with another split; call it "
                "before initialize");
}

} // namespace telar::detail
