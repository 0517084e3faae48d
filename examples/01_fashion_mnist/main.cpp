// Example 01: an MLP on Fashion-MNIST, serial or under any composition of
// data, pipeline and tensor parallelism.
//
//   fashion_mnist [--epochs 3] [--batch 64] [--lr 1e-3] [--optimizer adamw]
//                 [--seed 1] [--hidden 256] [--data DIR] [--json]
//                 [--dp N] [--pp N] [--tp N] [--schedule 1f1b] [--microbatches M]
//                 [--nonfinite stop|skip] [--zero 0|1|2|3] [--timeline PREFIX] [--limit-steps N]
//                 [--recompute none|full] [--memory-budget SIZE]
//                 [--checkpoint-dir DIR] [--checkpoint-every N] [--resume]
//                 [--precision fp32|bf16] [--bf16-weight-copy 1|0] [--layout auto|manual]
//                 [--dry-run] [--profile PATH]
//   mpirun -np 2 fashion_mnist --dp 2
//   mpirun -np 2 fashion_mnist --layout auto
//
// --layout auto lets telar::plan_layout choose dp x pp x tp, the ZeRO stage,
// schedule, micro-batches and recomputation: the fastest predicted layout
// that fits --memory-budget (docs/planner.md); --dry-run prints the ranking
// and why the others were refused (JSON with --json) and trains nothing.
// --profile names the machine profile (default: the one telar_probe cached).
//
// --zero picks the data-parallel sharding: 0 none, 1 ZeRO-1 (optimizer
// state), 2 ZeRO-2 (optimizer state and gradients), 3 ZeRO-3 (and the
// parameters, gathered per micro-batch).
//
// --batch is the global batch; each data-parallel rank trains on batch/dp of
// it. Rank 0 shows progress; with --json it ends with one JSON line.
// --recompute full wraps every layer in telar::Recompute (activation
// recomputation: the same parameters and results, one more forward per step).
// --memory-budget 1.5GB refuses, before allocating, a layout whose memory
// plan needs more on some rank, naming a layout that fits; the summary (and
// the JSON's "memory" and "memory_plan") gives measured and planned peaks.
// --precision bf16 multiplies in bf16 with fp32 accumulation
// (telar::Bf16Gemm; fp32 weights, gradients and optimizer state; see
// docs/precision.md). To keep the compile time, it comes with the default
// strategy set only (--zero 0, --recompute none); --layout auto and
// --dry-run plan the bf16 model under that set (dp x pp x tp, schedule,
// micro-batches), timed in bf16.
//
// This file parses the flags and plans; the training itself (train.hpp) is
// compiled in one file per ZeRO stage and model (train_zero<k>[_recompute].cpp, see
// fashion_mnist.hpp).
#include <telar/telar.hpp> // one include for all of Telar

#include "fashion_mnist.hpp"

#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace fashion_mnist {

void usage(char const* why) {
  std::fprintf(
      stderr,
      "fashion_mnist: %s\n"
      "usage: fashion_mnist [--epochs N] [--batch N] [--lr X] "
      "[--optimizer sgd|momentum|adam|adamw|lamb] [--seed N] [--hidden N] [--data DIR] "
      "[--json] [--dp N] [--pp N] [--tp N] "
      "[--schedule %s] [--microbatches M] [--nonfinite stop|skip] [--zero 0|1|2|3] "
      "[--timeline PREFIX] [--limit-steps N] [--recompute none|full] [--memory-budget SIZE] "
      "[--checkpoint-dir DIR] [--checkpoint-every N] [--resume] [--precision fp32|bf16] "
      "[--bf16-weight-copy 1|0] "
      "[--layout auto|manual] [--dry-run] [--profile PATH]\n",
      why, example::schedule_choices().c_str());
  throw 2;
}

} // namespace fashion_mnist

namespace {

using namespace fashion_mnist;

// Any accepted spelling (zb_h1, ZB-H1, ...) becomes the canonical name.
std::string schedule_name(std::string const& v) {
  try {
    return telar::schedule::canonical_name(v);
  } catch (std::invalid_argument const& e) {
    usage(e.what());
  }
}

Args parse(int argc, char** argv) {
  Args a;
  example::ArgReader r(argc, argv, usage);
  while (r.next()) {
    std::string const& f = r.flag();
    if (f == "--schedule")
      a.schedule = schedule_name(r.value());
    else if (f == "--zero")
      a.zero = int(r.number());
    else if (f == "--recompute")
      a.recompute = r.value();
    else if (!example::read_common_flag(r, a))
      usage(("unknown flag " + f).c_str());
  }
  example::check_common(a, usage);
  if (a.zero < 0 || a.zero > 3)
    usage("--zero takes 0 (no sharding), 1 (ZeRO-1), 2 (ZeRO-2) or 3 (ZeRO-3)");
  if (a.recompute != "none" && a.recompute != "full")
    usage(("--recompute expects none or full, got '" + a.recompute + "'").c_str());
  if (a.precision == "bf16" && (a.zero != 0 || a.recompute != "none"))
    usage("--precision bf16 runs with --zero 0 and --recompute none");
  return a;
}

// The layouts of `model` under every ZeRO stage (the strategy types
// train_stage runs), merged.
template <class Optimizer, class ModelT, int... Stage>
telar::LayoutPlan plan_stages(MPI_Comm comm, Args const& a, ModelT const& model,
                              std::integer_sequence<int, Stage...>) {
  return example::merged(
      {example::plan_of<ModelT, StrategyFor<Stage>, Optimizer>(comm, a, model, 784)...});
}

// Every layout this example's types can run: each ZeRO stage, with and
// without recomputation.
template <class Optimizer>
telar::LayoutPlan plan_all(MPI_Comm comm, Args const& a) {
  using Stages = std::integer_sequence<int, 0, 1, 2, 3>;
  return example::merged(
      {plan_stages<Optimizer>(comm, a, make_model(a.hidden), Stages{}),
       plan_stages<Optimizer>(comm, a, telar::recompute_all(make_model(a.hidden)), Stages{})});
}

// Stage `Stage`'s file for --recompute.
template <int Stage>
int train_at(MPI_Comm comm, Args const& a, std::optional<telar::LayoutPlan> const& plan) {
  if (a.recompute == "full")
    return train_stage<Stage, true>(comm, a, plan);
  return train_stage<Stage, false>(comm, a, plan);
}

// --layout auto / --dry-run: the planner decides (ZeRO and recomputation
// too). --precision bf16 plans and trains stage 0 only (train_bf16.cpp).
int run(MPI_Comm comm, int argc, char** argv) {
  Args a = parse(argc, argv);
  if (a.precision == "bf16")
    return train_bf16(comm, a);
  std::optional<telar::LayoutPlan> plan;
  bool const train = example::with_optimizer<T>(a.optimizer, usage, [&](auto opt) {
    return int(example::plan_run(comm, a, plan, "fashion_mnist",
                                 [&] { return plan_all<decltype(opt)>(comm, a); }));
  });
  if (!train)
    return 0;
  if (a.layout_auto) {
    a.zero = plan->best().zero_stage;
    a.recompute = plan->best().recompute ? "full" : "none";
  }
  // --zero: the strategy type of the stage (one file each).
  switch (a.zero) {
  case 1:
    return train_at<1>(comm, a, plan);
  case 2:
    return train_at<2>(comm, a, plan);
  case 3:
    return train_at<3>(comm, a, plan);
  default:
    return train_at<0>(comm, a, plan);
  }
}

} // namespace

int main(int argc, char** argv) {
  return example::run_main(argc, argv, "fashion_mnist", run);
}
