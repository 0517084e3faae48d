// The planner without a Trainer: a machine profile survives its JSON,
// predicted step times grow with the work, every layout of a world is either
// ranked or refused with a reason, and a budget refuses what does not fit.
#include "support.hpp"

#include <telar/core/recompute.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/batch_norm.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/adam.hpp>
#include <telar/parallel/calibrate.hpp>
#include <telar/parallel/planner.hpp>

#include <catch2/catch_test_macros.hpp>

namespace {

using T = float;
using D = telar::Dense<T>;
using R = telar::ReLU<T>;
using Col = telar::ColumnParallel<D>;
using Row = telar::RowParallel<D>;
using Model = telar::Sequential<Col, R, Row, R, D>;
using Plain = telar::Strategy<telar::DataParallel<telar::RingAllreduce>,
                              telar::PipelineParallel<telar::OneFOneB>, telar::TensorParallel<>>;
using Zero1 = telar::Strategy<telar::DataParallel<telar::RingAllreduce, telar::ZeRO<1>>,
                              telar::PipelineParallel<telar::OneFOneB>, telar::TensorParallel<>>;
using Opt = telar::AdamW<T>;

Model mlp(std::size_t h) {
  return Model(Col(784, h), {}, Row(h, h), {}, D(h, 10));
}

telar::LayoutOptions options(std::size_t batch) {
  telar::LayoutOptions o;
  o.batch_size = batch;
  return o;
}

} // namespace

TEST_CASE("planner: a machine profile round-trips through JSON", "[planner]") {
  telar::MachineProfile p;
  p.name = "test \"box\"";
  p.cores = 8;
  p.gemm_gflops_256 = 42.5;
  p.allreduce.alpha = 12e-6;
  p.send_recv.beta = 0.25e-9;
  auto const q = telar::MachineProfile::from_json(p.to_json());
  CHECK(q.name == p.name);
  CHECK(q.cores == 8);
  CHECK(q.gemm_gflops_256 == 42.5);
  CHECK(std::abs(q.allreduce.alpha - 12e-6) < 1e-12);
  CHECK(std::abs(q.send_recv.beta - 0.25e-9) < 1e-15);
  CHECK_THROWS_AS(telar::MachineProfile::from_json("{\"gemm_gflop\":3}"), telar::Error);
  CHECK(p.gemm_gflops(2.0 * 64 * 64 * 64) == p.gemm_gflops_64);
}

TEST_CASE("planner: predicted step time grows with the model and the batch", "[planner]") {
  telar::MachineProfile const prof;
  auto const small = telar::predict_step<Model, Plain, Opt>(mlp(64), options(64), 784, 1, prof);
  auto const wide = telar::predict_step<Model, Plain, Opt>(mlp(512), options(64), 784, 1, prof);
  auto const big = telar::predict_step<Model, Plain, Opt>(mlp(64), options(256), 784, 1, prof);
  CHECK(small.step_ms > 0);
  CHECK(wide.step_ms > small.step_ms);
  CHECK(big.step_ms > small.step_ms);
  CHECK(small.dp_comm_ms == 0);
  auto r = telar::predict_step<telar::RecomputeAll<Model>, Plain, Opt>(
      telar::recompute_all(mlp(64)), options(64), 784, 1, prof);
  CHECK(r.recompute_ms > 0);
  CHECK(r.step_ms > small.step_ms);
}

