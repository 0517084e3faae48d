// Example 06: ResNets with BatchNorm, serial or under any composition of data
// and pipeline parallelism (blocks are pipeline units).
//
// --model resnet (default): the CIFAR-style ResNet of He et al. (2016) on
// Fashion-MNIST, the 28x28 images zero-padded to 32x32 by the first
// convolution (padding 3 = pad to 32, then a 3x3 convolution with padding 1):
//
//   conv 3x3 1->w, BN, ReLU                                   [w, 32, 32]
//   n basic blocks {conv 3x3, BN, ReLU, conv 3x3, BN} + x, ReLU
//   n blocks at 2w, 16x16 (the first: stride 2, shortcut 1x1 conv + BN)
//   n blocks at 4w, 8x8
//   global average pool, dense 4w->10
//
// with n = (depth - 2) / 6: --depth 20, 32 or 56 (w = --width, 16).
// --model resnet50: ImageNet's ResNet-50 (torchvision's layout: 7x7/2 stem,
// max-pool 3x3/2, bottleneck blocks 3-4-6-3, stride in the 3x3 convolution)
// with 10 classes, on synthetic images [3, R, R] (--resolution R) for
// benchmarks (bench/peers/resnet_torch.py times PyTorch on the same network).
//
//   resnet [--model resnet|resnet50] [--depth 20] [--width 16] [--bn local|sync]
//          [--resolution 128] [--epochs 15] [--batch 128] [--lr 0.1]
//          [--optimizer momentum] [--precision fp32|bf16] [--bf16-weight-copy 1|0] [common flags:
//          --dp --pp
//          --schedule --microbatches --limit-steps --eval-limit --json --timeline
//          --checkpoint-dir ... --memory-budget --layout auto|manual --dry-run --profile]
//   mpirun -np 2 resnet --dp 2 --bn sync
//
// --precision bf16 adds telar::Precision<telar::bf16, float> to the strategy:
// the run-time chain is rebound layer by layer, its convolutions and the
// Dense to oneDNN's bf16 kernels; BatchNorm, the loss, weights and optimizer
// state stay fp32 (docs/precision.md). With AdamW only (one more Trainer type
// per BatchNorm policy).
//
// --layout auto: the planner's fastest layout that fits; --dry-run: its
// ranking, no training (docs/planner.md).
//
// --bn local normalises each rank's micro-batch on its own (what PyTorch's
// DDP does); --bn sync reduces the statistics over the data-parallel group
// (SyncBatchNorm), so a dp run normalises over the same samples as serial.
#include <telar/core/dynamic_sequential.hpp>
#include <telar/core/residual.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/batch_norm.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/pooling.hpp>

#include "layout_planning.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <variant>

namespace {

struct Args : example::CommonArgs {
  Args() : CommonArgs(/*epochs*/ 15, /*hidden*/ 1) {
    batch = 128;
    lr = 0.1;
    optimizer = "momentum";
    takes_precision = true;
  }
  std::string model = "resnet";
  int depth = 20;
  std::size_t width = 16, resolution = 128;
  std::string bn = "local";
  long eval_limit = -1;
};

[[noreturn]] void usage(char const* why) {
  std::fprintf(stderr,
               "resnet: %s\n"
               "usage: resnet [--model resnet|resnet50] [--depth 20|32|56|...] [--width N] "
               "[--bn local|sync] [--resolution N] [--epochs N] [--batch N] [--lr X] "
               "[--optimizer momentum|adamw] [--precision fp32|bf16] [--bf16-weight-copy 1|0] "
               "[--seed N] [--data DIR] [--json] "
               "[--dp N] [--pp N] "
               "[--schedule gpipe|1f1b|interleaved|zb-h1|zb-h2] [--microbatches M] "
               "[--timeline PREFIX] [--limit-steps N] [--eval-limit N] [--memory-budget BYTES] "
               "[--checkpoint-dir DIR] [--checkpoint-every N] [--resume] [--layout auto|manual] "
               "[--dry-run] [--profile PATH]\n",
               why);
  throw 2;
}

Args parse(int argc, char** argv) {
  Args a;
  example::ArgReader r(argc, argv, usage);
  while (r.next()) {
    std::string const& f = r.flag();
    if (f == "--model")
      a.model = r.value();
    else if (f == "--depth")
      a.depth = int(r.number());
    else if (f == "--width")
      a.width = std::size_t(r.number());
    else if (f == "--resolution")
      a.resolution = std::size_t(r.number());
    else if (f == "--bn")
      a.bn = r.value();
    else if (f == "--schedule")
      a.schedule = r.value(); // the trainer checks it
    else if (f == "--eval-limit")
      a.eval_limit = r.number();
    else if (!example::read_common_flag(r, a))
      usage(("unknown flag " + f).c_str());
  }
  example::check_common(a, usage);
  example::check_bf16_run(a, usage);
  if (a.model != "resnet" && a.model != "resnet50")
    usage(("--model expects resnet or resnet50, got '" + a.model + "'").c_str());
  if (a.depth < 8 || (a.depth - 2) % 6 != 0)
    usage(("--depth expects 6n + 2 (20, 32, 44, 56, 110), got " + std::to_string(a.depth)).c_str());
  if (a.bn != "local" && a.bn != "sync")
    usage(("--bn expects local or sync, got '" + a.bn + "'").c_str());
  if (a.width < 1 || a.resolution < 32)
    usage("--width must be positive and --resolution at least 32");
  if (a.tp > 1)
    usage("--tp is not offered: a ResNet has no Dense pair to split (use --dp and --pp)");
  return a;
}

using T = float;
using C = telar::Conv2D<T>;
using R = telar::ReLU<T>;

// The network's building blocks for one BatchNorm statistics policy. Each
// block is one unit of the run-time chain (and of pipeline partitioning).
template <class Stats>
struct Net {
  using BN = telar::BatchNorm<T, telar::DefaultMemorySpace, Stats>;
  using Shortcut = telar::Sequential<C, BN>; // 1x1 convolution + BN
  using Basic = telar::Residual<C, BN, R, C, BN>;
  using BasicDown = telar::ProjectedResidual<Shortcut, C, BN, R, C, BN>;
  using Bottleneck = telar::Residual<C, BN, R, C, BN, R, C, BN>;
  using BottleneckDown = telar::ProjectedResidual<Shortcut, C, BN, R, C, BN, R, C, BN>;
  using Layer = std::variant<C, BN, R, Basic, BasicDown, Bottleneck, BottleneckDown,
                             telar::MaxPool2D<T>, telar::GlobalAvgPool<T>, telar::Dense<T>>;
  using Model = telar::DynamicSequential<Layer>;

