#pragma once
// Internals of telar/parallel/tensor_parallel.hpp: how a dimension is cut
// into tp blocks, shape messages, profiling regions.
#include <telar/core/detail/decl.hpp>
#include <telar/core/error.hpp>
#include <telar/profile/detail/region.hpp>

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

TELAR_DECL TpBlock tp_block(std::size_t n, int parts, int b);

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
TELAR_DECL void tp_check_pair(char const* layer, char const* method, int rank, int size,
                              char const* a_name, std::size_t an, std::size_t af,
                              std::size_t a_cols, char const* b_name, std::size_t bn,
                              std::size_t bf, std::size_t b_cols);

// Throws ShapeError unless W is [rows, cols] (the local block).
TELAR_DECL void tp_check_weight(char const* layer, char const* method, int rank, int size,
                                std::size_t w_rows, std::size_t w_cols, std::size_t rows,
                                std::size_t cols);

// The split fixes which values the parameters hold: once they exist it may
// not change (the communicator or the algorithm may).
TELAR_DECL void tp_check_resplit(char const* layer, bool initialized, TpBlock have, TpBlock want);

} // namespace telar::detail

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/parallel/detail/tensor_parallel.ipp>
#endif