TEST_CASE("planner: every layout ranked or refused, fastest first", "[planner]") {
  telar::MachineProfile const prof;
  auto plan = telar::plan_layout<Model, Plain, Opt>(mlp(128), options(64), 784, 4, prof);
  plan.merge(telar::plan_layout<Model, Zero1, Opt>(mlp(128), options(64), 784, 4, prof));
  REQUIRE(plan.ranked.size() > 4);
  // Fastest first, but plain dp within the margin of the fastest goes first.
  for (std::size_t i = 2; i < plan.ranked.size(); ++i)
    CHECK(plan.ranked[i - 1].predicted_step_ms <= plan.ranked[i].predicted_step_ms);
  bool const plain_first = telar::detail::is_plain_dp(plan.best());
  CHECK((plain_first || plan.ranked[0].predicted_step_ms <= plan.ranked[1].predicted_step_ms));
  CHECK(plan.best().predicted_step_ms <=
        (1 + plan.plain_dp_margin) * plan.ranked[1].predicted_step_ms + 1e-9);
  bool zero1 = false, tp = false, pp = false;
  for (auto const& c : plan.ranked) {
    CHECK(!c.reason.empty());
    CHECK(c.memory_bytes > 0);
    CHECK(c.grid.dp * c.grid.pp * c.grid.tp == 4);
    zero1 = zero1 || c.zero_stage == 1;
    tp = tp || c.grid.tp > 1;
    pp = pp || c.grid.pp > 1;
  }
  CHECK(zero1);
  CHECK(tp);
  CHECK(pp);
  CHECK(plan.best().reason.find(plain_first ? "plain data parallelism" : "fastest") == 0);
  CHECK(plan.json().find("\"ranked\":[{") != std::string::npos);

  // A budget between the smallest and the largest layout refuses some, with why.
  std::size_t lo = plan.ranked.front().memory_bytes, hi = lo;
  for (auto const& c : plan.ranked) {
    lo = std::min(lo, c.memory_bytes);
    hi = std::max(hi, c.memory_bytes);
  }
  REQUIRE(lo < hi);
  telar::PlannerOptions search;
  search.memory_budget = (lo + hi) / 2;
  auto const tight =
      telar::plan_layout<Model, Plain, Opt>(mlp(128), options(64), 784, 4, prof, search);
  REQUIRE(!tight.refused.empty());
  for (auto const& c : tight.ranked)
    CHECK(c.memory_bytes <= search.memory_budget);
  bool over = false;
  for (auto const& c : tight.refused)
    over = over || c.reason.find("budget") != std::string::npos;
  CHECK(over);
}

TEST_CASE("planner: the calibration cache interpolates in rows and survives JSON", "[planner]") {
  telar::MachineProfile p;
  std::string const g = telar::MachineProfile::layer_group("Dense", "[784]", "[64]", 2);
  CHECK(!p.layer_timing(g, 16));
  p.layer_times[g][8] = {1e-4, 2e-4, 3e-4};
  // One size: proportional in rows.
  CHECK(std::abs(p.layer_timing(g, 16)->forward - 2e-4) < 1e-12);
  p.layer_times[g][32] = {4e-4, 5e-4, 6e-4};
  auto const mid = p.layer_timing(g, 16); // a third of the way from 8 to 32
  REQUIRE(mid);
  CHECK(std::abs(mid->forward - 2e-4) < 1e-12);
  CHECK(std::abs(mid->backward_input - 3e-4) < 1e-12);
  CHECK(std::abs(mid->backward_weight - 4e-4) < 1e-12);
  CHECK(std::abs(p.layer_timing(g, 64)->forward - 8e-4) < 1e-12); // beyond: the same line
  CHECK(p.layer_timing(g, 4)->forward >= 0.5e-4 - 1e-12);         // below: >= a share of 8 rows
  CHECK(p.layer_timing(g, 8)->backward_weight == 3e-4);
  CHECK(!p.layer_timing(telar::MachineProfile::layer_group("Dense", "[784]", "[64]", 1), 8));

  // A size measured while descheduled is capped by its neighbours: by a
  // larger size's time, and by a smaller size's time times the row ratio.
  std::string const h = telar::MachineProfile::layer_group("Dense", "[784]", "[1024]", 1);
  p.layer_times[h][64] = {1e-3, 1e-3, 1e-3};
  p.layer_times[h][128] = {2e-3, 42e-3, 6e-3};
  p.layer_times[h][256] = {3e-3, 36e-3, 4e-3};
  auto const capped = p.layer_timing(h, 128);
  CHECK(std::abs(capped->forward - 2e-3) < 1e-12);         // consistent: kept
  CHECK(std::abs(capped->backward_input - 2e-3) < 1e-12);  // 2 x the 64 rows' time
  CHECK(std::abs(capped->backward_weight - 2e-3) < 1e-12); // 2 x 64 rows, below 256 rows' 4 ms
  CHECK(std::abs(p.layer_timing(h, 96)->backward_input - 1.5e-3) < 1e-12); // between capped sizes

  p.step_overhead_us = 120;
  p.shared_slowdown = 1.3;
  auto const q = telar::MachineProfile::from_json(p.to_json());
  REQUIRE(q.layer_times.count(g) == 1);
  CHECK(q.layer_times.at(g).size() == 2);
  CHECK(std::abs(q.layer_timing(g, 16)->backward_input - 3e-4) < 1e-12);
  CHECK(q.step_overhead_us == 120);
  CHECK(q.shared_slowdown == 1.3);
  CHECK_THROWS_AS(telar::MachineProfile::from_json("{\"time Dense r8\":\"1 2\"}"), telar::Error);

  CHECK(telar::planned_rows(64, 2) == std::vector<std::size_t>{4, 8, 16, 32, 64});
}

