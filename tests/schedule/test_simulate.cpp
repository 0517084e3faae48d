// The simulator against the closed-form bubbles of each schedule, and its message model.
#include "grid.hpp"

#include <telar/schedule/generators.hpp>
#include <telar/schedule/simulate.hpp>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>

using namespace telar::schedule;
using Catch::Approx;
using Catch::Matchers::ContainsSubstring;
using telar_test::ms;
using telar_test::ps;

namespace {
Approx exact(double x) {
  return Approx(x).margin(1e-12).epsilon(1e-12);
}
} // namespace

TEST_CASE("simulate: GPipe and 1F1B bubble fraction is (p-1)/(m+p-1)", "[schedule]") {
  // F=1, B=2 (input 1 + weight 1), and an uneven uniform split.
  for (auto const& cost : {CostModel::uniform(1, 1, 1), CostModel::uniform(1.5, 2.0, 0.5)})
    for (int p : ps)
      for (int m : ms) {
        INFO("p=" << p << " m=" << m << " F=" << cost.forward[0]);
        double const expected = double(p - 1) / (m + p - 1);
        auto const g = simulate(gpipe(p, m), cost);
        auto const o = simulate(one_f_one_b(p, m), cost);
        CHECK(g.bubble_fraction == exact(expected));
        CHECK(o.bubble_fraction == exact(expected));
        double const step = cost.forward[0] + cost.backward_input[0] + cost.backward_weight[0];
        CHECK(o.makespan == exact(step * (m + p - 1)));
        CHECK(o.bubble_time == exact(step * (p - 1)));
        for (double b : o.busy)
          CHECK(b == exact(step * m));
        CHECK(o.peak_activations[0] == std::min(m, p));
        CHECK(g.peak_activations == std::vector<int>(p, m));
      }
}

TEST_CASE("simulate: interleaved 1F1B bubble / ideal is (p-1)/(v*m) for m >= p", "[schedule]") {
  for (int p : ps)
    for (int m : ms)
      for (int v = 1; v <= 4; ++v) {
        INFO("p=" << p << " m=" << m << " v=" << v);
        auto const r = simulate(interleaved_1f1b(p, m, v), CostModel::uniform(1, 1, 1));
        CHECK(r.ideal == exact(3.0 * v * m));
        if (m >= p) {
          CHECK(r.bubble_ratio == exact(double(p - 1) / (v * m)));
          CHECK(r.bubble_fraction == exact(double(p - 1) / (v * m + p - 1)));
        } else {
          // A chunk's next round waits for its first micro-batch to cross all p ranks.
          CHECK(r.bubble_ratio == exact(double((p - 1) + (v - 1) * (p - m)) / (v * m)));
        }
      }
  // v = 1 is plain 1F1B.
  CHECK(simulate(interleaved_1f1b(4, 8, 1)).makespan == simulate(one_f_one_b(4, 8)).makespan);
}

TEST_CASE("simulate: ZB-H1 bubble is a third of 1F1B's when F = B = W", "[schedule]") {
  // The paper's (p-1)(T_F + T_B - T_W), which this order reaches while T_W <= T_F.
  for (int p : ps)
    for (int m : ms)
      for (auto const& c : {CostModel::uniform(1, 1, 0.5), CostModel::uniform(2, 1, 1),
                            CostModel::uniform(1, 2, 1)}) {
        if (m < p)
          continue;
        double const f = c.forward[0], b = c.backward_input[0], w = c.backward_weight[0];
        INFO("p=" << p << " m=" << m << " F,B,W=" << f << "," << b << "," << w);
        CHECK(simulate(zb_h1(p, m), c).bubble_time == exact((p - 1) * (f + b - w)));
      }
  for (double t : {1.0, 2.5})
    for (int p : ps)
      for (int m : ms) {
        if (m < p)
          continue;
        INFO("p=" << p << " m=" << m << " T=" << t);
        auto const cost = CostModel::uniform(t, t, t);
        auto const zb = simulate(zb_h1(p, m), cost);
        auto const base = simulate(one_f_one_b(p, m), cost);
        CHECK(3.0 * zb.bubble_time == exact(base.bubble_time));
        CHECK(zb.bubble_time == exact(t * (p - 1)));
        CHECK(zb.makespan == exact(t * (3 * m + p - 1)));
        CHECK(*std::max_element(zb.peak_activations.begin(), zb.peak_activations.end()) ==
              *std::max_element(base.peak_activations.begin(), base.peak_activations.end()));
      }
}

