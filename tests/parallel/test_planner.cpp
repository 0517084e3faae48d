// The planner without a Trainer: a machine profile survives its JSON,
// predicted step times grow with the work, every layout of a world is either
// ranked or refused with a reason, and a budget refuses what does not fit.
#include "support.hpp"

#include <telar/core/recompute.hpp>
#include <telar/layers/activation.hpp>
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
  for (std::size_t i = 1; i < plan.ranked.size(); ++i)
    CHECK(plan.ranked[i - 1].predicted_step_ms <= plan.ranked[i].predicted_step_ms);
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
  CHECK(plan.best().reason.find("fastest") == 0);
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
