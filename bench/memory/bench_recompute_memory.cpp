// Full recomputation (telar::recompute_all): peak saved-activation bytes and
// median step time with and without, measured by telar::MemoryMeter, for an
// MLP of `blocks` residual-free blocks [Dense, GELU, Dense, GELU] (hidden H)
// (fp32, AdamW, synthetic data), serially or as a pipeline under mpirun.
//   [mpirun -np P] bench_recompute_memory [--batch 256] [--hidden 1024] [--steps 20]
//        [--microbatches 1] [--schedule 1f1b]
// Under mpirun the ranks form a pipeline of P stages; figures are rank 0's
// (the first stage keeps the most micro-batches in flight).
// Prints a table (activations = the executor's slots plus every layer's
// saved state) and the planned activations next to the measured ones.
#include <telar/core/recompute.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/adam.hpp>
#include <telar/train/trainer.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace {
using T = float;
using Block = telar::Sequential<telar::Dense<T>, telar::GELU<T>, telar::Dense<T>, telar::GELU<T>>;
using Blocked = telar::Sequential<telar::Dense<T>, Block, Block, Block, Block, telar::Dense<T>>;

struct Args {
  std::size_t batch = 256, hidden = 1024;
  int steps = 20, microbatches = 1;
  std::string schedule = "1f1b";
};
using Pipeline = telar::Strategy<telar::PipelineParallel<>>;

Block block(std::size_t h) {
  return Block(telar::Dense<T>(h, h), {}, telar::Dense<T>(h, h), {});
}
Blocked blocked(std::size_t h) {
  return Blocked(telar::Dense<T>(784, h), block(h), block(h), block(h), block(h),
                 telar::Dense<T>(h, 10));
}

struct Row {
  std::string name;
  std::size_t activations = 0, planned = 0, total = 0;
  double median_ms = 0;
};

template <class Model>
Row measure(std::string name, Model model, Args const& a, telar::Matrix<T> const& x,
            telar::Labels<> const& y) {
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  telar::TrainerOptions opts;
  opts.microbatches = a.microbatches;
  opts.batch_size = a.batch;
  opts.grid = {1, p, 1};
  opts.schedule = a.schedule;
  telar::Trainer<Model, Pipeline, telar::AdamW<T>> trainer(MPI_COMM_WORLD, std::move(model),
                                                           telar::AdamW<T>{}, opts, 784);
  std::vector<double> ms;
  for (int s = 0; s < a.steps; ++s) {
    auto const t0 = std::chrono::steady_clock::now();
    trainer.step(x, y);
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  Row r;
  r.name = std::move(name);
  r.activations = trainer.memory()[telar::MemoryCategory::activations];
  r.planned = trainer.memory_plan().bytes[telar::MemoryCategory::activations];
  r.total = trainer.memory().total();
  r.median_ms = ms[ms.size() / 2];
  return r;
}

int run(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string const f = argv[i], v = argv[i + 1];
    if (f == "--batch")
      a.batch = std::stoul(v);
    else if (f == "--hidden")
      a.hidden = std::stoul(v);
    else if (f == "--steps")
      a.steps = std::stoi(v);
    else if (f == "--microbatches")
      a.microbatches = std::stoi(v);
    else if (f == "--schedule")
      a.schedule = v;
  }
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  telar::Matrix<T> x("bench::x", a.batch, 784);
  telar::Labels<> y("bench::y", a.batch);
  Kokkos::deep_copy(x, T(0.1));
  Kokkos::deep_copy(y, 3);
  std::vector<Row> rows;
  rows.push_back(measure("blocks, no recomputation", blocked(a.hidden), a, x, y));
  rows.push_back(
      measure("blocks, recompute_all", telar::recompute_all(blocked(a.hidden)), a, x, y));
  if (rank != 0)
    return 0;
  std::printf("recomputation: batch %zu, hidden %zu, 4 blocks [Dense GELU Dense GELU], pp=%d "
              "(%s), %d micro-batch(es), rank 0, median of %d steps\n",
              a.batch, a.hidden, p, p > 1 ? a.schedule.c_str() : "serial", a.microbatches, a.steps);
  std::printf("%-28s %16s %16s %14s %12s\n", "model", "activations", "planned", "total", "step ms");
  for (Row const& r : rows)
    std::printf("%-28s %16s %16s %14s %12.2f\n", r.name.c_str(),
                telar::MemoryBytes::human(r.activations).c_str(),
                telar::MemoryBytes::human(r.planned).c_str(),
                telar::MemoryBytes::human(r.total).c_str(), r.median_ms);
  std::printf("recomputation saves %.1f%% of the activation bytes for %.1f%% more step time\n",
              100.0 * (1.0 - double(rows[1].activations) / double(rows[0].activations)),
              100.0 * (rows[1].median_ms / rows[0].median_ms - 1.0));
  return 0;
}
} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = run(argc, argv);
  MPI_Finalize();
  return rc;
}
