// Example 02: a small residual CNN on Fashion-MNIST (samples [1, 28, 28]),
// serial or under any composition of data, pipeline and tensor parallelism:
//
//   conv 3x3 1->32, ReLU, max-pool 2                    [32, 14, 14]
//   residual { conv 3x3 32->32, ReLU, conv 3x3 32->32 }, ReLU
//   conv 3x3 32->64, ReLU, max-pool 2, flatten          [64 * 7 * 7]
//   dense 3136->hidden, ReLU, dense hidden->10          (a Megatron pair under --tp)
//
//   cnn [--epochs 5] [--batch 64] [--lr 1e-3] [--optimizer adamw]
//       [--seed 1] [--hidden 128] [--data DIR] [--json]
//       [--dp N] [--pp N] [--tp N] [--schedule 1f1b] [--microbatches M]
//       [--timeline PREFIX] [--limit-steps N] [--eval-limit N]
//       [--checkpoint-dir DIR] [--checkpoint-every N] [--resume]
//       [--memory-budget SIZE] [--layout auto|manual] [--dry-run] [--profile PATH]
//       [--precision fp32|bf16] [--bf16-weight-copy 1|0]
//
// --precision bf16 adds telar::Precision<telar::bf16, float> to the strategy:
// the convolutions and Dense layers multiply in bf16 with fp32 accumulation,
// weights and AdamW state stay fp32 (docs/precision.md); with AdamW only (one
// more Trainer type), which --layout auto and --dry-run plan.
//
// --layout auto: the planner's fastest layout that fits; --dry-run: its
// ranking, no training (docs/planner.md).
// --eval-limit evaluates on the first N test images only (quick checks).
//   mpirun -np 2 cnn --dp 2
//
// --batch is the global batch; each data-parallel rank trains on batch/dp of
// it. Rank 0 shows progress; with --json it ends with one JSON line.
#include <telar/core/residual.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/parallel/tensor_parallel.hpp>

#include "layout_planning.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

