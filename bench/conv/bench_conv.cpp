// Conv2D forward / backward GFLOP/s at the shapes of example 02's CNN, per
// convolution policy (oneDNN primitives; im2col + GEMM per GEMM policy).
//   OMP_NUM_THREADS=1 bench_conv [--benchmark_filter=...]
// Each row's `GFLOP/s` counter is 2 * batch * Cout * Ho * Wo * Cin * k * k per
// second (the same count for all three phases).
#include <telar/layers/conv.hpp>

#include <benchmark/benchmark.h>

#include <mpi.h>

#include <string>

namespace {

template <class Gemm, class Policy>
void conv_case(benchmark::State& state, char const* phase) {
  std::size_t const n = state.range(0), cin = state.range(1), cout = state.range(2),
                    hw = state.range(3);
  using C = telar::Conv2D<float, telar::DefaultMemorySpace, Gemm, Policy>;
  C conv(cin, cout, 3, 1, 1);
  telar::Shape const in{cin, hw, hw};
  conv.build(in);
  conv.initialize(1);
  std::size_t const out = conv.output_shape(in).size();
  telar::Matrix<float> x("x", n, in.size()), y("y", n, out), dy("dy", n, out),
      dx("dx", n, in.size());
  Kokkos::deep_copy(x, 0.5f);
  Kokkos::deep_copy(dy, 0.25f);
  typename C::saved_type saved;
  Kokkos::DefaultExecutionSpace exec;
  conv.forward(exec, x, y, saved);
  std::string const p = phase;
  for (auto _ : state) {
    if (p == "forward")
      conv.forward(exec, x, y, saved);
    else if (p == "backward_input")
      conv.backward_input(exec, dy, dx, saved);
    else
      conv.backward_weight(exec, dy, saved);
    exec.fence();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(conv.flops(n, in) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(Policy::name()) + "/" + Gemm::name());
}

template <class Gemm, class Policy>
void register_policy(std::string const& label) {
  for (char const* phase : {"forward", "backward_input", "backward_weight"}) {
    auto* b = benchmark::RegisterBenchmark(
        ("Conv2D/" + label + "/" + phase).c_str(),
        [phase](benchmark::State& s) { conv_case<Gemm, Policy>(s, phase); });
    // batch, Cin, Cout, H = W: the CNN's three kinds of 3x3 / padding 1 layers
    // at its training batch (128) and a smaller one
    for (long batch : {128L, 32L})
      b->Args({batch, 1, 32, 28})->Args({batch, 32, 32, 14})->Args({batch, 32, 64, 14});
    b->Unit(benchmark::kMillisecond)->MinTime(0.2);
  }
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    using M = telar::DefaultMemorySpace;
    if constexpr (telar::OneDnnConv::supports<float, M>())
      register_policy<telar::AutoGemm, telar::OneDnnConv>("onednn-conv");
    if constexpr (telar::OneDnnGemm::supports<float, M>())
      register_policy<telar::OneDnnGemm, telar::Im2colConv>("im2col-onednn");
    if constexpr (telar::KokkosKernelsGemm::supports<float, M>())
      register_policy<telar::KokkosKernelsGemm, telar::Im2colConv>("im2col-kokkos-kernels");
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
  }
  MPI_Finalize();
  return 0;
}
