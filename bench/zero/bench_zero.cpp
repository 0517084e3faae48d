// ZeRO 0/1/2/3 on an MLP 784-1024-1024-1024-10 with fp32 Adam, at whatever
// rank count (every rank data-parallel):
//   mpirun -np 2 bench_zero [--steps 20] [--batch 64] [--bucket-kib 8192]
// For each sharding it prints, per rank: the model-state bytes actually
// allocated (Kokkos allocations by label, peak over construction and the
// steps: parameters, gradients, optimizer state, ZeRO-3 gather buffers)
// next to the ZeRO paper's formula for fp32 Adam (16Ψ; 8Ψ + 8Ψ/N;
// 4Ψ + 12Ψ/N; 16Ψ/N), the bytes the data-parallel communicator counted per
// step (Communicator::bytes_sent), and the median step time (slowest rank)
// over the steps after 3 warm-up steps. ZeRO-1 runs with shared_memory =
// false, so every rank holds its own parameters. No time is asserted.
#include <telar/data/synthetic.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/adam.hpp>
#include <telar/parallel/precision.hpp>
#include <telar/train/trainer.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

using D = telar::Dense<float>;
using R = telar::ReLU<float>;
using Model = telar::Sequential<D, R, D, R, D, R, D>;
Model make_model() {
  return Model(D(784, 1024), {}, D(1024, 1024), {}, D(1024, 1024), {}, D(1024, 10));
}
constexpr double psi = 784.0 * 1024 + 1024 + 2 * (1024.0 * 1024 + 1024) + 1024.0 * 10 + 10;

// Live and peak bytes per category of Kokkos allocation label.
enum Category { parameters, gradients, optimizer, gathered, other, categories };
Category category_of(std::string const& l) {
  if (l == "telar::ParameterStore::values" || l == "telar::ZeRO::param_shard")
    return parameters;
  if (l == "telar::ParameterStore::grads" || l == "telar::ZeRO::shard_grads")
    return gradients;
  if (l.rfind("telar::Optimizer::", 0) == 0)
    return optimizer;
  // Temporary buffers of the collectives, apart from model states as in the
  // ZeRO paper: gathered groups and groups' gradients awaiting reduction.
  if (l == "telar::ZeRO::gathered" || l == "telar::ZeRO::group_grads")
    return gathered;
  return other;
}
struct Meter {
  std::int64_t live[categories] = {}, peak[categories] = {};
  std::map<void const*, std::pair<Category, std::int64_t>> where;
} meter;
void on_alloc(Kokkos::Profiling::SpaceHandle, char const* label, void const* ptr,
              std::uint64_t size) {
  Category const c = category_of(label);
  meter.where[ptr] = {c, std::int64_t(size)};
  meter.live[c] += std::int64_t(size);
  meter.peak[c] = std::max(meter.peak[c], meter.live[c]);
}
void on_free(Kokkos::Profiling::SpaceHandle, char const*, void const* ptr, std::uint64_t) {
  auto it = meter.where.find(ptr);
  if (it == meter.where.end())
    return;
  meter.live[it->second.first] -= it->second.second;
  meter.where.erase(it);
}

struct Row {
  std::string name;
  double formula = 0;
  std::int64_t peak[categories] = {};
  double bytes_per_step = 0, median_ms = 0;
};

