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
//
// --eval-limit evaluates on the first N test images only (quick checks).
//   mpirun -np 2 cnn --dp 2
//
// --batch is the global batch; each data-parallel rank trains on batch/dp of
// it. Rank 0 shows progress; with --json it ends with one JSON line.
#include <telar/core/residual.hpp>
#include <telar/data.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/optim/adam.hpp>
#include <telar/optim/lamb.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/profile/trace.hpp>
#include <telar/schedule/svg.hpp>
#include <telar/train/json.hpp>
#include <telar/train/progress.hpp>
#include <telar/train/trainer.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

struct Args {
  int epochs = 5;
  std::size_t batch = 64;
  double lr = 1e-3;
  std::string optimizer = "adamw";
  std::uint64_t seed = 1;
  std::size_t hidden = 128;
  std::string data = telar::default_fashion_mnist_dir();
  bool json = false;
  int dp = 0, pp = 1, tp = 1;
  std::string schedule = "1f1b";
  int microbatches = 0; // 0: pp * 2 when pipelining, else 1
  std::string timeline;
  long limit_steps = -1;
  long eval_limit = -1;
};

[[noreturn]] void usage(char const* why) {
  std::fprintf(stderr,
               "cnn: %s\n"
               "usage: cnn [--epochs N] [--batch N] [--lr X] "
               "[--optimizer sgd|momentum|adam|adamw|lamb] [--seed N] [--hidden N] [--data DIR] "
               "[--json] [--dp N] [--pp N] [--tp N] "
               "[--schedule gpipe|1f1b|interleaved|zb-h1|zb-h2] [--microbatches M] "
               "[--timeline PREFIX] [--limit-steps N] [--eval-limit N]\n",
               why);
  throw 2;
}

Args parse(int argc, char** argv) {
  Args a;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc)
      usage((std::string(argv[i]) + " needs a value").c_str());
    return argv[++i];
  };
  auto number = [&](int& i) -> long {
    std::string const flag = argv[i], v = value(i);
    char* end = nullptr;
    long const x = std::strtol(v.c_str(), &end, 10);
    if (*end != 0 || v.empty())
      usage((flag + " expects an integer, got '" + v + "'").c_str());
    return x;
  };
  for (int i = 1; i < argc; ++i) {
    std::string const f = argv[i];
    if (f == "--epochs")
      a.epochs = int(number(i));
    else if (f == "--batch")
      a.batch = std::size_t(number(i));
    else if (f == "--lr")
      a.lr = std::atof(value(i).c_str());
    else if (f == "--optimizer")
      a.optimizer = value(i);
    else if (f == "--seed")
      a.seed = std::uint64_t(number(i));
    else if (f == "--hidden")
      a.hidden = std::size_t(number(i));
    else if (f == "--data")
      a.data = value(i);
    else if (f == "--json")
      a.json = true;
    else if (f == "--dp")
      a.dp = int(number(i));
    else if (f == "--pp")
      a.pp = int(number(i));
    else if (f == "--tp")
      a.tp = int(number(i));
    else if (f == "--schedule")
      a.schedule = value(i);
    else if (f == "--microbatches")
      a.microbatches = int(number(i));
    else if (f == "--timeline")
      a.timeline = value(i);
    else if (f == "--limit-steps")
      a.limit_steps = number(i);
    else if (f == "--eval-limit")
      a.eval_limit = number(i);
    else if (f == "--help" || f == "-h")
      usage("help");
    else
      usage(("unknown flag " + f).c_str());
  }
  if (a.epochs < 1 || a.batch < 1 || a.hidden < 1 || !(a.lr > 0))
    usage("--epochs, --batch, --hidden and --lr must be positive");
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

