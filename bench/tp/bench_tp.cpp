// Tensor-parallel MLP block: ColumnParallel<Dense> -> GELU -> RowParallel<Dense>
// in fp32 over a tp group of every rank of the job, at the MLP's shapes.
//
//   OMP_NUM_THREADS=1 mpiexec -np 2 ./bench_tp [--batch 128] [--reps 50]
//       [--warmup 5] [--algorithm ring|mpi|rhd|hierarchical] [--shape in,hidden,out]...
//
// Per shape it prints the median over repetitions of the slowest rank's time
// for one step (forward and backward of the block: 2 GEMMs forward, 4 back),
// the same for the two allreduces alone, and the bytes handed to allreduce per
// step as counted by the layers next to the formula n*out*4 + n*in*4
// (forward sums y [n, out], backward sums dx [n, in]); "wire" is what a
// bandwidth-optimal allreduce sends per rank, 2(p-1)/p of that.
#include <telar/comm/allreduce.hpp>
#include <telar/comm/communicator.hpp>
#include <telar/core/gemm.hpp>
#include <telar/layers/activation.hpp>
#include <telar/parallel/tensor_parallel.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

struct Shape {
  std::size_t in, hidden, out;
};

struct Options {
  std::size_t batch = 128;
  int reps = 50;
  int warmup = 5;
  std::string algorithm = "ring";
  std::vector<Shape> shapes;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string const k = argv[i], v = argv[i + 1];
    if (k == "--batch")
      o.batch = std::stoull(v);
    else if (k == "--reps")
      o.reps = std::max(1, std::stoi(v));
    else if (k == "--warmup")
      o.warmup = std::stoi(v);
    else if (k == "--algorithm")
      o.algorithm = v;
    else if (k == "--shape") {
      Shape s{};
      if (std::sscanf(v.c_str(), "%zu,%zu,%zu", &s.in, &s.hidden, &s.out) != 3) {
        std::fprintf(stderr, "bench_tp: --shape wants in,hidden,out, got %s\n", v.c_str());
        std::exit(2);
      }
      o.shapes.push_back(s);
    } else {
      std::fprintf(stderr, "bench_tp: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  if (o.shapes.empty())
    o.shapes = {{784, 2048, 784}, {2048, 2048, 2048}};
  return o;
}

telar::TensorParallelAllreduce algorithm(std::string const& name) {
  if (name == "ring")
    return telar::RingAllreduce{};
  if (name == "mpi")
    return telar::MpiAllreduce{};
  if (name == "rhd")
    return telar::RecursiveHalvingDoubling{};
  if (name == "hierarchical")
    return telar::HierarchicalAllreduce{};
  std::fprintf(stderr, "bench_tp: unknown algorithm %s\n", name.c_str());
  std::exit(2);
}

// Median over repetitions of the slowest rank's time of `f`.
template <class F>
double median_time(telar::Communicator const& comm, int warmup, int reps, F&& f) {
  for (int i = 0; i < warmup; ++i)
    f();
  std::vector<double> t(static_cast<std::size_t>(reps));
  for (auto& ti : t) {
    comm.barrier();
    double const t0 = MPI_Wtime();
    f();
    ti = MPI_Wtime() - t0;
  }
  comm.allreduce(t.data(), t.size(), telar::ReduceOp::max);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

using Col = telar::ColumnParallel<telar::Dense<float>>;
using Row = telar::RowParallel<telar::Dense<float>>;
using Mat = telar::Matrix<float>;

void run_shape(telar::Communicator const& comm, Options const& o, Shape const& s) {
  int const p = comm.size();
  std::size_t const n = o.batch;
  telar::TensorParallelTraffic traffic;
  telar::TensorParallelContext ctx(comm, algorithm(o.algorithm), &traffic);
  Col col(s.in, s.hidden);
  telar::GELU<float> gelu;
  Row row(s.hidden, s.out);
  col.set_tensor_parallel(ctx);
  row.set_tensor_parallel(ctx);
  col.initialize(1);
  row.initialize(2);
  std::size_t const h = col.output_shape(s.in).size();
  Mat x("x", n, s.in), a("a", n, h), g("g", n, h), y("y", n, s.out);
  Mat dy("dy", n, s.out), dg("dg", n, h), da("da", n, h), dx("dx", n, s.in);
  Kokkos::deep_copy(x, 0.5f);
  Kokkos::deep_copy(dy, 0.01f);
  Col::saved_type cs;
  telar::GELU<float>::saved_type gs;
  Row::saved_type rs;
  Kokkos::DefaultExecutionSpace exec;
  auto step = [&] {
    col.forward(exec, x, a, cs);
    gelu.forward(exec, a, g, gs);
    row.forward(exec, g, y, rs);
    row.backward_weight(exec, dy, rs);
    row.backward_input(exec, dy, dg, rs);
    gelu.backward_input(exec, dg, da, gs);
    col.backward_weight(exec, da, cs);
    col.backward_input(exec, da, dx, cs);
    exec.fence();
  };
  double const t_step = median_time(comm, o.warmup, o.reps, step);
  traffic.reset();
  step();
  std::uint64_t const counted = traffic.bytes;
  // The same two reductions alone.
  auto comm_only = [&] {
    ctx.allreduce_sum(exec, y);
    ctx.allreduce_sum(exec, dx);
  };
  double const t_comm = median_time(comm, o.warmup, o.reps, comm_only);
  std::uint64_t const formula = p > 1 ? (n * s.out + n * s.in) * sizeof(float) : 0;
  double const wire = double(formula) * 2.0 * (p - 1) / p;
  double const flops = 3 * 2.0 * double(n) * double(h) * double(s.in + s.out); // per rank
  if (comm.rank() == 0) {
    std::printf("| %zu-%zu-%zu | %d | %zu | %.3f | %.1f | %.3f | %llu | %llu | %.0f |\n", s.in,
                s.hidden, s.out, p, h, t_step * 1e3, flops / t_step / 1e9, t_comm * 1e3,
                static_cast<unsigned long long>(counted), static_cast<unsigned long long>(formula),
                wire);
    std::fflush(stdout);
  }
  if (counted != formula) {
    std::fprintf(stderr, "bench_tp: rank %d counted %llu bytes, formula says %llu\n", comm.rank(),
                 static_cast<unsigned long long>(counted),
                 static_cast<unsigned long long>(formula));
    MPI_Abort(comm.native(), 3);
  }
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    Options const o = parse(argc, argv);
    {
      telar::Communicator comm(MPI_COMM_WORLD, "tp"); // a duplicate
      if (comm.rank() == 0) {
        char const* omp = std::getenv("OMP_NUM_THREADS");
        std::printf("# bench_tp: ColumnParallel<Dense<float>> -> GELU -> RowParallel<Dense<float>>"
                    "\n# tp=%d (every rank of the job), batch %zu, fp32, gemm %s, allreduce %s, "
                    "Kokkos %s, OMP_NUM_THREADS=%s, median of %d reps (slowest rank) after %d "
                    "warm-up\n\n",
                    comm.size(), o.batch,
                    telar::gemm_backend_name<float, telar::DefaultMemorySpace>(),
                    o.algorithm.c_str(), Kokkos::DefaultExecutionSpace::name(), omp ? omp : "unset",
                    o.reps, o.warmup);
        std::printf("| in-hidden-out | tp | hidden/rank | step ms | GFLOP/s/rank | allreduces "
                    "alone ms | bytes/step counted | n*out*4 + n*in*4 | wire bytes/rank "
                    "2(p-1)/p |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
      }
      for (auto const& s : o.shapes)
        run_shape(comm, o, s);
    }
  }
  MPI_Finalize();
  return 0;
}