TEST_CASE("simulate: ZB-H2 has zero bubble once m >= 2p-1", "[schedule]") {
  for (int p : ps)
    for (int m : ms) {
      INFO("p=" << p << " m=" << m);
      auto const r = simulate(zb_h2(p, m), CostModel::uniform(1, 1, 1));
      CHECK(*std::max_element(r.peak_activations.begin(), r.peak_activations.end()) <= 2 * p - 1);
      if (m >= 2 * p - 1) {
        CHECK(r.period_bubble_fraction == exact(0.0));
        CHECK(r.period == exact(3.0 * m));
        for (double s : r.span)
          CHECK(s == exact(3.0 * m)); // each rank busy from its first op to its last
        CHECK(r.makespan == exact(3.0 * m + p - 1));
      } else {
        CHECK(r.period == exact(3.0 * m + (2 * p - 1 - m)));
        CHECK(r.period_bubble_fraction > 0.0);
      }
    }
  // Below the bound the bubble is real: p = 4 needs m >= 7.
  CHECK(simulate(zb_h2(4, 6)).period_bubble_fraction > 0.0);
  CHECK(simulate(zb_h2(4, 7)).period_bubble_fraction == exact(0.0));
}

TEST_CASE("simulate: alpha-beta messages, timeline in list order", "[schedule]") {
  CostModel cost = CostModel::uniform(1, 1, 1);
  cost.alpha = 0.5;
  cost.beta = 0.001;
  cost.activation_bytes = 1000;
  cost.grad_bytes = 2000;
  auto const r = simulate(gpipe(2, 1), cost);
  // rank 0: F [0,1], send at 1 arrives 2.5; rank 1: wait to 2.5, F [2.5,3.5], B [3.5,5.5],
  // gradient sent at 5.5 arrives 8; rank 0: wait [1,8], B [8,10].
  CHECK(r.makespan == exact(10.0));
  CHECK(r.busy == std::vector<double>{3.0, 3.0});
  CHECK(r.bubble_fraction == exact(0.7));
  REQUIRE(r.timeline.events.size() == 10);
  auto find = [&](int rank, Op op) {
    return *std::find_if(r.timeline.events.begin(), r.timeline.events.end(),
                         [&](Event const& e) { return e.rank == rank && e.op == op; });
  };
  CHECK(find(1, Op::RecvActivation).end == exact(2.5));
  CHECK(find(1, Op::Forward).start == exact(2.5));
  CHECK(find(1, Op::SendGrad).start == exact(5.5));
  CHECK(find(1, Op::SendGrad).duration() == exact(0.0));
  CHECK(find(0, Op::RecvGrad).start == exact(1.0));
  CHECK(find(0, Op::RecvGrad).end == exact(8.0));
  CHECK(find(0, Op::Backward).end == exact(10.0));

  // Per rank, events follow the list, back to back, none overlapping.
  auto const s = interleaved_1f1b(3, 6, 2);
  auto const t = simulate(s, cost);
  REQUIRE(t.timeline.events.size() == [&] {
    std::size_t n = 0;
    for (auto const& l : s.ranks)
      n += l.size();
    return n;
  }());
  for (int rank = 0; rank < 3; ++rank) {
    std::size_t i = 0;
    double clock = 0.0;
    for (auto const& e : t.timeline.events) {
      if (e.rank != rank)
        continue;
      CHECK(e.op == s.ranks[rank][i].op);
      CHECK(e.microbatch == s.ranks[rank][i].microbatch);
      CHECK(e.start == exact(clock));
      CHECK(e.end >= e.start);
      clock = e.end;
      ++i;
    }
  }
}