  static C conv(std::size_t in, std::size_t out, std::size_t k, std::size_t stride) {
    return C(in, out, k, stride, k / 2, /*bias*/ false);
  }
  static Shortcut shortcut(std::size_t in, std::size_t out, std::size_t stride) {
    return Shortcut(conv(in, out, 1, stride), BN(out));
  }

  // He et al.'s CIFAR ResNet: 3 stages of n basic blocks at w, 2w, 4w channels.
  static Model cifar(int depth, std::size_t w) {
    Model m;
    m.push_back(C(1, w, 3, 1, 3, false)); // 28x28 padded to 32x32, then 3x3 / 1
    m.push_back(BN(w));
    m.push_back(R{});
    std::size_t in = w;
    for (int stage = 0; stage < 3; ++stage) {
      std::size_t const out = w << stage;
      for (int b = 0; b < (depth - 2) / 6; ++b) {
        std::size_t const s = stage > 0 && b == 0 ? 2 : 1;
        if (s == 1 && in == out)
          m.push_back(Basic(conv(in, out, 3, 1), BN(out), R{}, conv(out, out, 3, 1), BN(out)));
        else
          m.push_back(BasicDown(shortcut(in, out, s), conv(in, out, 3, s), BN(out), R{},
                                conv(out, out, 3, 1), BN(out)));
        m.push_back(R{});
        in = out;
      }
    }
    m.push_back(telar::GlobalAvgPool<T>{});
    m.push_back(telar::Dense<T>(in, 10));
    return m;
  }

