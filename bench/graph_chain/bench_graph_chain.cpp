// A serial training step of tests/unet.hpp's U-Net (width 8, 3x32x32 inputs,
// batch 16, float, LocalStats) as a telar::GraphChain (one unit per node, the
// model a pipeline cuts inside) against the same graph as the one layer of a
// telar::Sequential. Each round times `steps` steps of one, then of the
// other (after a warm-up step each); prints every round and the median of
// the per-round ratios. Usage: bench_graph_chain [rounds=5] [steps=10]
// (OMP_NUM_THREADS=1 for one core).
#include "unet.hpp"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mpi.h>
#include <telar/core/graph_chain.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/train/trainer.hpp>
#include <vector>
using T = float;
using GL = telar::test::unet::GraphLayer<T, telar::LocalStats>;
using Strat = telar::Strategy<telar::DataParallel<telar::RingAllreduce, telar::NoSharding>,
                              telar::PipelineParallel<>, telar::TensorParallel<>>;
template <class M>
double run(M model, telar::Matrix<T> x, telar::Labels<> y, int steps) {
  telar::TrainerOptions o;
  o.batch_size = x.extent(0);
  telar::Trainer<M, Strat, telar::SGD<T>> tr(MPI_COMM_SELF, std::move(model), telar::SGD<T>{}, o,
                                             telar::Shape{3, 32, 32});
  tr.step(x, y); // warm
  Kokkos::fence();
  auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s)
    tr.step(x, y);
  Kokkos::fence();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps * 1e3;
}
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  {
    int rounds = argc > 1 ? std::atoi(argv[1]) : 5, steps = argc > 2 ? std::atoi(argv[2]) : 10;
    std::size_t const batch = 16;
    telar::Matrix<T> x("x", batch, 3 * 32 * 32);
    telar::Labels<> y("y", batch);
    auto hx = Kokkos::create_mirror_view(x);
    auto hy = Kokkos::create_mirror_view(y);
    for (std::size_t i = 0; i < batch; ++i) {
      hy(i) = int(i % 10);
      for (std::size_t j = 0; j < x.extent(1); ++j)
        hx(i, j) = T(std::sin(0.1 * double(i * 7 + j)));
    }
    Kokkos::deep_copy(x, hx);
    Kokkos::deep_copy(y, hy);
    auto g = [] { return telar::test::unet::make_graph<T, telar::LocalStats>(3, 32, 8, 10); };
    std::vector<double> ratio;
    for (int r = 0; r < rounds; ++r) {
      double const a = run(telar::Sequential<telar::DynamicGraph<GL>>(g()), x, y, steps);
      double const b = run(telar::GraphChain<GL>(g()), x, y, steps);
      ratio.push_back(b / a);
      std::printf("round %d: graph as layer %.2f ms, GraphChain %.2f ms, ratio %.3f\n", r, a, b,
                  b / a);
    }
    std::sort(ratio.begin(), ratio.end());
    std::printf("median ratio GraphChain / layer: %.3f (%d rounds x %d steps)\n",
                ratio[ratio.size() / 2], rounds, steps);
  }
  Kokkos::finalize();
  MPI_Finalize();
}