TEST_CASE("simulate: per-message overheads", "[schedule]") {
  CostModel cost = CostModel::uniform(1, 1, 1);
  cost.alpha = 0.5;
  cost.send_overhead = 0.25;
  cost.recv_overhead = 0.125;
  auto const r = simulate(gpipe(2, 1), cost);
  // rank 0: F [0,1], send [1,1.25] arrives 1.75; rank 1: receive [0,1.875], F [1.875,2.875],
  // B [2.875,4.875], send [4.875,5.125] arrives 5.625; rank 0: receive [1.25,5.75], B [5.75,7.75].
  CHECK(r.makespan == exact(7.75));
  CHECK(r.busy == std::vector<double>{3.0, 3.0});
  auto find = [&](int rank, Op op) {
    return *std::find_if(r.timeline.events.begin(), r.timeline.events.end(),
                         [&](Event const& e) { return e.rank == rank && e.op == op; });
  };
  CHECK(find(0, Op::SendActivation).duration() == exact(0.25));
  CHECK(find(1, Op::RecvActivation).end == exact(1.875));
  CHECK(find(1, Op::SendGrad).end == exact(5.125));
  CHECK(find(0, Op::RecvGrad).start == exact(1.25));
  CHECK(find(0, Op::RecvGrad).end == exact(5.75));
  // A receive whose data is there still costs its overhead: with p = 1 there are no messages,
  // so overheads change nothing.
  CHECK(simulate(gpipe(1, 3), cost).makespan == exact(9.0));
  cost.recv_overhead = -1;
  CHECK_THROWS_AS(simulate(gpipe(2, 1), cost), std::invalid_argument);
}

TEST_CASE("simulate: per-virtual-stage costs", "[schedule]") {
  CostModel cost;
  cost.forward = {1.0, 3.0};
  cost.backward_input = {1.0};
  cost.backward_weight = {1.0};
  auto const r = simulate(gpipe(2, 2), cost);
  CHECK(r.makespan == exact(13.0));
  CHECK(r.busy == std::vector<double>{6.0, 10.0});
  CHECK(r.ideal == exact(10.0));
  CHECK(r.bubble_ratio == exact(0.3));

  cost.forward = {1.0, 2.0, 3.0};
  CHECK_THROWS_WITH(simulate(gpipe(2, 2), cost),
                    ContainsSubstring("CostModel::forward has 3 entries; expected 1 or 2"));
  cost.forward = {-1.0};
  CHECK_THROWS_AS(simulate(gpipe(2, 2), cost), std::invalid_argument);
}

TEST_CASE("simulate: rejects invalid schedules", "[schedule]") {
  auto s = one_f_one_b(2, 2);
  s.ranks[1].pop_back();
  CHECK_THROWS_AS(simulate(s), ScheduleError);
  CHECK_THROWS_WITH(simulate(s), ContainsSubstring("missing OptimizerStep"));
}

TEST_CASE("timeline: statistics of a measured run", "[schedule]") {
  // Times as an executor would record them (absolute clock, not starting at 0).
  Timeline tl;
  tl.name = "measured";
  tl.ranks = 2;
  tl.events = {
      {0, Op::Forward, 0, 0, 100.0, 101.0},         {0, Op::SendActivation, 0, 0, 101.0, 101.0},
      {1, Op::RecvActivation, 0, 0, 100.0, 101.25}, {1, Op::Forward, 0, 0, 101.25, 102.0},
      {1, Op::Backward, 0, 0, 102.0, 103.75},       {0, Op::RecvGrad, 0, 0, 101.0, 103.75},
      {0, Op::Backward, 0, 0, 103.75, 105.75}};
  auto const st = analyze(tl);
  CHECK(st.start == exact(100.0));
  CHECK(st.makespan == exact(5.75));
  CHECK(st.busy == std::vector<double>{3.0, 2.5});
  CHECK(st.span == std::vector<double>{5.75, 2.5});
  CHECK(st.ideal == exact(3.0));
  CHECK(st.bubble_fraction == exact(1.0 - 5.5 / 11.5));
  CHECK(st.period == exact(5.75));
  CHECK(analyze(Timeline{}).makespan == 0.0);
}