  // torchvision's resnet50(num_classes=10): bottlenecks 3-4-6-3, expansion 4.
  static Model resnet50() {
    Model m;
    m.push_back(C(3, 64, 7, 2, 3, false));
    m.push_back(BN(64));
    m.push_back(R{});
    m.push_back(telar::MaxPool2D<T>(3, 2, 1));
    std::size_t in = 64;
    int const blocks[4] = {3, 4, 6, 3};
    for (int stage = 0; stage < 4; ++stage) {
      std::size_t const mid = std::size_t(64) << stage, out = 4 * mid;
      for (int b = 0; b < blocks[stage]; ++b) {
        std::size_t const s = stage > 0 && b == 0 ? 2 : 1;
        if (b == 0)
          m.push_back(BottleneckDown(shortcut(in, out, s), conv(in, mid, 1, 1), BN(mid), R{},
                                     conv(mid, mid, 3, s), BN(mid), R{}, conv(mid, out, 1, 1),
                                     BN(out)));
        else
          m.push_back(Bottleneck(conv(in, mid, 1, 1), BN(mid), R{}, conv(mid, mid, 3, 1), BN(mid),
                                 R{}, conv(mid, out, 1, 1), BN(out)));
        m.push_back(R{});
        in = out;
      }
    }
    m.push_back(telar::GlobalAvgPool<T>{});
    m.push_back(telar::Dense<T>(in, 10));
    return m;
  }
};

// One strategy type for every run: degrees left at 1 cost nothing.
using Strategy = telar::Strategy<telar::DataParallel<telar::RingAllreduce>,
                                 telar::PipelineParallel<telar::OneFOneB>>;

// ResNet-50's synthetic training set: two batches, at least 64 images.
std::size_t synthetic_size(Args const& a) {
  return std::max<std::size_t>(2 * a.batch, 64);
}

// How many training samples load_data will give (before it loads them).
std::size_t train_size(Args const& a) {
  return a.model == "resnet" ? telar::fashion_mnist_train_size(a.data) : synthetic_size(a);
}

// Fashion-MNIST, or synthetic [3, R, R] images of 10 classes for ResNet-50.
telar::FashionMnist load_data(Args const& a) {
  if (a.model == "resnet")
    return telar::load_fashion_mnist(a.data);
  return example::synthetic_data(synthetic_size(a), {3, a.resolution, a.resolution}, 10, a.seed);
}

// --layout auto / --dry-run / --memory-budget: the layouts of the strategy
// type this example runs (S: it, or it with bf16 compute, whose model is
// planned as the Trainer rebinds it).
template <class Stats, class S, class Optimizer>
int train(MPI_Comm comm, Args const& given, Optimizer opt) {
  using N = Net<Stats>;
  bool const cifar = given.model == "resnet";
  telar::Shape const image =
      cifar ? telar::Shape{1, 28, 28} : telar::Shape{3, given.resolution, given.resolution};
  auto const make_model = [&] {
    return cifar ? N::cifar(given.depth, given.width) : N::resnet50();
  };
  Args a = given;
  std::optional<telar::LayoutPlan> plan;
  if (!example::plan_run(comm, a, plan, "resnet", [&] {
        return example::plan_of<typename N::Model, S, Optimizer>(comm, a, make_model(), image);
      }))
    return 0;
  telar::TrainerOptions const opts = example::trainer_options(a, train_size(a), comm);
  auto trainer = example::with_fastest_fitting(plan, [&] {
    return telar::Trainer<typename N::Model, S, Optimizer>(comm, make_model(), opt, opts, image);
  });
  example::Preflight const checked = example::preflight(trainer, a, "resnet");
  telar::FashionMnist const data = load_data(a);
  std::string const name =
      cifar ? "ResNet-" + std::to_string(a.depth) + " (width " + std::to_string(a.width) + ")"
            : "ResNet-50 [3," + std::to_string(a.resolution) + "," + std::to_string(a.resolution) +
                  "]";
  if (trainer.rank() == 0)
    std::fprintf(stderr,
                 "resnet: %zu train / %zu test samples, %s, BatchNorm %s, %s, layout %s, "
                 "schedule %s, %d micro-batches, global batch %zu, conv %s\n",
                 data.train.size, data.test.size, name.c_str(), Stats::name(), Optimizer::name(),
                 trainer.layout().c_str(), trainer.pipeline_schedule().name.c_str(),
                 opts.microbatches, a.batch, example::conv_name(a.precision));
  std::size_t const eval = a.eval_limit > 0
                               ? std::min<std::size_t>(data.test.size, std::size_t(a.eval_limit))
                               : data.test.size;
  auto test_set = example::test_set(data.test, eval);
  example::Result r = example::fit(trainer, a, checked, data, test_set);
  r.predicted_ms = example::predicted_step_ms(comm, a, make_model(), trainer, image);
  example::write_timeline(trainer, a.timeline, "resnet");
  telar::JsonObject config = example::common_config(trainer, a);
  config.add("model", cifar ? "resnet" + std::to_string(a.depth) : std::string("resnet50"))
      .add("bn", a.bn)
      .add("conv", example::conv_name(a.precision));
  example::report(trainer, a, r, config);
  return 0;
}

// SGD with momentum 0.9 and weight decay 5e-4 (He et al.), or AdamW: two
// optimizers keep the example's Trainer instantiations (and compile time) few.
template <class Stats>
int with_optimizer(MPI_Comm comm, Args const& a) {
  if (a.precision == "bf16") {
    // bf16 layers are oneDNN's in host memory and cuBLAS's in CUDA memory:
    // a build with neither has no bf16 Trainer to instantiate.
    if constexpr (telar::bf16_layers_supported<T, telar::DefaultMemorySpace>())
      return train<Stats, example::Bf16<Strategy>>(comm, a, telar::AdamW<T>{});
    else
      usage("--precision bf16 needs oneDNN (host memory) or cuBLAS (CUDA memory)");
  }
  if (a.optimizer == "momentum") {
    telar::SGD<T> o;
    o.momentum = 0.9f;
    o.weight_decay = 5e-4f;
    return train<Stats, Strategy>(comm, a, o);
  }
  if (a.optimizer == "adamw")
    return train<Stats, Strategy>(comm, a, telar::AdamW<T>{});
  usage(("--optimizer expects momentum or adamw, got '" + a.optimizer + "'").c_str());
}

int run(MPI_Comm comm, int argc, char** argv) {
  Args const a = parse(argc, argv);
  return a.bn == "sync" ? with_optimizer<telar::SyncStats>(comm, a)
                        : with_optimizer<telar::LocalStats>(comm, a);
}

} // namespace

int main(int argc, char** argv) {
  return example::run_main(argc, argv, "resnet", run);
}
