// Conv2D forward / backward GFLOP/s at the shapes of example 02's CNN, per
// convolution policy (oneDNN primitives; im2col + GEMM per GEMM policy), and
// a depthwise Conv2D and a ConvTranspose2D (oneDNN vs im2col + GEMM).
//   OMP_NUM_THREADS=1 bench_conv [--benchmark_filter=...]
// Each row's `GFLOP/s` counter is 2 * batch * Cout * Ho * Wo * Cin * k * k per
// second (the same count for all three phases).
#include <telar/layers/conv.hpp>
#include <telar/layers/conv_transpose.hpp>

#include <benchmark/benchmark.h>

#include <mpi.h>

#include <string>

namespace {

// One phase of layer `conv` (any convolution layer) over a batch of n.
template <class C>
void run_phase(benchmark::State& state, C conv, std::size_t n, telar::Shape const& in,
               char const* phase) {
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
}

template <class Gemm, class Policy>
void conv_case(benchmark::State& state, char const* phase) {
  std::size_t const n = state.range(0), cin = state.range(1), cout = state.range(2),
                    hw = state.range(3);
  using C = telar::Conv2D<float, telar::DefaultMemorySpace, Gemm, Policy>;
  run_phase(state, C(cin, cout, 3, 1, 1), n, telar::Shape{cin, hw, hw}, phase);
  state.SetLabel(std::string(Policy::name()) + "/" + Gemm::name());
}

// Batch, channels, H = W: a depthwise 3x3 / padding 1 convolution (groups =
// channels) and a 2x2 / stride 2 transposed convolution from channels to
// channels / 2 (a U-Net's upsampling step).
template <class Policy>
void grouped_case(benchmark::State& state, char const* phase) {
  std::size_t const n = state.range(0), c = state.range(1), hw = state.range(2);
  using C = telar::Conv2D<float, telar::DefaultMemorySpace, telar::AutoGemm, Policy>;
  run_phase(state, C(c, c, 3, 1, 1, true, 1, c), n, telar::Shape{c, hw, hw}, phase);
  state.SetLabel(Policy::name());
}
template <class Policy>
void transposed_case(benchmark::State& state, char const* phase) {
  std::size_t const n = state.range(0), c = state.range(1), hw = state.range(2);
  using C = telar::ConvTranspose2D<float, telar::DefaultMemorySpace, telar::AutoGemm, Policy>;
  run_phase(state, C(c, c / 2, 2, 2), n, telar::Shape{c, hw, hw}, phase);
  state.SetLabel(Policy::name());
}

template <class Policy>
void register_layers(std::string const& label) {
  for (char const* phase : {"forward", "backward_input", "backward_weight"}) {
    benchmark::RegisterBenchmark(("DepthwiseConv2D/" + label + "/" + phase).c_str(),
                                 [phase](benchmark::State& s) { grouped_case<Policy>(s, phase); })
        ->Args({32, 64, 28})
        ->Unit(benchmark::kMillisecond)
        ->MinTime(0.2);
    benchmark::RegisterBenchmark(
        ("ConvTranspose2D/" + label + "/" + phase).c_str(),
        [phase](benchmark::State& s) { transposed_case<Policy>(s, phase); })
        ->Args({32, 64, 14})
        ->Unit(benchmark::kMillisecond)
        ->MinTime(0.2);
  }
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
    if constexpr (telar::OneDnnConv::supports<float, M>()) {
      register_policy<telar::AutoGemm, telar::OneDnnConv>("onednn-conv");
      register_layers<telar::OneDnnConv>("onednn-conv");
    }
    register_layers<telar::Im2colConv>("im2col");
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
