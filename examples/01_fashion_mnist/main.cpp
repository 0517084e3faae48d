// Example 01: an MLP on Fashion-MNIST, serial or under any composition of
// data, pipeline and tensor parallelism.
//
//   fashion_mnist [--epochs 3] [--batch 64] [--lr 1e-3] [--optimizer adamw]
//                 [--seed 1] [--hidden 256] [--data DIR] [--json]
//                 [--dp N] [--pp N] [--tp N] [--schedule 1f1b] [--microbatches M]
//                 [--nonfinite stop|skip] [--zero 0|1|2|3] [--timeline PREFIX] [--limit-steps N]
//                 [--recompute none|full] [--memory-budget SIZE]
//                 [--checkpoint-dir DIR] [--checkpoint-every N] [--resume]
//                 [--precision fp32|bf16] [--layout auto|manual] [--dry-run] [--profile PATH]
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
// docs/precision.md). To keep this file's compile time, it comes with the
// default strategy set only (--zero 0, --recompute none).
#include <telar/telar.hpp> // one include for all of Telar

#include "layout_planning.hpp"

#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace {

struct Args : example::CommonArgs {
  Args() : CommonArgs(/*epochs*/ 3, /*hidden*/ 256) { takes_precision = true; }
  int zero = 0; // ZeRO stage
  std::string recompute = "none";
};

[[noreturn]] void usage(char const* why) {
  std::fprintf(
      stderr,
      "fashion_mnist: %s\n"
      "usage: fashion_mnist [--epochs N] [--batch N] [--lr X] "
      "[--optimizer sgd|momentum|adam|adamw|lamb] [--seed N] [--hidden N] [--data DIR] "
      "[--json] [--dp N] [--pp N] [--tp N] "
      "[--schedule %s] [--microbatches M] [--nonfinite stop|skip] [--zero 0|1|2|3] "
      "[--timeline PREFIX] [--limit-steps N] [--recompute none|full] [--memory-budget SIZE] "
      "[--checkpoint-dir DIR] [--checkpoint-every N] [--resume] [--precision fp32|bf16] "
      "[--layout auto|manual] [--dry-run] [--profile PATH]\n",
      why, example::schedule_choices().c_str());
  throw 2;
}

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
  example::check_bf16_unplanned(a, usage);
  return a;
}

using T = float;
using R = telar::ReLU<T>;
// The first two layers form a Megatron pair under --tp (plain Dense at tp 1).
// Gemm: AutoGemm (fp32) or Bf16Gemm (--precision bf16).
template <class Gemm>
using ModelWith =
    telar::Sequential<telar::ColumnParallel<telar::Dense<T, telar::DefaultMemorySpace, Gemm>>, R,
                      telar::RowParallel<telar::Dense<T, telar::DefaultMemorySpace, Gemm>>, R,
                      telar::Dense<T, telar::DefaultMemorySpace, Gemm>>;
using Model = ModelWith<telar::AutoGemm>;
// One strategy type per ZeRO stage: degrees left at 1 cost nothing.
template <int Stage>
struct ShardingFor {
  using type = telar::ZeRO<Stage>;
};
template <>
struct ShardingFor<0> {
  using type = telar::NoSharding;
};
template <int Stage>
using StrategyFor =
    telar::Strategy<telar::DataParallel<telar::RingAllreduce, typename ShardingFor<Stage>::type>,
                    telar::PipelineParallel<telar::OneFOneB>, telar::TensorParallel<>>;

template <class Gemm = telar::AutoGemm>
ModelWith<Gemm> make_model(std::size_t hidden) {
  using D = telar::Dense<T, telar::DefaultMemorySpace, Gemm>;
  return ModelWith<Gemm>(telar::ColumnParallel<D>(784, hidden), {},
                         telar::RowParallel<D>(hidden, hidden), {}, D(hidden, 10));
}

