// Kernel launches per training step (one forward and backward, counted by
// telar::step_launches) of the GPT block, a two-block GPT, the CNN of
// examples/02_cnn and a ResNet of basic blocks (examples/06_resnet), at
// batch 2 and 8 and, for the transformers, two head counts; then the median
// step time of the GPT block at each head count. Each configuration is
// counted with the default policies (Kokkos kernels + oneDNN/BLAS calls) and
// with every product a Kokkos kernel (ReferenceGemm, Im2colConv: what a
// device launches). No time is asserted.
//
//   OMP_NUM_THREADS=1 ./bench_launches [--reps 15] [--seq 64] [--hidden 128]
//       [--counts 0 (times only)]
#include <telar/core/residual.hpp>
#include <telar/core/sequential.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/batch_norm.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/embedding.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/layers/transformer.hpp>
#include <telar/testing/launches.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using T = float;
using M = telar::DefaultMemorySpace;
using Exec = M::execution_space;
using Ref = telar::ReferenceGemm;

template <class Gemm>
using Attn = telar::Residual<telar::LayerNorm<T>, telar::CausalSelfAttention<T, M, Gemm>>;
template <class Gemm>
using Mlp = telar::Residual<telar::LayerNorm<T>, telar::Dense<T, M, Gemm>, telar::GELU<T>,
                            telar::Dense<T, M, Gemm>>;
template <class Gemm>
using Block = telar::Sequential<Attn<Gemm>, Mlp<Gemm>>;

template <class Gemm>
Block<Gemm> block(std::size_t hidden, std::size_t heads) {
  using D = telar::Dense<T, M, Gemm>;
  return Block<Gemm>(Attn<Gemm>(telar::LayerNorm<T>(hidden),
                                telar::CausalSelfAttention<T, M, Gemm>(hidden, heads)),
                     Mlp<Gemm>(telar::LayerNorm<T>(hidden), D(hidden, 4 * hidden), telar::GELU<T>{},
                               D(4 * hidden, hidden)));
}

template <class Gemm>
auto gpt(std::size_t seq, std::size_t hidden, std::size_t heads) {
  using G = telar::Sequential<telar::Embedding<T>, telar::PositionalEmbedding<T>, Block<Gemm>,
                              Block<Gemm>, telar::LayerNorm<T>, telar::Dense<T, M, Gemm>>;
  return G(telar::Embedding<T>(256, hidden), telar::PositionalEmbedding<T>(seq, hidden),
           block<Gemm>(hidden, heads), block<Gemm>(hidden, heads), telar::LayerNorm<T>(hidden),
           telar::Dense<T, M, Gemm>(hidden, 256));
}

// examples/02_cnn's network on 28 x 28 images.
template <class Gemm, class ConvPolicy>
auto cnn() {
  using C = telar::Conv2D<T, M, Gemm, ConvPolicy>;
  using R = telar::ReLU<T>;
  using P = telar::MaxPool2D<T>;
  using D = telar::Dense<T, M, Gemm>;
  using B = telar::Residual<C, R, C>;
  using Net = telar::Sequential<C, R, P, B, R, C, R, P, telar::Flatten<T>, D, R, D>;
  return Net(C(1, 32, 3, 1, 1), R{}, P(2), B(C(32, 32, 3, 1, 1), R{}, C(32, 32, 3, 1, 1)), R{},
             C(32, 64, 3, 1, 1), R{}, P(2), telar::Flatten<T>{}, D(64 * 7 * 7, 64), R{}, D(64, 10));
}

// A stem and two basic blocks (one down-sampling) of examples/06_resnet's
// CIFAR ResNet at width 16 on 32 x 32 images.
template <class Gemm, class ConvPolicy>
auto resnet() {
  using C = telar::Conv2D<T, M, Gemm, ConvPolicy>;
  using BN = telar::BatchNorm<T>;
  using R = telar::ReLU<T>;
  using Short = telar::Sequential<C, BN>;
  using Basic = telar::Residual<C, BN, R, C, BN>;
  using Down = telar::ProjectedResidual<Short, C, BN, R, C, BN>;
  using Net =
      telar::Sequential<C, BN, R, Basic, Down, telar::GlobalAvgPool<T>, telar::Dense<T, M, Gemm>>;
  auto conv = [](std::size_t in, std::size_t out, std::size_t k, std::size_t s) {
    return C(in, out, k, s, k / 2, false);
  };
  return Net(conv(3, 16, 3, 1), BN(16), R{},
             Basic(conv(16, 16, 3, 1), BN(16), R{}, conv(16, 16, 3, 1), BN(16)),
             Down(Short(conv(16, 32, 1, 2), BN(32)), conv(16, 32, 3, 2), BN(32), R{},
                  conv(32, 32, 3, 1), BN(32)),
             telar::GlobalAvgPool<T>{}, telar::Dense<T, M, Gemm>(32, 10));
}

