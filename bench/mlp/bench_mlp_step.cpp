// Step time of the MLP 784-2048-2048-10 (ReLU, softmax cross-entropy, SGD),
// fp32, synthetic data: the model bench/peers/mlp_torch.py runs in PyTorch.
//   bench_mlp_step [--batch 128] [--steps 30] [--warmup 5] [--hidden 2048]
// Prints the configuration, the median and mean step time, and one JSON line.
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/train/trainer.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace {
long arg(int argc, char** argv, char const* name, long def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0)
      return std::atol(argv[i + 1]);
  return def;
}
} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    std::size_t const batch = arg(argc, argv, "--batch", 128);
    int const steps = int(arg(argc, argv, "--steps", 30));
    int const warmup = int(arg(argc, argv, "--warmup", 5));
    std::size_t const hidden = arg(argc, argv, "--hidden", 2048);
    using D = telar::Dense<float>;
    using R = telar::ReLU<float>;
    using Model = telar::Sequential<D, R, D, R, D>;
    telar::TrainerOptions opts;
    opts.seed = 1;
    telar::Trainer<Model, telar::Serial, telar::SGD<float>> trainer(
        Model(D(784, hidden), {}, D(hidden, hidden), {}, D(hidden, 10)), {}, opts, 784);

    telar::Matrix<float> x("x", batch, 784);
    telar::Labels<> y("y", batch);
    auto hx = Kokkos::create_mirror_view(x);
    auto hy = Kokkos::create_mirror_view(y);
    for (std::size_t i = 0; i < batch; ++i) {
      hy(i) = int(i % 10);
      for (std::size_t j = 0; j < 784; ++j)
        hx(i, j) = float((i * 784 + j) % 97) / 97.f;
    }
    Kokkos::deep_copy(x, hx);
    Kokkos::deep_copy(y, hy);

    std::vector<double> ms;
    for (int s = 0; s < warmup + steps; ++s) {
      auto r = trainer.step(x, y);
      if (s >= warmup)
        ms.push_back(r.seconds * 1e3);
    }
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    double const median = sorted[sorted.size() / 2];
    double const mean = std::accumulate(ms.begin(), ms.end(), 0.0) / ms.size();
    double const flops = 6.0 * batch * (784.0 * hidden + hidden * hidden + hidden * 10.0) -
                         2.0 * batch * 784.0 * hidden; // no input gradient for layer 0
    char const* threads = std::getenv("OMP_NUM_THREADS");
    std::printf("# telar MLP 784-%zu-%zu-10, batch %zu, fp32, SGD, gemm %s, Kokkos %s, "
                "OMP_NUM_THREADS=%s, %d steps after %d warm-up\n",
                hidden, hidden, batch, telar::gemm_backend_name<float, telar::DefaultMemorySpace>(),
                typeid(Kokkos::DefaultExecutionSpace).name(), threads ? threads : "unset", steps,
                warmup);
    std::printf("step_ms median %.2f mean %.2f min %.2f  (%.1f GFLOP/s at the median)\n", median,
                mean, sorted.front(), flops / median / 1e6);
    std::printf("{\"peer\":\"telar\",\"ranks\":1,\"batch\":%zu,\"hidden\":%zu,\"step_ms_median\":%.3f,"
                "\"step_ms_mean\":%.3f,\"gemm\":\"%s\"}\n",
                batch, hidden, median, mean,
                telar::gemm_backend_name<float, telar::DefaultMemorySpace>());
  }
  MPI_Finalize();
  return 0;
}