TEST_CASE("planner: calibrated layers are what predict_step uses", "[planner]") {
  telar::MachineProfile prof;
  auto const rows = telar::planned_rows(64, 1);
  // The two ReLUs of one width share a group: 4 groups.
  CHECK(telar::calibrate_layers(mlp(64), 784, rows, prof, 1) == 4 * rows.size());
  CHECK(telar::calibrate_layers(mlp(64), 784, rows, prof, 1) == 0); // cached
  // A recomputed model shares the plain one's groups.
  CHECK(telar::calibrate_layers(telar::recompute_all(mlp(64)), 784, rows, prof, 1) == 0);
  auto const measured = telar::predict_step<Model, Plain, Opt>(mlp(64), options(64), 784, 1, prof);
  CHECK(measured.measured_layers == 5);
  CHECK(measured.layers == 5);
  // Scaling every measured time scales the compute.
  telar::MachineProfile slow = prof;
  for (auto& [group, sizes] : slow.layer_times)
    for (auto& [r, t] : sizes)
      t = {10 * t.forward + 1e-3, 10 * t.backward_input + 1e-3, 10 * t.backward_weight + 1e-3};
  auto const slower = telar::predict_step<Model, Plain, Opt>(mlp(64), options(64), 784, 1, slow);
  CHECK(slower.compute_ms > measured.compute_ms);
  // Fixed costs add per step and per micro-batch.
  slow.step_overhead_us = 1000;
  slow.microbatch_overhead_us = 100;
  telar::LayoutOptions o = options(64);
  o.microbatches = 4;
  auto const fixed = telar::predict_step<Model, Plain, Opt>(mlp(64), o, 784, 1, slow);
  CHECK(std::abs(fixed.fixed_ms - 1.4) < 1e-9);
  CHECK(telar::calibrate_loss<telar::SoftmaxCrossEntropy<T>>(telar::Shape{10}, rows, prof, 1) ==
        rows.size());
}

// The overlap and sharing assumptions of docs/planner.md, one by one.

TEST_CASE("planner: a rank with a core of its own waits for no peer", "[planner]") {
  telar::MachineProfile prof;
  prof.cores = 2;
  prof.sync_wait_us = 12000; // the probe's record of its load: not charged
  auto const dp2 = [&] {
    telar::LayoutOptions o = options(64);
    o.grid = {2, 1, 1};
    return telar::predict_step<Model, Plain, Opt>(mlp(64), o, 784, 2, prof);
  };
  auto const alone = dp2();
  CHECK(alone.sync_points >= 2);
  CHECK(alone.sync_wait_ms == 0);
  CHECK(alone.contention == 1);
  CHECK(alone.step_ms < 12);
  // Measured at the start of a run: a fifth of a core each (other work).
  prof.cpu_share = 0.2;
  prof.slice_us = 2000;
  prof.descheduled_us = 4000;
  auto const loaded = dp2();
  CHECK(std::abs(loaded.contention - 5) < 1e-12);
  CHECK(loaded.sync_wait_ms > 0);
  CHECK(std::abs(loaded.compute_ms - 5 * alone.compute_ms) < 1e-9 * alone.compute_ms + 1e-12);
}

TEST_CASE("planner: 4 ranks on 2 cores compute at half speed", "[planner]") {
  telar::MachineProfile four, two;
  four.cores = 4;
  two.cores = 2;
  telar::LayoutOptions o = options(64);
  o.grid = {4, 1, 1};
  auto const own = telar::predict_step<Model, Plain, Opt>(mlp(64), o, 784, 4, four);
  auto const shared = telar::predict_step<Model, Plain, Opt>(mlp(64), o, 784, 4, two);
  CHECK(own.contention == 1);
  CHECK(own.sync_wait_ms == 0);
  CHECK(shared.contention == 2);
  // Compute and the messages inside it (CPU copies on shared memory) at half speed.
  CHECK(std::abs(shared.compute_ms / own.compute_ms - 2) < 1e-9);
  CHECK(shared.optimizer_ms > 1.9 * own.optimizer_ms);
  CHECK(shared.sync_wait_ms > 0); // peers descheduled behind each other
}

