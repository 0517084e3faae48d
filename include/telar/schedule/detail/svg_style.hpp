#pragma once

#include <telar/schedule/instruction.hpp>

#include <cmath>

namespace telar::schedule::detail {

// Each Op's fill colour and legend, in the order of the enumeration; the
// communication operations share one (time spent waiting on a message).
struct OpStyle {
  char const* colour;
  char const* legend;
};
inline constexpr OpStyle op_styles[] = {
    {"#4e79a7", "F: Forward"},         {"#f28e2b", "B: BackwardInput"},
    {"#59a14f", "W: BackwardWeight"},  {"#e15759", "B+W: Backward (fused)"},
    {"#b8b0ac", "communication wait"}, {"#b8b0ac", "communication wait"},
    {"#b8b0ac", "communication wait"}, {"#b8b0ac", "communication wait"},
    {"#8c6d8c", "OptimizerStep"}};

inline char const* op_colour(Op op) {
  return op_styles[static_cast<int>(op)].colour;
}

inline char const* op_legend(Op op) {
  return op_styles[static_cast<int>(op)].legend;
}

// A round step (1, 2 or 5 times a power of ten) giving about `target` ticks.
inline double tick_step(double range, int target) {
  if (!(range > 0))
    return 1.0;
  double const raw = range / target;
  double const mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0})
    if (f * mag >= raw)
      return f * mag;
  return 10.0 * mag;
}

} // namespace telar::schedule::detail
