// Example 01's training: the model, the strategy type per ZeRO stage, and
// the dispatch from flags to types. Included only by the train_<optimizer>.cpp
// files, each of which instantiates train_model for one optimizer.
#pragma once
#include "fashion_mnist.hpp"

#include <telar/telar.hpp>

#include <cstdio>
#include <optional>
#include <string>
#include <utility>

namespace fashion_mnist {

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

} // namespace fashion_mnist