namespace {

struct Args : example::CommonArgs {
  Args() : CommonArgs(/*epochs*/ 5, /*hidden*/ 128) { takes_precision = true; }
  long eval_limit = -1;
};

[[noreturn]] void usage(char const* why) {
  std::fprintf(stderr,
               "cnn: %s\n"
               "usage: cnn [--epochs N] [--batch N] [--lr X] "
               "[--optimizer sgd|momentum|adam|adamw|lamb] [--seed N] [--hidden N] [--data DIR] "
               "[--json] [--dp N] [--pp N] [--tp N] "
               "[--schedule gpipe|1f1b|interleaved|zb-h1|zb-h2] [--microbatches M] "
               "[--timeline PREFIX] [--limit-steps N] [--eval-limit N] "
               "[--checkpoint-dir DIR] [--checkpoint-every N] [--resume] "
               "[--memory-budget SIZE] [--layout auto|manual] [--dry-run] [--profile PATH] "
               "[--precision fp32|bf16] [--bf16-weight-copy 1|0]\n",
               why);
  throw 2;
}

Args parse(int argc, char** argv) {
  Args a;
  example::ArgReader r(argc, argv, usage);
  while (r.next()) {
    std::string const& f = r.flag();
    if (f == "--schedule")
      a.schedule = r.value(); // the trainer checks it
    else if (f == "--eval-limit")
      a.eval_limit = r.number();
    else if (!example::read_common_flag(r, a))
      usage(("unknown flag " + f).c_str());
  }
  example::check_common(a, usage);
  example::check_bf16_run(a, usage);
  return a;
}

using T = float;
using D = telar::Dense<T>;
using R = telar::ReLU<T>;
// The first two layers form a Megatron pair under --tp (plain Dense at tp 1).
using Col = telar::ColumnParallel<D>;
using Row = telar::RowParallel<D>;
using C = telar::Conv2D<T>;
using Pool = telar::MaxPool2D<T>;
using Block = telar::Residual<C, R, C>;
using Model = telar::Sequential<C, R, Pool, Block, R, C, R, Pool, telar::Flatten<T>, Col, R, Row>;
// One strategy type for every run: degrees left at 1 cost nothing.
using Strategy = telar::Strategy<telar::DataParallel<telar::RingAllreduce>,
                                 telar::PipelineParallel<telar::OneFOneB>, telar::TensorParallel<>>;

telar::Shape const image{1, 28, 28};

Model make_model(std::size_t hidden) {
  return Model(C(1, 32, 3, 1, 1), {}, Pool(2), Block(C(32, 32, 3, 1, 1), {}, C(32, 32, 3, 1, 1)),
               {}, C(32, 64, 3, 1, 1), {}, Pool(2), {}, Col(64 * 7 * 7, hidden), {},
               Row(hidden, 10));
}

// --layout auto / --dry-run / --memory-budget: the layouts of the strategy
// type this example runs (S: it, or it with bf16 compute, whose model is
// planned as the Trainer rebinds it).
template <class S, class Optimizer>
int train(MPI_Comm comm, Args const& given, Optimizer opt) {
  Args a = given;
  std::optional<telar::LayoutPlan> plan;
  if (!example::plan_run(comm, a, plan, "cnn", [&] {
        return example::plan_of<Model, S, Optimizer>(comm, a, make_model(a.hidden), image);
      }))
    return 0;
  telar::TrainerOptions const opts =
      example::trainer_options(a, telar::fashion_mnist_train_size(a.data), comm);
  auto trainer = example::with_fastest_fitting(plan, [&] {
    return telar::Trainer<Model, S, Optimizer>(comm, make_model(a.hidden), opt, opts, image);
  });
  example::Preflight const checked = example::preflight(trainer, a, "cnn");
  telar::FashionMnist const data = telar::load_fashion_mnist(a.data);
  if (trainer.rank() == 0)
    std::fprintf(stderr,
                 "cnn: %zu train / %zu test samples, CNN [1,28,28] 32-res32-64-%zu-10, %s, "
                 "layout %s, schedule %s, %d micro-batches, global batch %zu, gemm %s, conv %s, "
                 "precision %s\n",
                 data.train.size, data.test.size, a.hidden, Optimizer::name(),
                 trainer.layout().c_str(), trainer.pipeline_schedule().name.c_str(),
                 opts.microbatches, a.batch, example::gemm_name(a.precision),
                 example::conv_name(a.precision), a.precision.c_str());

  // --eval-limit: the first N test images only (quick checks).
  std::size_t const eval = a.eval_limit > 0
                               ? std::min<std::size_t>(data.test.size, std::size_t(a.eval_limit))
                               : data.test.size;
  auto test_set = example::test_set(data.test, eval);
  example::Result r = example::fit(trainer, a, checked, data, test_set);
  r.predicted_ms = example::predicted_step_ms(comm, a, make_model(a.hidden), trainer, image);
  example::write_timeline(trainer, a.timeline, "cnn");
  telar::JsonObject config = example::common_config(trainer, a);
  config.add("gemm", example::gemm_name(a.precision)).add("conv", example::conv_name(a.precision));
  example::report(trainer, a, r, config);
  return 0;
}

int run(MPI_Comm comm, int argc, char** argv) {
  Args const a = parse(argc, argv);
  if (a.precision == "bf16") {
    // bf16 layers are oneDNN's in host memory and cuBLAS's in CUDA memory:
    // a build with neither has no bf16 Trainer to instantiate.
    if constexpr (telar::bf16_layers_supported<T, telar::DefaultMemorySpace>())
      return train<example::Bf16<Strategy>>(comm, a, telar::AdamW<T>{});
    else
      usage("--precision bf16 needs oneDNN (host memory) or cuBLAS (CUDA memory)");
  }
  return example::with_optimizer<T>(a.optimizer, usage,
                                    [&](auto opt) { return train<Strategy>(comm, a, opt); });
}

} // namespace

int main(int argc, char** argv) {
  return example::run_main(argc, argv, "cnn", run);
}
