// Pre-norm transformer blocks (LayerNorm, causal attention, LayerNorm, MLP
// h -> 4h -> h with GELU) in fp32: the median over repetitions of one
// forward + backward (input and weight gradients) of --blocks blocks on
// [batch, seq, hidden].
//
//   OMP_NUM_THREADS=1 ./bench_transformer [--batch 8] [--seq 128] [--hidden 512]
//       [--heads 8] [--blocks 1] [--reps 20] [--warmup 3] [--precision fp32|bf16]
//       [--bf16-weight-copy 1|0]
//
// --precision bf16 (one rank) runs the same blocks rebound by
// telar::Precision<telar::bf16, float>: every GEMM of attention and MLP in
// bf16 with fp32 accumulation (docs/precision.md); block_torch.py
// --precision bf16 is PyTorch's CPU autocast on the same block. As a
// Trainer's step does (TrainerOptions::bf16_weight_copy, default on), the
// weights are rounded to bf16 once per repetition and read from that copy
// by forward and backward (the parameters in one flat buffer, the copy
// registered around each repetition); --bf16-weight-copy 0 converts them
// in every product, as a block outside a Trainer does.
//   OMP_NUM_THREADS=1 mpiexec -np 2 ./bench_transformer ...
//
// At one rank it times telar::TransformerBlock (block_torch.py times the same
// computation with torch.nn). At p ranks the blocks are
// TensorParallelTransformerBlock with the heads and the MLP split over a tp
// group of every rank: it prints the slowest rank's median and the bytes the
// layers handed to allreduce per step next to Megatron's formula, 4
// allreduces of batch x seq x hidden values per block per step (2 forward,
// 2 backward).
#include <telar/comm/communicator.hpp>
#include <telar/core/detail/bf16_copy.hpp>
#include <telar/layers/transformer.hpp>
#include <telar/parallel/precision.hpp>
#include <telar/parallel/tensor_parallel_attention.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using T = float;
using Mat = telar::Matrix<T>;
using Exec = Kokkos::DefaultExecutionSpace;

struct Options {
  std::size_t batch = 8, seq = 128, hidden = 512, heads = 8, blocks = 1;
  int reps = 20, warmup = 3;
  bool bf16 = false;
  bool weight_copy = true; // --bf16-weight-copy
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    std::string const k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_transformer: %s needs a value\n", k.c_str());
      std::exit(2);
    }
    // A flag of two spellings: whether it is the second one.
    auto second = [&](char const* a, char const* b) {
      std::string const v = argv[i + 1];
      if (v != a && v != b) {
        std::fprintf(stderr, "bench_transformer: %s expects %s or %s, got '%s'\n", k.c_str(), a, b,
                     v.c_str());
        std::exit(2);
      }
      return v == b;
    };
    if (k == "--precision") {
      o.bf16 = second("fp32", "bf16");
      continue;
    }
    if (k == "--bf16-weight-copy") {
      o.weight_copy = second("0", "1");
      continue;
    }
    long const v = std::atol(argv[i + 1]);
    if (v < 1) {
      std::fprintf(stderr, "bench_transformer: %s wants a positive integer\n", k.c_str());
      std::exit(2);
    }
    if (k == "--batch")
      o.batch = std::size_t(v);
    else if (k == "--seq")
      o.seq = std::size_t(v);
    else if (k == "--hidden")
      o.hidden = std::size_t(v);
    else if (k == "--heads")
      o.heads = std::size_t(v);
    else if (k == "--blocks")
      o.blocks = std::size_t(v);
    else if (k == "--reps")
      o.reps = int(v);
    else if (k == "--warmup")
      o.warmup = int(v);
    else {
      std::fprintf(stderr, "bench_transformer: unknown flag %s\n", k.c_str());
      std::exit(2);
    }
  }
  return o;
}

Mat random(std::size_t n, std::size_t k, unsigned seed) {
  Mat m("m", n, k);
  auto h = Kokkos::create_mirror_view(m);
  std::srand(seed);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < k; ++j)
      h(i, j) = T(std::rand()) / T(RAND_MAX) - T(0.5);
  Kokkos::deep_copy(m, h);
  return m;
}

// The blocks' parameters moved into one buffer (their views rebound to it,
// as a Trainer's telar::ParameterStore does), with room for its bf16 words:
// what telar::detail::Bf16CopyScope registers around a repetition.
struct FlatWeights {
  telar::Vector<T> values;
  Kokkos::View<std::uint16_t*, telar::DefaultMemorySpace> words;
};
template <class Block>
FlatWeights flatten(std::vector<Block>& blocks) {
  std::size_t n = 0;
  for (auto& b : blocks)
    b.parameters([&](char const*, auto& v, auto&) { n += v.span(); });
  FlatWeights f{
      telar::Vector<T>("bench_transformer::values", n),
      Kokkos::View<std::uint16_t*, telar::DefaultMemorySpace>("bench_transformer::words", n)};
  std::size_t at = 0;
  for (auto& b : blocks)
    b.parameters([&](char const*, auto& v, auto&) {
      using V = std::decay_t<decltype(v)>;
      V const to(f.values.data() + at, v.layout());
      Kokkos::deep_copy(to, v);
      v = to;
      at += v.span();
    });
  return f;
}