TEST_CASE("planner: hand-offs closer than a time slice wait once, unless ranks outnumber cores",
          "[planner]") {
  telar::MachineProfile prof;
  prof.cores = 2;
  prof.slice_us = 3000;
  prof.descheduled_us = 1500;
  using telar::detail::scheduling_wait;
  double const one = scheduling_wait(prof, 2, 1, 1e-3, 0.5);
  CHECK(one == 0.5 * 1.5e-3); // P(receiver descheduled) x the rest of its gap
  // 2 ranks, 2 cores (the share lost to other work): 100 hand-offs in a
  // 1 ms step lie within one slice, hardly more than one wait.
  CHECK(scheduling_wait(prof, 2, 100, 1e-3, 0.5) < 1.5 * one);
  // The same 100 spread over 30 ms: 11 slices, 11 waits.
  CHECK(std::abs(scheduling_wait(prof, 2, 100, 30e-3, 0.5) - 11 * one) < 1e-12);
  // 4 ranks on 2 cores never all run at once: every hand-off may wait, for
  // a whole gap of slice (1/share - 1) (the receiver went off spinning).
  CHECK(std::abs(scheduling_wait(prof, 4, 100, 1e-3, 0.5) - 100 * 0.5 * 3e-3) < 1e-12);
  CHECK(scheduling_wait(prof, 4, 1, 1e-3, 0.5) > one);
  CHECK(scheduling_wait(prof, 2, 1, 1e-3, 1.0) == 0);
  CHECK(scheduling_wait(prof, 1, 5, 1e-3, 0.5) == 0);
  // Not measured: round robin, the rest of a gap is half of slice (1/share - 1).
  telar::MachineProfile rr;
  rr.cores = 2;
  rr.slice_us = 3000;
  CHECK(std::abs(scheduling_wait(rr, 2, 1, 1e-3, 0.25) - 0.75 * 0.5 * 3e-3 * 3) < 1e-12);
  CHECK(telar::detail::ring_hops(4) == 6);
}

TEST_CASE("planner: the dp reduction hides behind backward by the overlap fraction", "[planner]") {
  telar::MachineProfile prof;
  prof.cores = 2;
  telar::LayoutOptions o = options(64);
  o.grid = {2, 1, 1};
  o.bucket_bytes = 4096; // many buckets
  prof.overlap = 0;
  auto const none = telar::predict_step<Model, Plain, Opt>(mlp(128), o, 784, 2, prof);
  CHECK(none.dp_comm_ms > 0);
  CHECK(std::abs(none.dp_exposed_ms - none.dp_comm_ms) < 1e-12);
  prof.overlap = 1;
  auto const all = telar::predict_step<Model, Plain, Opt>(mlp(128), o, 784, 2, prof);
  CHECK(all.dp_exposed_ms < none.dp_exposed_ms);
  CHECK(all.dp_exposed_ms > 0); // the last bucket never hides
  CHECK(all.step_ms < none.step_ms);
}

TEST_CASE("planner: pipeline bubbles shrink with micro-batches", "[planner]") {
  telar::MachineProfile const prof;
  telar::LayoutOptions o = options(64);
  o.grid = {1, 2, 1};
  o.schedule = "gpipe";
  auto const one = telar::predict_step<Model, Plain, Opt>(mlp(256), o, 784, 2, prof);
  o.microbatches = 8;
  auto const eight = telar::predict_step<Model, Plain, Opt>(mlp(256), o, 784, 2, prof);
  CHECK(one.bubble_fraction > 0.3);
  CHECK(eight.bubble_fraction < one.bubble_fraction);
}

