#pragma once

#include <telar/schedule/cost_model.hpp>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace telar::schedule::detail {

inline double stage_cost(std::vector<double> const& v, int vstage) {
  return v.size() == 1 ? v[0] : v[vstage];
}

inline void check_costs(CostModel const& c, int vstages) {
  auto check = [&](std::vector<double> const& v, char const* field) {
    if (v.size() != 1 && v.size() != static_cast<std::size_t>(vstages))
      throw std::invalid_argument(std::string("telar::schedule::simulate: CostModel::") + field +
                                  " has " + std::to_string(v.size()) + " entries; expected 1 or " +
                                  std::to_string(vstages) + " (one per virtual stage)");
    for (double x : v)
      if (!(x >= 0) || !std::isfinite(x))
        throw std::invalid_argument(std::string("telar::schedule::simulate: CostModel::") + field +
                                    " holds " + std::to_string(x) +
                                    "; costs must be finite and >= 0");
  };
  check(c.forward, "forward");
  check(c.backward_input, "backward_input");
  check(c.backward_weight, "backward_weight");
  for (double x : {c.optimizer_step, c.alpha, c.beta, c.activation_bytes, c.grad_bytes,
                   c.send_overhead, c.recv_overhead})
    if (!(x >= 0) || !std::isfinite(x))
      throw std::invalid_argument("telar::schedule::simulate: CostModel scalars (optimizer_step, "
                                  "alpha, beta, bytes, overheads) must be finite and >= 0");
}

} // namespace telar::schedule::detail