// Median over reps of the slowest rank's forward + backward of every block.
template <class Block>
double time_blocks(std::vector<Block>& blocks, Options const& o, MPI_Comm comm,
                   telar::TensorParallelTraffic* traffic, telar::TensorParallelTraffic* counted) {
  telar::Shape const in{o.seq, o.hidden};
  std::size_t const n = o.batch, k = o.seq * o.hidden, L = blocks.size();
  std::vector<typename telar::layer_traits<Block>::saved_type> saved(L);
  std::vector<Mat> act(L + 1), grad(L + 1);
  act[0] = random(n, k, 1);
  grad[L] = random(n, k, 2);
  for (std::size_t l = 0; l < L; ++l) {
    blocks[l].build(in);
    blocks[l].initialize(7 + l);
    act[l + 1] = Mat("a", n, k);
    grad[l] = Mat("g", n, k);
  }
  FlatWeights flat;
  if (o.bf16 && o.weight_copy)
    flat = flatten(blocks);
  std::vector<double> ms;
  for (int r = 0; r < o.warmup + o.reps; ++r) {
    if (r == o.warmup && traffic != nullptr)
      traffic->reset(); // count one step only
    MPI_Barrier(comm);
    auto const t0 = std::chrono::steady_clock::now();
    telar::detail::Bf16CopyScope const copy(flat.values.data(), flat.values.size(),
                                            flat.words.size() ? flat.words.data() : nullptr);
    for (std::size_t l = 0; l < L; ++l)
      blocks[l].forward(Exec{}, act[l], act[l + 1], saved[l]);
    for (std::size_t l = L; l-- > 0;) {
      blocks[l].backward_input(Exec{}, grad[l + 1], grad[l], saved[l]);
      blocks[l].backward_weight(Exec{}, grad[l + 1], saved[l]);
    }
    Exec{}.fence();
    double t =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm);
    if (r >= o.warmup)
      ms.push_back(t);
    if (r == o.warmup && traffic != nullptr)
      *counted = *traffic; // the first timed step
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// One rank: telar::TransformerBlock under precision policy P.
template <class P>
double time_serial(Options const& o) {
  using Block = telar::WithPrecision<telar::TransformerBlock<T>, P>;
  std::vector<Block> blocks;
  for (std::size_t l = 0; l < o.blocks; ++l)
    blocks.push_back(telar::with_precision<P>(telar::make_transformer_block<T>(o.hidden, o.heads)));
  return time_blocks(blocks, o, MPI_COMM_WORLD, nullptr, nullptr);
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    Options const o = parse(argc, argv);
    int p = 1, me = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    double const tokens = double(o.batch * o.seq);
    if (p == 1) {
      double const ms = o.bf16 ? time_serial<telar::Precision<telar::bf16, float>>(o)
                               : time_serial<telar::Precision<float, float>>(o);
      std::printf("telar TransformerBlock x%zu: batch %zu seq %zu hidden %zu heads %zu %s, "
                  "forward+backward median %.2f ms (%.0f tokens/s), %d reps, threads %d, "
                  "gemm kernels %s%s, host loops %s\n",
                  o.blocks, o.batch, o.seq, o.hidden, o.heads, o.bf16 ? "bf16" : "fp32", ms,
                  tokens / ms * 1e3, o.reps, Exec().concurrency(),
                  o.bf16 ? telar::bf16_kernels().c_str()
                         : telar::gemm_backend_name<T, telar::DefaultMemorySpace>(),
                  o.bf16 ? (o.weight_copy ? ", weights rounded once a repetition"
                                          : ", weights converted in every product")
                         : "",
                  telar::host_loops());
      if (o.bf16 && o.weight_copy)
        std::printf("weight copy: %llu products read it, %llu conversions into it\n",
                    (unsigned long long)telar::detail::bf16_copy().hits,
                    (unsigned long long)telar::detail::bf16_copy().conversions);
    } else {
      if (o.bf16) {
        std::fprintf(stderr, "bench_transformer: --precision bf16 runs at one rank\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
      telar::Communicator world(MPI_COMM_WORLD, "bench_transformer");
      telar::TensorParallelTraffic traffic;
      telar::TensorParallelContext ctx(world, telar::RingAllreduce{}, &traffic);
      std::vector<telar::TensorParallelTransformerBlock<T>> blocks;
      for (std::size_t l = 0; l < o.blocks; ++l) {
        blocks.push_back(telar::make_tensor_parallel_transformer_block<T>(o.hidden, o.heads));
        telar::set_tensor_parallel(blocks.back(), ctx);
      }
      telar::TensorParallelTraffic step;
      double const ms = time_blocks(blocks, o, MPI_COMM_WORLD, &traffic, &step);
      double const formula = 4.0 * double(o.blocks) * tokens * double(o.hidden) * sizeof(T);
      if (me == 0)
        std::printf("telar TensorParallelTransformerBlock x%zu at tp=%d: batch %zu seq %zu hidden "
                    "%zu heads %zu fp32, forward+backward median %.2f ms (slowest rank), "
                    "allreduced per step %llu calls, %.3f MB (formula 4 x blocks x batch x seq x "
                    "hidden x 4 B = %.3f MB)\n",
                    o.blocks, p, o.batch, o.seq, o.hidden, o.heads, ms,
                    (unsigned long long)step.allreduces, double(step.bytes) / 1e6, formula / 1e6);
    }
  }
  MPI_Finalize();
  return 0;
}
