// BatchNorm2d (telar::BatchNorm over [C, H, W] samples) forward and backward
// times in training, at ResNet shapes; bench/peers/batch_norm_torch.py times
// PyTorch's nn.BatchNorm2d at the same shapes.
//   OMP_NUM_THREADS=1 bench_batch_norm [--benchmark_filter=...]
// Rows: forward (batch statistics, running ones updated, y), backward
// (backward_input then backward_weight, as a step runs them) and both. The
// `GB/s` counter is the tensors' bytes one pass would move (x and y forward;
// x, dy and dx backward) per second: how near the kernels are to streaming.
#include <telar/layers/batch_norm.hpp>

#include <benchmark/benchmark.h>

#include <mpi.h>

#include <string>

namespace {

void batch_norm_case(benchmark::State& state, std::string const& phase) {
  std::size_t const n = state.range(0), c = state.range(1), hw = state.range(2);
  using B = telar::BatchNorm<float>;
  B bn(c);
  bn.initialize(1);
  std::size_t const f = c * hw * hw;
  telar::Matrix<float> x("x", n, f), y("y", n, f), dy("dy", n, f), dx("dx", n, f);
  // Values that vary within a channel (constant ones make the variance 0).
  Kokkos::parallel_for(
      "init", Kokkos::MDRangePolicy<Kokkos::Rank<2>>({0, 0}, {n, f}),
      KOKKOS_LAMBDA(std::size_t i, std::size_t j) {
        x(i, j) = float((i * 7 + j * 13) % 17) * 0.1f;
        dy(i, j) = float((i * 5 + j * 3) % 11) * 0.01f;
      });
  B::saved_type saved;
  Kokkos::DefaultExecutionSpace exec;
  bn.forward(exec, x, y, saved);
  bool const fwd = phase != "backward", bwd = phase != "forward";
  for (auto _ : state) {
    if (fwd)
      bn.forward(exec, x, y, saved);
    if (bwd) {
      bn.backward_input(exec, dy, dx, saved);
      bn.backward_weight(exec, dy, saved);
    }
    exec.fence();
  }
  double const passes = (fwd ? 2.0 : 0.0) + (bwd ? 3.0 : 0.0);
  state.counters["GB/s"] =
      benchmark::Counter(passes * double(n * f * sizeof(float)) * double(state.iterations()) / 1e9,
                         benchmark::Counter::kIsRate);
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    for (char const* phase : {"forward", "backward", "forward_backward"}) {
      std::string const p = phase;
      auto* b = benchmark::RegisterBenchmark(("BatchNorm2d/" + p).c_str(),
                                             [p](benchmark::State& s) { batch_norm_case(s, p); });
      // batch, C, H = W: ResNet-50's stage 1 and stage 2 activations
      b->Args({16, 64, 56})->Args({16, 256, 28})->Args({16, 128, 28});
      b->Unit(benchmark::kMillisecond)->MinTime(0.5);
    }
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
  }
  MPI_Finalize();
  return 0;
}
