// A model whose model states exceed a per-rank memory budget on one rank:
//   mpirun -np 1 bench_fit_budget [--budget-mib 128] [--steps 5]   refused before allocating
//   mpirun -np 4 bench_fit_budget [--budget-mib 128] [--steps 5]   trains with ZeRO-3 (dp=4) and
//                                                                ZeRO-3 over dp=2 x pp=2
// MLP 784-2048-2048-2048-10 with fp32 Adam: 10.0 M parameters, 16 bytes each
// = 161 MB of model states on one rank, over the 128 MiB budget. At 4 ranks each layout trains a
// few steps under the budget and must reach the parameters of an unconstrained serial run (rank 0
// trains one on MPI_COMM_SELF): every tensor's norm and the loss agree within float tolerance.
// Prints the plan, the measured peak and the comparison; exits non-zero when a check fails.
#include <telar/data/synthetic.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/adam.hpp>
#include <telar/profile/memory.hpp>
#include <telar/train/trainer.hpp>

#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>

namespace {

using D = telar::Dense<float>;
using R = telar::ReLU<float>;
using Model = telar::Sequential<D, R, D, R, D, R, D>;
Model make_model() {
  return Model(D(784, 2048), {}, D(2048, 2048), {}, D(2048, 2048), {}, D(2048, 10));
}
using Zero3 = telar::Strategy<telar::DataParallel<telar::RingAllreduce, telar::ZeRO<3>>,
                              telar::PipelineParallel<telar::OneFOneB>>;
using Adam = telar::Adam<float>;
constexpr std::size_t batch = 64, features = 784;

// The global batch of step s; rank `part` of `parts` takes its equal share.
struct Batch {
  telar::Matrix<float> x;
  telar::Labels<> y;
};
Batch batch_of(int s, std::size_t part, std::size_t parts) {
  std::size_t const n = batch / parts;
  auto ds = telar::make_synthetic(batch, features, 10, 100 + std::uint64_t(s));
  Batch b{telar::Matrix<float>("x", n, features), telar::Labels<>("y", n)};
  auto hx = Kokkos::create_mirror_view(b.x);
  auto hy = Kokkos::create_mirror_view(b.y);
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t const g = part * n + i;
    hy(i) = ds.y[g];
    for (std::size_t j = 0; j < features; ++j)
      hx(i, j) = ds.x[g * features + j];
  }
  Kokkos::deep_copy(b.x, hx);
  Kokkos::deep_copy(b.y, hy);
  return b;
}

telar::TrainerOptions options(std::size_t budget, telar::GridShape grid) {
  telar::TrainerOptions o;
  o.seed = 11;
  o.lr = telar::constant_lr(1e-3);
  o.grid = grid;
  o.microbatches = grid.pp > 1 ? 2 : 1;
  o.memory_budget = budget;
  o.batch_size = batch; // the plan counts activations too
  o.bucket_bytes = std::size_t(1) << 20;
  return o;
}

// Trains `steps` steps; returns the last loss and every tensor's norm.
template <class TrainerT>
std::pair<double, std::map<std::string, double>> train(TrainerT& t, int steps) {
  double loss = 0;
  std::size_t const dp = std::size_t(t.grid_shape().dp), d = std::size_t(t.grid_coords().dp);
  for (int s = 0; s < steps; ++s) {
    Batch b = batch_of(s, d, dp);
    loss = t.step(b.x, b.y).loss;
  }
  return {loss, t.tensor_norms()};
}

int run(int argc, char** argv) {
  std::size_t budget = std::size_t(128) << 20;
  int steps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--budget-mib"))
      budget = std::size_t(std::atol(argv[i + 1])) << 20;
    else if (!std::strcmp(argv[i], "--steps"))
      steps = std::max(1, std::atoi(argv[i + 1]));
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  bool const root = rank == 0;

  if (size == 1) { // the model states alone are over the budget
    try {
      telar::Trainer<Model, Zero3, Adam> t(MPI_COMM_WORLD, make_model(), Adam{},
                                           options(budget, {0, 1, 1}), features);
      std::printf("not refused: the plan is %s\n", t.memory_plan().bytes.str().c_str());
      return 1;
    } catch (telar::MemoryError const& e) {
      std::printf("1 rank, budget %s: refused before allocating:\n  %s\n",
                  telar::MemoryBytes::human(budget).c_str(), e.what());
      return 0;
    }
  }

  // The unconstrained serial reference, on rank 0 alone.
  std::pair<double, std::map<std::string, double>> ref;
  if (root) {
    telar::Trainer<Model, telar::Serial, Adam> serial(make_model(), Adam{}, options(0, {1, 1, 1}),
                                                      features);
    ref = train(serial, steps);
  }
  int failed = 0;
  for (telar::GridShape grid : {telar::GridShape{0, 1, 1}, telar::GridShape{0, 2, 1}}) {
    std::optional<telar::Trainer<Model, Zero3, Adam>> trainer;
    try {
      trainer.emplace(MPI_COMM_WORLD, make_model(), Adam{}, options(budget, grid), features);
    } catch (telar::MemoryError const& e) { // the same on every rank
      if (root)
        std::printf("%d ranks, grid dp=%d pp=%d: refused: %s\n", size, grid.dp, grid.pp, e.what());
      ++failed;
      continue;
    }
    auto& t = *trainer;
    auto const [loss, norms] = train(t, steps);
    telar::MemoryBytes const peak = t.memory(), plan = t.memory_plan().bytes;
    double worst = 0;
    for (auto const& [name, v] : norms)
      if (root)
        worst = std::max(worst, std::abs(v - ref.second[name]) / std::max(1e-12, ref.second[name]));
    double peak_total = double(peak.total());
    MPI_Allreduce(MPI_IN_PLACE, &peak_total, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (root) {
      bool const ok = worst < 1e-4 && std::abs(loss - ref.first) < 1e-4 * std::abs(ref.first) &&
                      peak_total <= double(budget);
      failed += ok ? 0 : 1;
      std::printf("%d ranks, ZeRO<3> %s, budget %s: plan %s; measured peak (largest rank) %s; "
                  "loss %.6f vs serial %.6f, largest tensor-norm difference %.2e: %s\n",
                  size, t.layout().c_str(), telar::MemoryBytes::human(budget).c_str(),
                  telar::MemoryBytes::human(plan.total()).c_str(),
                  telar::MemoryBytes::human(std::size_t(peak_total)).c_str(), loss, ref.first,
                  worst, ok ? "ok" : "FAILED");
    }
  }
  MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return failed;
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    rc = run(argc, argv);
  }
  MPI_Finalize();
  return rc;
}