TEST_CASE("planner: plain dp is chosen when the model cannot tell it from the fastest",
          "[planner]") {
  telar::MachineProfile prof;
  prof.cores = 4;
  prof.allreduce.beta = 1e-6; // gradient allreduces slow: plain dp is not the fastest
  telar::PlannerOptions exact;
  exact.plain_dp_margin = 0;
  auto plan = telar::plan_layout<Model, Plain, Opt>(mlp(128), options(64), 784, 4, prof, exact);
  REQUIRE(plan.ranked.size() > 2);
  auto const plain = std::find_if(plan.ranked.begin(), plan.ranked.end(),
                                  [](auto const& c) { return telar::detail::is_plain_dp(c); });
  REQUIRE(plain != plan.ranked.end());
  REQUIRE(plain != plan.ranked.begin());
  double const fastest = plan.ranked.front().predicted_step_ms;
  CHECK(plan.best().predicted_step_ms == fastest);
  telar::PlannerOptions tolerant = exact;
  tolerant.plain_dp_margin = plain->predicted_step_ms / fastest - 1 + 1e-6;
  auto const tie =
      telar::plan_layout<Model, Plain, Opt>(mlp(128), options(64), 784, 4, prof, tolerant);
  CHECK(telar::detail::is_plain_dp(tie.best()));
  CHECK(tie.best().reason.find("plain data parallelism") == 0);
  // Merging ranks again, under the same rule.
  auto merged = tie;
  merged.merge(tie);
  CHECK(merged.plain_dp_margin == tolerant.plain_dp_margin);
  CHECK(telar::detail::is_plain_dp(merged.best()));
}

TEST_CASE("planner: the scheduler measurement is consistent and survives JSON", "[planner]") {
  auto const s = telar::measure_scheduling(0.01);
  CHECK(s.cpu_share > 0);
  CHECK(s.cpu_share <= 1);
  CHECK(s.slice_us >= 0);
  if (s.cpu_share < 1) // descheduled at least once: it saw a gap
    CHECK(s.descheduled_us > 50.0 / 2);
  telar::MachineProfile p;
  p.cpu_share = 0.4;
  p.slice_us = 1500;
  p.descheduled_us = 2250;
  auto const q = telar::MachineProfile::from_json(p.to_json());
  CHECK(q.cpu_share == 0.4);
  CHECK(q.slice_us == 1500);
  CHECK(q.descheduled_us == 2250);
}

// A BatchNorm in training refuses micro-batches that give its statistics one
// value per channel (the Trainer refuses them before training): the planner
// lists those layouts as refused, with the Trainer's reason, instead of
// ranking one it would then pick. SyncStats counts every dp rank's samples.
TEST_CASE("planner: micro-batches a BatchNorm refuses are listed as refused and not ranked",
          "[planner]") {
  telar::MachineProfile const prof;
  auto const check = [&](auto model, bool sync) {
    using M = decltype(model);
    auto const plan = telar::plan_layout<M, Plain, Opt>(model, options(8), 16, 4, prof);
    REQUIRE(!plan.ranked.empty());
    bool one_sample_ranked = false;
    for (auto const& c : plan.ranked) {
      std::size_t const samples = 8 / std::size_t(c.grid.dp) / std::size_t(c.microbatches);
      one_sample_ranked = one_sample_ranked || (samples == 1 && c.grid.dp == 1);
      CHECK((samples > 1 || sync)); // LocalStats: one sample per micro-batch is refused
    }
    CHECK(!one_sample_ranked);
    bool why = false;
    for (auto const& c : plan.refused)
      why = why || (c.reason.find("micro-batches of 1 sample(s)") == 0 &&
                    c.reason.find("expected more than 1 value per channel") != std::string::npos);
    CHECK(why);
    CHECK(plan.table(100).find("expected more than 1 value per channel") != std::string::npos);
    return plan;
  };
  using Local = telar::Sequential<D, telar::BatchNorm<T>, R, D>;
  check(Local(D(16, 8), telar::BatchNorm<T>(8), {}, D(8, 4)), false);
  // dp = 4 with one sample per rank: 4 values per channel, accepted.
  using Sync =
      telar::Sequential<D, telar::BatchNorm<T, telar::DefaultMemorySpace, telar::SyncStats>, R, D>;
  auto const plan =
      check(Sync(D(16, 8), telar::BatchNorm<T, telar::DefaultMemorySpace, telar::SyncStats>(8), {},
                 D(8, 4)),
            true);
  bool dp4_one_sample = false;
  for (auto const& c : plan.ranked)
    dp4_one_sample = dp4_one_sample || (c.grid.dp == 4 && c.microbatches == 2);
  CHECK(dp4_one_sample);
}
