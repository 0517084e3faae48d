// What telar/parallel/detail/memory_plan_detail.hpp declares with TELAR_DECL: inline in the
// header-only build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/parallel/detail/memory_plan_detail.hpp>

namespace telar::detail {

TELAR_DECL std::size_t rebuilt_states(schedule::Schedule const& s, int rank, int chunk) {
  std::size_t open = 0, most = 1;
  for (auto const& in : s.ranks[std::size_t(rank)]) {
    if (in.chunk != chunk)
      continue;
    if (in.op == schedule::Op::BackwardInput)
      most = std::max(most, ++open);
    else if (in.op == schedule::Op::BackwardWeight && open > 0)
      --open;
  }
  return most;
}

TELAR_DECL bool splits_backward(schedule::Schedule const& s, int rank, int chunk) {
  for (auto const& in : s.ranks[std::size_t(rank)])
    if (in.chunk == chunk && in.op == schedule::Op::BackwardInput)
      return true;
  return false;
}

TELAR_DECL std::string budget_message(MemoryPlan const& worst, std::size_t budget,
                                      MemoryPlan const& fits, MemoryPlan const& smallest,
                                      int world) {
  MemoryCategory const big = worst.bytes.largest();
  std::string key = MemoryBytes::key(big);
  std::replace(key.begin(), key.end(), '_', ' ');
  std::string msg = "telar::Trainer: rank " + std::to_string(worst.rank) + " needs " +
                    MemoryBytes::human(worst.bytes.total()) + " (" + key + " " +
                    MemoryBytes::human(worst.bytes[big]) + " is the largest), over the budget of " +
                    MemoryBytes::human(budget) + " (" + worst.layout() + "); ";
  if (fits.rank >= 0)
    return msg + fits.layout() + " needs " + MemoryBytes::human(fits.bytes.total()) + " per rank";
  return msg + "no layout of " + std::to_string(world) + " ranks fits; the smallest (" +
         smallest.layout() + ") needs " + MemoryBytes::human(smallest.bytes.total()) + " per rank";
}

} // namespace telar::detail
