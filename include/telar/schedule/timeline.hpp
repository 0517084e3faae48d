#pragma once

#include <telar/schedule/instruction.hpp>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

/*! \file
    \brief Timeline: what each rank did when, simulated or measured, and its bubble statistics. */

namespace telar::schedule {

/*! \brief One executed instruction on one rank, with its start and end time.

    Compute events (is_compute()) span the work; a Recv spans the time the rank waited in it
    for the data (plus CostModel::recv_overhead); a Send spans the posting of the message
    (CostModel::send_overhead, zero by default). A measured timeline may hold two events for one
    Recv: its posting and, later, the wait for its data. Times are in any unit (the simulator's
    cost unit, or seconds from MPI_Wtime). */
struct Event {
  int rank = 0;        //!< pipeline rank
  Op op = Op::Forward; //!< what ran
  int microbatch = -1; //!< micro-batch, -1 for OptimizerStep
  int chunk = 0;       //!< model chunk on the rank
  double start = 0.0;  //!< start time
  double end = 0.0;    //!< end time (>= start)

  /*! \brief end - start. */
  double duration() const { return end - start; }
};

/*! \brief A run of one schedule: its events, from the simulator or recorded by an executor. */
struct Timeline {
  std::string name;          //!< schedule name (chart titles)
  int ranks = 0;             //!< number of pipeline ranks (rows); events may not use all
  std::vector<Event> events; //!< in any order
};

/*! \brief Bubble statistics of a Timeline (see analyze()).

    Busy time counts compute events only. Two views of the bubble:
    - one isolated iteration: `makespan` from the first start to the last end;
      `bubble_fraction = 1 - sum(busy) / (ranks * makespan)` and
      `bubble_ratio = (makespan - ideal) / ideal`, with `ideal` the busiest rank's busy time;
    - iterations back to back without a global barrier at the optimizer step: each rank's
      `span` runs from its first compute start to its last compute end, and repeating the whole
      timeline every `period = max(span)` is always feasible (each rank restarts after it
      finished). `period_bubble_fraction = 1 - sum(busy) / (ranks * period)`; it is 0 for a
      schedule whose ranks never idle between their first and last op, like ZB-H2. */
struct TimelineStats {
  int ranks = 0;                       //!< rows (max of Timeline::ranks and the ranks seen)
  double start = 0.0;                  //!< earliest event start
  double makespan = 0.0;               //!< latest end minus earliest start
  std::vector<double> busy;            //!< per rank: summed duration of compute events
  std::vector<double> span;            //!< per rank: last compute end minus first compute start
  double ideal = 0.0;                  //!< max(busy): time without any bubble
  double bubble_time = 0.0;            //!< makespan - ideal
  double bubble_fraction = 0.0;        //!< 1 - sum(busy) / (ranks * makespan)
  double bubble_ratio = 0.0;           //!< bubble_time / ideal
  double period = 0.0;                 //!< max(span): iteration time when iterations overlap
  double period_bubble_fraction = 0.0; //!< 1 - sum(busy) / (ranks * period)
};

/*! \brief Computes TimelineStats from any Timeline (simulated or measured). */
inline TimelineStats analyze(Timeline const& tl) {
  TimelineStats st;
  st.ranks = tl.ranks;
  for (auto const& e : tl.events)
    st.ranks = std::max(st.ranks, e.rank + 1);
  st.busy.assign(st.ranks, 0.0);
  st.span.assign(st.ranks, 0.0);
  if (tl.events.empty() || st.ranks == 0)
    return st;
  constexpr double inf = std::numeric_limits<double>::infinity();
  std::vector<double> first(st.ranks, inf), last(st.ranks, -inf);
  double lo = inf, hi = -inf;
  for (auto const& e : tl.events) {
    lo = std::min(lo, e.start);
    hi = std::max(hi, e.end);
    if (e.rank < 0 || !is_compute(e.op))
      continue;
    st.busy[e.rank] += e.duration();
    first[e.rank] = std::min(first[e.rank], e.start);
    last[e.rank] = std::max(last[e.rank], e.end);
  }
  st.start = lo;
  st.makespan = hi - lo;
  double total = 0.0;
  for (int r = 0; r < st.ranks; ++r) {
    if (last[r] >= first[r])
      st.span[r] = last[r] - first[r];
    total += st.busy[r];
    st.ideal = std::max(st.ideal, st.busy[r]);
    st.period = std::max(st.period, st.span[r]);
  }
  st.bubble_time = st.makespan - st.ideal;
  if (st.makespan > 0)
    st.bubble_fraction = 1.0 - total / (st.ranks * st.makespan);
  if (st.ideal > 0)
    st.bubble_ratio = st.bubble_time / st.ideal;
  if (st.period > 0)
    st.period_bubble_fraction = 1.0 - total / (st.ranks * st.period);
  return st;
}

} // namespace telar::schedule
