// Dense forward / backward GFLOP/s at the MLP's shapes, per GEMM policy.
//   OMP_NUM_THREADS=1 bench_dense [--benchmark_filter=...]
// Google Benchmark prints the context (CPU, caches) first; each row's
// `GFLOP/s` counter is 2 m n k per second.
#include <telar/layers/dense.hpp>

#include <benchmark/benchmark.h>

#include <mpi.h>

namespace {

template <class Gemm>
void dense_case(benchmark::State& state, char const* phase) {
  std::size_t const n = state.range(0), in = state.range(1), out = state.range(2);
  using D = telar::Dense<float, telar::DefaultMemorySpace, Gemm>;
  D dense(in, out);
  dense.initialize(1);
  telar::Matrix<float> x("x", n, in), y("y", n, out), dy("dy", n, out), dx("dx", n, in);
  Kokkos::deep_copy(x, 0.5f);
  Kokkos::deep_copy(dy, 0.25f);
  typename D::saved_type saved;
  Kokkos::DefaultExecutionSpace exec;
  dense.forward(exec, x, y, saved);
  std::string const p = phase;
  for (auto _ : state) {
    if (p == "forward")
      dense.forward(exec, x, y, saved);
    else if (p == "backward_input")
      dense.backward_input(exec, dy, dx, saved);
    else
      dense.backward_weight(exec, dy, saved);
    exec.fence();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * in * out * state.iterations() / 1e9,
                                                 benchmark::Counter::kIsRate);
  state.SetLabel(std::string(Gemm::name()));
}

template <class Gemm>
void register_policy() {
  for (char const* phase : {"forward", "backward_input", "backward_weight"}) {
    auto* b =
        benchmark::RegisterBenchmark((std::string("Dense/") + Gemm::name() + "/" + phase).c_str(),
                                     [phase](benchmark::State& s) { dense_case<Gemm>(s, phase); });
    // batch x in x out of the MLP 784-2048-2048-10 at batch 128
    b->Args({128, 784, 2048})->Args({128, 2048, 2048})->Args({128, 2048, 10});
    b->Unit(benchmark::kMillisecond)->MinTime(0.3);
  }
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    if constexpr (telar::OneDnnGemm::supports<float, telar::DefaultMemorySpace>())
      register_policy<telar::OneDnnGemm>();
    // bf16 with fp32 accumulation, where the CPU has the instructions.
    if constexpr (telar::bf16_layers_supported<float, telar::DefaultMemorySpace>())
      if (telar::bf16_available<telar::DefaultMemorySpace>())
        register_policy<telar::Bf16Gemm>();
    if constexpr (telar::KokkosKernelsGemm::supports<float, telar::DefaultMemorySpace>())
      register_policy<telar::KokkosKernelsGemm>();
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
  }
  MPI_Finalize();
  return 0;
}
