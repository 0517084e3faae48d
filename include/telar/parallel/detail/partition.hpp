#pragma once
// Splits a chain of layers into contiguous pipeline stages of balanced cost.
#include <telar/core/detail/decl.hpp>
#include <telar/core/error.hpp>

#include <limits>
#include <string>
#include <vector>

namespace telar::detail {

// Boundaries b[0] = 0 < b[1] < ... < b[stages] = costs.size() minimising the
// largest stage cost (classic linear partition, O(L^2 S): models have tens
// of layers). Every stage gets at least one layer.
TELAR_DECL std::vector<std::size_t> balanced_partition(std::vector<double> const& costs,
                                                       std::size_t stages);

// Checks user-given boundaries.
TELAR_DECL void check_partition(std::vector<std::size_t> const& b, std::size_t layers,
                                std::size_t stages);

} // namespace telar::detail

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/parallel/detail/partition.ipp>
#endif