// Precision: fp32, or bf16 compute (ZeRO-3 then gathers bf16 words).
template <class Sharding, class Precision = telar::Precision<float, float>>
Row run(char const* name, double formula, int steps, std::size_t batch, std::size_t bucket) {
  int size = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  meter = Meter{};
  Row row;
  row.name = name;
  row.formula = formula;
  {
    using S = telar::Strategy<telar::DataParallel<telar::RingAllreduce, Sharding>, Precision>;
    telar::TrainerOptions opts;
    opts.shared_memory = false;
    opts.bucket_bytes = bucket; // ZeRO-2/3 groups are whole layers of at least this
    opts.lr = telar::constant_lr(1e-3);
    telar::Trainer<Model, S, telar::Adam<float>> t(MPI_COMM_WORLD, make_model(), {}, opts, 784);
    std::size_t const local = batch / std::size_t(size);
    auto ds = telar::make_synthetic(local, 784, 10, 3 + std::uint64_t(rank));
    telar::Matrix<float> x("x", local, 784);
    telar::Labels<> y("y", local);
    auto hx = Kokkos::create_mirror_view(x);
    auto hy = Kokkos::create_mirror_view(y);
    for (std::size_t i = 0; i < local; ++i) {
      hy(i) = ds.y[i];
      for (std::size_t j = 0; j < 784; ++j)
        hx(i, j) = ds.x[i * 784 + j];
    }
    Kokkos::deep_copy(x, hx);
    Kokkos::deep_copy(y, hy);
    std::vector<double> ms;
    std::uint64_t bytes = 0;
    for (int s = 0; s < steps + 3; ++s) {
      if (s == 3 && t.grid())
        t.grid()->dp().reset_bytes_sent();
      MPI_Barrier(MPI_COMM_WORLD);
      double const t0 = MPI_Wtime();
      t.step(x, y);
      double dt = MPI_Wtime() - t0;
      MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (s >= 3)
        ms.push_back(dt * 1e3);
    }
    if (t.grid())
      bytes = t.grid()->dp().bytes_sent();
    std::sort(ms.begin(), ms.end());
    row.median_ms = ms[ms.size() / 2];
    row.bytes_per_step = double(bytes) / steps;
  }
  for (int c = 0; c < categories; ++c)
    row.peak[c] = meter.peak[c];
  // The largest rank's figures (shards differ by padding only).
  MPI_Allreduce(MPI_IN_PLACE, row.peak, categories, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &row.bytes_per_step, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return row;
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int steps = 20;
  std::size_t batch = 64, bucket = std::size_t(8) << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps"))
      steps = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--batch"))
      batch = std::size_t(std::atol(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--bucket-kib"))
      bucket = std::size_t(std::atol(argv[i + 1])) << 10;
  }
  int size = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    Kokkos::Tools::Experimental::set_allocate_data_callback(on_alloc);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(on_free);
    double const n = size, P = psi;
    using PerStep = telar::ZeRO<3, telar::ZeRO3Gather::PerStep>;
    std::vector<Row> rows;
    rows.push_back(run<telar::NoSharding>("dp (zero 0)", 16 * P, steps, batch, bucket));
    rows.push_back(run<telar::ZeRO<1>>("zero 1", 8 * P + 8 * P / n, steps, batch, bucket));
    rows.push_back(run<telar::ZeRO<2>>("zero 2", 4 * P + 12 * P / n, steps, batch, bucket));
    rows.push_back(run<telar::ZeRO<3>>("zero 3 per-microbatch", 16 * P / n, steps, batch, bucket));
    rows.push_back(run<PerStep>("zero 3 per-step", 16 * P / n, steps, batch, bucket));
    // bf16 compute: ZeRO-3 gathers bf16 words; per step it keeps them as
    // words, one group widened (docs/precision.md).
    using Bf16 = telar::Precision<telar::bf16, float>;
    if constexpr (telar::bf16_layers_supported<float, telar::DefaultMemorySpace>())
      if (telar::bf16_available<telar::DefaultMemorySpace>()) {
        rows.push_back(
            run<telar::ZeRO<3>, Bf16>("zero 3 per-mb bf16", 16 * P / n, steps, batch, bucket));
        rows.push_back(
            run<PerStep, Bf16>("zero 3 per-step bf16", 16 * P / n, steps, batch, bucket));
      }
    Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(nullptr);
    if (rank == 0) {
      double const MiB = 1024.0 * 1024.0;
      std::printf(
          "MLP 784-1024-1024-1024-10, Adam (fp32 masters), psi = %.0f parameters, dp = %d, global "
          "batch %zu, %d timed steps, buckets/groups >= %zu KiB\n",
          P, size, batch, steps, bucket >> 10);
      std::printf("%-22s %9s %9s %9s %9s %10s %10s %7s %12s %8s %9s\n", "sharding", "params",
                  "grads", "optim", "buffers", "model-state", "formula", "ratio", "sent/step",
                  "vs dp", "step ms");
      for (auto const& r : rows) {
        double const ms = double(r.peak[parameters] + r.peak[gradients] + r.peak[optimizer]);
        std::printf("%-22s %9.2f %9.2f %9.2f %9.2f %10.2f %10.2f %7.3f %10.2f MiB %7.3f %9.3f\n",
                    r.name.c_str(), r.peak[parameters] / MiB, r.peak[gradients] / MiB,
                    r.peak[optimizer] / MiB, r.peak[gathered] / MiB, ms / MiB, r.formula / MiB,
                    ms / r.formula, r.bytes_per_step / MiB,
                    rows[0].bytes_per_step > 0 ? r.bytes_per_step / rows[0].bytes_per_step : 0.0,
                    r.median_ms);
      }
      std::printf("(MiB per rank; params/grads/optim: peak bytes allocated under those labels; "
                  "buffers: gathered groups and group gradients awaiting reduction (temporary); "
                  "model-state = params + grads + optim peaks; sent/step: the dp "
                  "communicator's counted bytes)\n");
      std::printf("step time vs zero 1: zero 2 %.3fx, zero 3 per-microbatch %.3fx, zero 3 "
                  "per-step %.3fx\n",
                  rows[2].median_ms / rows[1].median_ms, rows[3].median_ms / rows[1].median_ms,
                  rows[4].median_ms / rows[1].median_ms);
    }
  }
  MPI_Finalize();
  return 0;
}
