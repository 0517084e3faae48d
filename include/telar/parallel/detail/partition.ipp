// What telar/parallel/detail/partition.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/parallel/detail/partition.hpp>

namespace telar::detail {

TELAR_DECL std::vector<std::size_t> balanced_partition(std::vector<double> const& costs,
                                                       std::size_t stages) {
  std::size_t const L = costs.size();
  if (stages == 0 || stages > L)
    throw Error("telar::Trainer: cannot split a model of " + std::to_string(L) + " layers into " +
                std::to_string(stages) + " pipeline stages (each stage needs at least one layer)");
  std::vector<double> prefix(L + 1, 0.0);
  for (std::size_t i = 0; i < L; ++i)
    prefix[i + 1] = prefix[i] + costs[i];
  double const inf = std::numeric_limits<double>::infinity();
  // best[s][i]: minimal max-cost of splitting the first i layers into s stages.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<std::size_t>> cut(stages + 1, std::vector<std::size_t>(L + 1, 0));
  best[0][0] = 0;
  for (std::size_t s = 1; s <= stages; ++s)
    for (std::size_t i = s; i <= L; ++i)
      for (std::size_t j = s - 1; j < i; ++j) {
        double const c = std::max(best[s - 1][j], prefix[i] - prefix[j]);
        // Ties go to the later cut, which keeps cheap trailing layers (the
        // activation after the last Dense) with their producer.
        if (c <= best[s][i]) {
          best[s][i] = c;
          cut[s][i] = j;
        }
      }
  std::vector<std::size_t> b(stages + 1, L);
  for (std::size_t s = stages; s > 0; --s)
    b[s - 1] = cut[s][b[s]];
  return b;
}

TELAR_DECL void check_partition(std::vector<std::size_t> const& b, std::size_t layers,
                                std::size_t stages) {
  bool ok = b.size() == stages + 1 && b.front() == 0 && b.back() == layers;
  for (std::size_t i = 1; ok && i < b.size(); ++i)
    ok = b[i] > b[i - 1];
  if (!ok) {
    std::string got;
    for (auto x : b)
      got += (got.empty() ? "" : ", ") + std::to_string(x);
    throw Error("telar::Trainer: stage boundaries [" + got + "] do not split " +
                std::to_string(layers) + " layers into " + std::to_string(stages) +
                " non-empty stages (expected " + std::to_string(stages + 1) +
                " increasing values from 0 to " + std::to_string(layers) + ")");
  }
}

} // namespace telar::detail
