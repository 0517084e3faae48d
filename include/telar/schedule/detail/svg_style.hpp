#pragma once

#include <telar/schedule/instruction.hpp>

#include <cmath>

namespace telar::schedule::detail {

inline char const* op_colour(Op op) {
  switch (op) {
  case Op::Forward:
    return "#4e79a7";
  case Op::BackwardInput:
    return "#f28e2b";
  case Op::BackwardWeight:
    return "#59a14f";
  case Op::Backward:
    return "#e15759";
  case Op::OptimizerStep:
    return "#8c6d8c";
  default:
    return "#b8b0ac";
  }
}

inline char const* op_legend(Op op) {
  switch (op) {
  case Op::Forward:
    return "F: Forward";
  case Op::BackwardInput:
    return "B: BackwardInput";
  case Op::BackwardWeight:
    return "W: BackwardWeight";
  case Op::Backward:
    return "B+W: Backward (fused)";
  case Op::OptimizerStep:
    return "OptimizerStep";
  default:
    return "communication wait";
  }
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
