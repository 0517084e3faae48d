#pragma once

#include <telar/schedule/cost_model.hpp>
#include <telar/schedule/detail/costs.hpp>
#include <telar/schedule/detail/execute.hpp>
#include <telar/schedule/detail/messages.hpp>
#include <telar/schedule/schedule.hpp>
#include <telar/schedule/timeline.hpp>
#include <telar/schedule/validate.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

/*! \file
    \brief A cost-model simulator that runs a Schedule and returns its Timeline and statistics. */

namespace telar::schedule {

/*! \brief What simulate() returns: TimelineStats (makespan, busy, bubble figures) of the
    simulated Timeline, plus peak activations per rank. */
struct SimulationResult : TimelineStats {
  std::vector<int> peak_activations; //!< per rank, see telar::schedule::peak_activations()
  Timeline timeline;                 //!< every instruction with its simulated times
};

/*! \brief Runs `s` under `cost`: each rank executes its list in order, one instruction at a time;
    a Send takes `cost.send_overhead`, a Recv completes `cost.recv_overhead` after the matching
    Send's message has arrived.

    \throws ScheduleError if `s` does not pass validate() (SendMode::Eager).
    \throws std::invalid_argument if `cost` does not fit the schedule. */
inline SimulationResult simulate(Schedule const& s, CostModel const& cost = {}) {
  check(s);
  detail::check_costs(cost, s.virtual_stages());
  auto const partner = detail::match_messages(
      s, [](int, int) { return true; }, [](detail::Site) {});
  int const p = s.stages;
  std::vector<double> now(p, 0.0);
  std::vector<std::vector<double>> arrival(p); // of each send's message
  std::size_t total = 0;
  for (int r = 0; r < p; ++r) {
    arrival[r].assign(s.ranks[r].size(), 0.0);
    total += s.ranks[r].size();
  }
  SimulationResult out;
  out.timeline.name = s.name;
  out.timeline.ranks = p;
  out.timeline.events.reserve(total);
  detail::execute(s, partner, false, [&](int r, int i) {
    Instruction const& in = s.ranks[r][i];
    int const vs = s.virtual_stage(r, in.chunk);
    double const t = now[r];
    double end = t;
    switch (in.op) {
    case Op::Forward:
      end += detail::stage_cost(cost.forward, vs);
      break;
    case Op::BackwardInput:
      end += detail::stage_cost(cost.backward_input, vs);
      break;
    case Op::BackwardWeight:
      end += detail::stage_cost(cost.backward_weight, vs);
      break;
    case Op::Backward:
      end += detail::stage_cost(cost.backward_input, vs) +
             detail::stage_cost(cost.backward_weight, vs);
      break;
    case Op::OptimizerStep:
      end += cost.optimizer_step;
      break;
    case Op::SendActivation:
      end += cost.send_overhead;
      arrival[r][i] = end + cost.alpha + cost.beta * cost.activation_bytes;
      break;
    case Op::SendGrad:
      end += cost.send_overhead;
      arrival[r][i] = end + cost.alpha + cost.beta * cost.grad_bytes;
      break;
    default: { // a Recv; execute() runs it only after its send
      detail::Site const from = partner[r][i];
      end = std::max(t, arrival[from.rank][from.index]) + cost.recv_overhead;
    }
    }
    out.timeline.events.push_back({r, in.op, in.microbatch, in.chunk, t, end});
    now[r] = end;
  });
  static_cast<TimelineStats&>(out) = analyze(out.timeline);
  out.peak_activations = peak_activations(s);
  return out;
}

} // namespace telar::schedule