template <class Make>
void count(char const* what, Make make, telar::Shape const& in) {
  std::printf("%-32s", what);
  for (std::size_t n : {2, 8}) {
    auto layer = make();
    auto const c = telar::step_launches(layer, in, n);
    std::printf("  batch %zu: %6llu kernels %6llu library", n, (unsigned long long)c.kernels,
                (unsigned long long)c.library_calls);
  }
  std::printf("\n");
}

double median_step_ms(std::size_t batch, std::size_t seq, std::size_t hidden, std::size_t heads,
                      int reps) {
  auto b = telar::make_transformer_block<T>(hidden, heads);
  telar::Shape const in{seq, hidden};
  b.build(in);
  b.initialize(1);
  telar::Matrix<T> x("x", batch, in.size()), y("y", batch, in.size()), dy("dy", batch, in.size()),
      dx("dx", batch, in.size());
  Kokkos::deep_copy(x, T(0.5));
  Kokkos::deep_copy(dy, T(0.25));
  decltype(b)::saved_type saved;
  std::vector<double> ms;
  for (int r = 0; r < reps + 2; ++r) {
    auto const t0 = std::chrono::steady_clock::now();
    b.forward(Exec{}, x, y, saved);
    telar::detail::run_backward(b, Exec{}, dy, dx, saved);
    Exec{}.fence();
    if (r >= 2) // two warm-up steps
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void print_counts(std::size_t seq, std::size_t hidden) {
  std::printf("launches per step (forward + backward), seq %zu, hidden %zu\n", seq, hidden);
  for (std::size_t heads : {4, 8}) {
    std::string const h = " heads " + std::to_string(heads);
    count(("GPT block" + h).c_str(), [&] { return block<telar::AutoGemm>(hidden, heads); },
          {seq, hidden});
    count(("GPT block, ref GEMM" + h).c_str(), [&] { return block<Ref>(hidden, heads); },
          {seq, hidden});
    count(("GPT 2 blocks" + h).c_str(), [&] { return gpt<telar::AutoGemm>(seq, hidden, heads); },
          {seq});
    count(("GPT 2 blocks, ref GEMM" + h).c_str(), [&] { return gpt<Ref>(seq, hidden, heads); },
          {seq});
  }
  count("CNN", [] { return cnn<telar::AutoGemm, telar::AutoConv>(); }, {1, 28, 28});
  count("CNN, ref GEMM + im2col", [] { return cnn<Ref, telar::Im2colConv>(); }, {1, 28, 28});
  count("ResNet", [] { return resnet<telar::AutoGemm, telar::AutoConv>(); }, {3, 32, 32});
  count("ResNet, ref GEMM + im2col", [] { return resnet<Ref, telar::Im2colConv>(); }, {3, 32, 32});
}

} // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  std::size_t seq = 64, hidden = 128;
  int reps = 15, counts = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string const k = argv[i];
    long const v = std::atol(argv[i + 1]);
    if (k == "--seq")
      seq = std::size_t(v);
    else if (k == "--hidden")
      hidden = std::size_t(v);
    else if (k == "--reps")
      reps = int(v);
    else if (k == "--counts")
      counts = int(v);
  }
  if (counts)
    print_counts(seq, hidden);
  std::printf("GPT block step, seq %zu, hidden %zu, median of %d (ms):", seq, hidden, reps);
  for (std::size_t batch : {2, 8})
    for (std::size_t heads : {4, 8})
      std::printf("  b%zu h%zu %.3f", batch, heads,
                  median_step_ms(batch, seq, hidden, heads, reps));
  std::printf("\n");
}