template <class Strategy, class ModelT, class Optimizer>
int train(MPI_Comm comm, Args const& a, ModelT model, Optimizer opt,
          std::optional<telar::LayoutPlan> const& plan) {
  telar::FashionMnist data = telar::load_fashion_mnist(a.data);
  telar::TrainerOptions const opts = example::trainer_options(a, data.train.size, comm);
  ModelT const fresh = model; // the cost model's copy
  auto trainer = example::with_fastest_fitting(plan, [&] {
    return telar::Trainer<ModelT, Strategy, Optimizer>(comm, std::move(model), opt, opts, 784);
  });
  double const predicted = example::predicted_step_ms(comm, a, fresh, trainer, 784);
  std::size_t const local = example::local_batch(a, trainer.grid_shape().dp, "fashion_mnist");
  if (trainer.rank() == 0)
    std::fprintf(stderr,
                 "fashion_mnist: %zu train / %zu test samples, MLP 784-%zu-%zu-10, %s, "
                 "layout %s, schedule %s, %d micro-batches, global batch %zu, gemm %s, "
                 "recompute %s, precision %s\n",
                 data.train.size, data.test.size, a.hidden, a.hidden, Optimizer::name(),
                 trainer.layout().c_str(), trainer.pipeline_schedule().name.c_str(),
                 opts.microbatches, a.batch, example::gemm_name(a.precision), a.recompute.c_str(),
                 a.precision.c_str());

  auto test_set = example::test_set(data.test, data.test.size);
  example::Result r = example::fit(trainer, a, data, test_set, local);
  r.predicted_ms = predicted;
  example::write_timeline(trainer, a.timeline, "fashion_mnist");
  telar::JsonObject config = example::common_config(trainer, a);
  config.add("zero", a.zero)
      .add("recompute", a.recompute)
      .add("gemm", example::gemm_name(a.precision));
  example::report(trainer, a, r, config);
  return 0;
}

// --zero: the strategy type of the stage.
template <class ModelT, class Optimizer>
int train_zero(MPI_Comm comm, Args const& a, ModelT model, Optimizer opt,
               std::optional<telar::LayoutPlan> const& plan) {
  if (a.zero == 1)
    return train<StrategyFor<1>>(comm, a, std::move(model), opt, plan);
  if (a.zero == 2)
    return train<StrategyFor<2>>(comm, a, std::move(model), opt, plan);
  if (a.zero == 3)
    return train<StrategyFor<3>>(comm, a, std::move(model), opt, plan);
  return train<StrategyFor<0>>(comm, a, std::move(model), opt, plan);
}

// The layouts of `model` under every ZeRO stage (the strategy types
// train_zero runs), merged.
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

// --layout auto / --dry-run: the planner decides (ZeRO and recomputation
// too); --recompute full: every layer keeps only its input (telar::RecomputeAll).
template <class Optimizer>
int train_model(MPI_Comm comm, Args const& given, Optimizer opt) {
  Args a = given;
  std::optional<telar::LayoutPlan> plan;
  if (a.precision == "bf16") {
    if constexpr (telar::Bf16Gemm::supports<T, telar::DefaultMemorySpace>())
      return train<StrategyFor<0>>(comm, a, make_model<telar::Bf16Gemm>(a.hidden), opt, plan);
    else
      usage("--precision bf16 needs oneDNN and host memory (telar::Bf16Gemm)");
  }
  if (!example::plan_run(comm, a, plan, "fashion_mnist",
                         [&] { return plan_all<Optimizer>(comm, a); }))
    return 0;
  if (a.layout_auto) {
    a.zero = plan->best().zero_stage;
    a.recompute = plan->best().recompute ? "full" : "none";
  }
  if (a.recompute == "full")
    return train_zero(comm, a, telar::recompute_all(make_model(a.hidden)), opt, plan);
  return train_zero(comm, a, make_model(a.hidden), opt, plan);
}

int run(MPI_Comm comm, int argc, char** argv) {
  Args const a = parse(argc, argv);
  return example::with_optimizer<T>(a.optimizer, usage,
                                    [&](auto opt) { return train_model(comm, a, opt); });
}

} // namespace

int main(int argc, char** argv) {
  return example::run_main(argc, argv, "fashion_mnist", run);
}
