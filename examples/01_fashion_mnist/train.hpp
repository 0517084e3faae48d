// Example 01's training under one ZeRO stage's strategy, for every optimizer
// and model variant. Included only by train_zero<k>[_recompute].cpp, each of
// which instantiates train_stage for one stage and model, and by train_bf16.cpp
// (fashion_mnist.hpp says why).
#pragma once
#include "fashion_mnist.hpp"

#include <telar/telar.hpp>

#include <cstdio>
#include <optional>
#include <string>
#include <utility>

namespace fashion_mnist {

template <class Strategy, class ModelT, class Optimizer>
int train(MPI_Comm comm, Args const& a, ModelT model, Optimizer opt,
          std::optional<telar::LayoutPlan> const& plan) {
  telar::TrainerOptions const opts =
      example::trainer_options(a, telar::fashion_mnist_train_size(a.data), comm);
  ModelT const fresh = model; // the cost model's copy
  auto trainer = example::with_fastest_fitting(plan, [&] {
    return telar::Trainer<ModelT, Strategy, Optimizer>(comm, std::move(model), opt, opts, 784);
  });
  example::Preflight const checked = example::preflight(trainer, a, "fashion_mnist");
  double const predicted = example::predicted_step_ms(comm, a, fresh, trainer, 784);
  telar::FashionMnist const data = telar::load_fashion_mnist(a.data);
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
  example::Result r = example::fit(trainer, a, checked, data, test_set);
  r.predicted_ms = predicted;
  example::write_timeline(trainer, a.timeline, "fashion_mnist");
  telar::JsonObject config = example::common_config(trainer, a);
  config.add("zero", a.zero)
      .add("recompute", a.recompute)
      .add("gemm", example::gemm_name(a.precision));
  example::report(trainer, a, r, config);
  return 0;
}

template <int Stage, bool Recompute>
int train_stage(MPI_Comm comm, Args const& a, std::optional<telar::LayoutPlan> const& plan) {
  using S = StrategyFor<Stage>;
  return example::with_optimizer<T>(a.optimizer, usage, [&](auto opt) {
    // --recompute full: every layer keeps only its input (telar::RecomputeAll).
    if constexpr (Recompute)
      return train<S>(comm, a, telar::recompute_all(make_model(a.hidden)), opt, plan);
    else
      return train<S>(comm, a, make_model(a.hidden), opt, plan);
  });
}

} // namespace fashion_mnist