template <class Optimizer>
int train(MPI_Comm comm, Args const& a, Optimizer opt) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  bool const root = rank == 0;

  telar::FashionMnist data = telar::load_fashion_mnist(a.data);

  telar::TrainerOptions opts;
  opts.seed = a.seed;
  opts.grid = {a.dp, a.pp, a.tp};
  opts.schedule = a.schedule;
  opts.microbatches = a.microbatches > 0 ? a.microbatches : (a.pp > 1 ? 2 * a.pp : 1);
  opts.trace = !a.timeline.empty();
  std::size_t const steps_per_epoch = data.train.size / a.batch;
  long long const total_steps = (long long)steps_per_epoch * a.epochs;
  opts.lr = telar::warmup_cosine(a.lr, std::min<long long>(100, total_steps / 10), total_steps,
                                 a.lr * 0.05);
  telar::Trainer<Model, Strategy, Optimizer> trainer(comm, make_model(a.hidden), opt, opts, image);
  int const dp = trainer.grid_shape().dp;
  if (a.batch % std::size_t(dp) != 0)
    throw telar::Error("cnn: --batch " + std::to_string(a.batch) +
                       " is not divisible by dp=" + std::to_string(dp));
  std::size_t const local = a.batch / std::size_t(dp);
  if (root)
    std::fprintf(stderr,
                 "cnn: %zu train / %zu test samples, CNN [1,28,28] 32-res32-64-%zu-10, %s, "
                 "layout %s, schedule %s, %d micro-batches, global batch %zu, gemm %s, conv %s\n",
                 data.train.size, data.test.size, a.hidden, Optimizer::name(),
                 trainer.layout().c_str(), trainer.pipeline_schedule().name.c_str(),
                 opts.microbatches, a.batch,
                 telar::gemm_backend_name<T, telar::DefaultMemorySpace>(),
                 telar::conv_backend_name<T, telar::DefaultMemorySpace>());

  // The test set lives on the device once; training batches are gathered per step.
  telar::BatchGather<telar::DefaultMemorySpace> test_set;
  std::vector<std::size_t> all(
      a.eval_limit > 0 ? std::min<std::size_t>(data.test.size, std::size_t(a.eval_limit))
                       : data.test.size);
  for (std::size_t i = 0; i < all.size(); ++i)
    all[i] = i;
  test_set.gather(data.test, all);

  telar::DistributedSampler sampler(data.train.size, dp, trainer.grid_coords().dp, a.seed, true,
                                    telar::LastBatch::drop);
  telar::BatchLoader loader(sampler, local);
  telar::BatchGather<telar::DefaultMemorySpace> gather(local, 784);
  std::vector<double> step_ms;
  double last_loss = 0, epoch_loss = 0;
  long long samples = 0, steps = 0;
  double train_seconds = 0;
  bool stop = false;
  // The test set after the last epoch (the final figures).
  telar::StepResult test{};
  for (int epoch = 0; epoch < a.epochs && !stop; ++epoch) {
    loader.set_epoch(std::uint64_t(epoch));
    telar::ProgressBar bar("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(a.epochs),
                           (long long)loader.size(), root);
    double sum = 0;
    long long n = 0;
    telar::LocalBatch batch;
    for (std::size_t s = 0; s < loader.size(); ++s) {
      loader.batch(s, batch);
      gather(data.train, batch);
      auto r = trainer.step(gather.x(), gather.y());
      step_ms.push_back(r.seconds * 1e3);
      train_seconds += r.seconds;
      samples += r.samples;
      sum += r.loss;
      ++n;
      ++steps;
      if (s % 20 == 0 || s + 1 == loader.size()) {
        char m[96];
        std::snprintf(m, sizeof m, "loss %.4f lr %.2e", sum / double(n), r.lr);
        bar.update((long long)s + 1, m, double(a.batch));
      }
      if (a.limit_steps > 0 && steps >= a.limit_steps) {
        stop = true;
        break;
      }
    }
    epoch_loss = sum / double(std::max<long long>(1, n));
    last_loss = epoch_loss;
    test = trainer.evaluate(test_set.x(), test_set.y());
    auto const& ev = test;
    if (root)
      std::fprintf(stderr, "epoch %d: train loss %.4f, test loss %.4f, test accuracy %.2f%%\n",
                   epoch + 1, epoch_loss, ev.loss, 100 * ev.accuracy);
  }
  double const l2 = trainer.param_l2();
  std::vector<double> sorted = step_ms;
  std::sort(sorted.begin(), sorted.end());
  double const median = sorted.empty() ? 0 : sorted[sorted.size() / 2];

  if (!a.timeline.empty()) {
    std::string const path = a.timeline + ".json";
    if (trainer.write_trace(path) && root)
      std::fprintf(stderr, "cnn: timeline written to %s (open in ui.perfetto.dev)\n", path.c_str());
    // The last training step's pipeline, drawn like the simulator's charts.
    auto const tl = trainer.pipeline_timeline();
    if (root && trainer.grid_shape().pp > 1) {
      auto const stats = telar::schedule::analyze(tl);
      telar::schedule::SvgOptions svg;
      svg.title = tl.name + ", last step";
      telar::schedule::write_svg(tl, a.timeline + ".svg", svg);
      std::fprintf(stderr, "cnn: pipeline chart %s.svg (bubble %.1f%%)\n", a.timeline.c_str(),
                   100 * stats.bubble_fraction);
    }
  }

  if (root) {
    std::fprintf(stderr, "final: test accuracy %.2f%%, median step %.2f ms, %.0f samples/s\n",
                 100 * test.accuracy, median, double(samples) / train_seconds);
    if (a.json) {
      telar::JsonObject config;
      config.add("epochs", a.epochs)
          .add("batch", (long long)a.batch)
          .add("lr", a.lr)
          .add("optimizer", Optimizer::name())
          .add("seed", (long long)a.seed)
          .add("hidden", (long long)a.hidden)
          .add("ranks", size)
          .add("dp", trainer.grid_shape().dp)
          .add("pp", trainer.grid_shape().pp)
          .add("tp", trainer.grid_shape().tp)
          .add("schedule", trainer.pipeline_schedule().name)
          .add("microbatches", opts.microbatches)
          .add("gemm", telar::gemm_backend_name<T, telar::DefaultMemorySpace>())
          .add("conv", telar::conv_backend_name<T, telar::DefaultMemorySpace>());
      telar::JsonObject j;
      j.add("final_loss", last_loss)
          .add("test_loss", test.loss)
          .add("test_accuracy", test.accuracy)
          .add("samples_per_s", double(samples) / train_seconds)
          .add("step_ms_median", median)
          .add("param_l2", l2)
          .add("steps", steps)
          .add("strategy", trainer.strategy_name())
          .add("layout", trainer.layout())
          .add("config", config);
      std::printf("%s\n", j.str().c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

int run(MPI_Comm comm, Args const& a) {
  if (a.optimizer == "sgd")
    return train(comm, a, telar::SGD<T>{});
  if (a.optimizer == "momentum") {
    telar::SGD<T> o;
    o.momentum = 0.9f;
    return train(comm, a, o);
  }
  if (a.optimizer == "adam")
    return train(comm, a, telar::Adam<T>{});
  if (a.optimizer == "adamw")
    return train(comm, a, telar::AdamW<T>{});
  if (a.optimizer == "lamb")
    return train(comm, a, telar::LAMB<T>{});
  usage(("unknown optimizer '" + a.optimizer + "'").c_str());
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    try {
      rc = run(MPI_COMM_WORLD, parse(argc, argv));
    } catch (int code) {
      rc = code;
    } catch (std::exception const& e) {
      // Every rank reaches the same error (degrees, data files) and says so.
      std::fprintf(stderr, "cnn: rank %d: %s\n", rank, e.what());
      rc = 1;
    }
  }
  MPI_Finalize();
  return rc;
}
