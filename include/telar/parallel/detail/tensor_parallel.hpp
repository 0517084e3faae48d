#pragma once
// Internals of telar/parallel/tensor_parallel.hpp: how a dimension is cut
// into tp blocks, shape messages, profiling regions.
#include <telar/core/error.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>

namespace telar::detail {

// Block b of n items cut into `parts`: [n b / parts, n (b + 1) / parts).
// Sizes differ by at most one; a block is empty when n < parts.
struct TpBlock {
  std::size_t begin = 0;
  std::size_t size = 0;
};

inline TpBlock tp_block(std::size_t n, int parts, int b) {
  std::size_t const p = std::size_t(parts), i = std::size_t(b);
  std::size_t const first = n * i / p, last = n * (i + 1) / p;
  return {first, last - first};
}

inline std::string tp_shape(std::size_t r, std::size_t c) {
  return "[" + std::to_string(r) + ", " + std::to_string(c) + "]";
}

// "telar::RowParallel<Dense>::forward: tp rank 1 of 2: <what>"
inline std::string tp_where(char const* layer, char const* method, int rank, int size) {
  return std::string("telar::") + layer + "::" + method + ": tp rank " + std::to_string(rank) +
         " of " + std::to_string(size) + ": ";
}

// Throws ShapeError unless a is [n, p * a_cols] and b is [n, p * b_cols] (same
// n, p positions per sample).
inline void tp_check_pair(char const* layer, char const* method, int rank, int size,
                          char const* a_name, std::size_t an, std::size_t af, std::size_t a_cols,
                          char const* b_name, std::size_t bn, std::size_t bf, std::size_t b_cols) {
  // Position-wise: [n, p * a_cols] against [n, p * b_cols] for p positions.
  std::size_t p = a_cols > 0 ? af / a_cols : b_cols > 0 ? bf / b_cols : 1;
  p = p == 0 ? 1 : p;
  if (af != p * a_cols || bf != p * b_cols || an != bn)
    throw ShapeError(tp_where(layer, method, rank, size) + "expected " + a_name + " [n, " +
                     std::to_string(a_cols) + "] and " + b_name + " [n, " + std::to_string(b_cols) +
                     "], got " + a_name + " " + tp_shape(an, af) + " and " + b_name + " " +
                     tp_shape(bn, bf));
}

// Throws ShapeError unless W is [rows, cols] (the local block).
inline void tp_check_weight(char const* layer, char const* method, int rank, int size,
                            std::size_t w_rows, std::size_t w_cols, std::size_t rows,
                            std::size_t cols) {
  if (w_rows != rows || w_cols != cols)
    throw ShapeError(tp_where(layer, method, rank, size) + "W is " + tp_shape(w_rows, w_cols) +
                     ", expected " + tp_shape(rows, cols) +
                     " (call set_tensor_parallel, then initialize)");
}

// The split fixes which values the parameters hold: once they exist it may
// not change (the communicator or the algorithm may).
inline void tp_check_resplit(char const* layer, bool initialized, TpBlock have, TpBlock want) {
  if (initialized && (have.begin != want.begin || have.size != want.size))
    throw Error(std::string("telar::") + layer +
                "::set_tensor_parallel: called after initialize with another split; call it "
                "before initialize");
}

// Kokkos Tools region for the lifetime of the object.
struct TpRegion {
  explicit TpRegion(std::string const& name) { Kokkos::Profiling::pushRegion(name); }
  ~TpRegion() { Kokkos::Profiling::popRegion(); }
  TpRegion(TpRegion const&) = delete;
  TpRegion& operator=(TpRegion const&) = delete;
};

} // namespace telar::detail
