// Step time of the MLP 784-H-H-10 (ReLU, softmax cross-entropy, SGD), fp32
// or bf16 GEMMs with fp32 master weights (--precision, docs/precision.md),
// synthetic data: the model bench/peers/mlp_torch.py runs in PyTorch.
//   [mpirun -np N] bench_mlp_step [--batch 128] [--steps 30] [--warmup 5] [--hidden 2048]
//        [--dp N] [--pp N] [--tp N] [--microbatches M] [--schedule 1f1b]
//        [--algorithm ring|mpi|rhd|hier|auto] [--bucket-mb 8] [--timeline PREFIX]
//        [--precision fp32|bf16] [--bf16-weight-copy 1|0]
// --precision bf16 (telar::Bf16Gemm) runs with the ring allreduce and no sharding.
// --batch is per data-parallel rank (weak scaling). Prints the configuration,
// the median and mean step time (slowest rank), and one JSON line.
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/train/trainer.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

namespace {
struct Args {
  std::size_t batch = 128, hidden = 2048;
  int steps = 30, warmup = 5, dp = 0, pp = 1, tp = 1, microbatches = 1;
  double bucket_mb = 8;
  std::string schedule = "1f1b", algorithm = "ring", timeline, precision = "fp32";
  int zero = 0, shared_memory = 1, bf16_weight_copy = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string const f = argv[i], v = argv[i + 1];
    if (f == "--batch")
      a.batch = std::stoul(v);
    else if (f == "--hidden")
      a.hidden = std::stoul(v);
    else if (f == "--steps")
      a.steps = std::stoi(v);
    else if (f == "--warmup")
      a.warmup = std::stoi(v);
    else if (f == "--dp")
      a.dp = std::stoi(v);
    else if (f == "--pp")
      a.pp = std::stoi(v);
    else if (f == "--tp")
      a.tp = std::stoi(v);
    else if (f == "--microbatches")
      a.microbatches = std::stoi(v);
    else if (f == "--schedule")
      a.schedule = v;
    else if (f == "--algorithm")
      a.algorithm = v;
    else if (f == "--bucket-mb")
      a.bucket_mb = std::stod(v);
    else if (f == "--timeline")
      a.timeline = v;
    else if (f == "--zero")
      a.zero = std::stoi(v);
    else if (f == "--precision")
      a.precision = v;
    else if (f == "--shared-memory")
      a.shared_memory = std::stoi(v);
    else if (f == "--bf16-weight-copy") // TrainerOptions::bf16_weight_copy
      a.bf16_weight_copy = std::stoi(v);
    else
      throw std::invalid_argument("bench_mlp_step: unknown flag " + f);
  }
  return a;
}

using R = telar::ReLU<float>;

// Gemm = Bf16Gemm: the strategy's Precision<bf16, float> policy, which
// rebinds the layers to Bf16Gemm (and keeps the bf16 weight copy).
template <class Algorithm, class Sharding, class Gemm = telar::AutoGemm>
int run(Args const& a) {
  using D = telar::Dense<float, telar::DefaultMemorySpace>;
  // The first two layers are a Megatron pair under --tp (plain Dense at tp 1).
  using Col = telar::ColumnParallel<D>;
  using Row = telar::RowParallel<D>;
  using Model = telar::Sequential<Col, R, Row, R, D>;
  using G = std::conditional_t<std::is_same_v<Gemm, telar::AutoGemm>,
                               telar::AutoGemm::select<float, telar::DefaultMemorySpace>, Gemm>;
  bool const bf16 = std::is_same_v<G, telar::Bf16Gemm>;
  using Precision = std::conditional_t<bf16, telar::Precision<telar::bf16, float>,
                                       telar::Precision<float, float>>;
  using Strategy = telar::Strategy<telar::DataParallel<Algorithm, Sharding>,
                                   telar::PipelineParallel<>, telar::TensorParallel<>, Precision>;
  telar::TrainerOptions opts;
  opts.seed = 1;
  opts.grid = {a.dp, a.pp, a.tp};
  opts.microbatches = a.microbatches;
  opts.schedule = a.schedule;
  opts.bucket_bytes = std::size_t(a.bucket_mb * (1 << 20));
  opts.trace = !a.timeline.empty();
  opts.shared_memory = a.shared_memory != 0;
  opts.bf16_weight_copy = a.bf16_weight_copy != 0;
  telar::Trainer<Model, Strategy, telar::SGD<float>> trainer(
      MPI_COMM_WORLD, Model(Col(784, a.hidden), {}, Row(a.hidden, a.hidden), {}, D(a.hidden, 10)),
      {}, opts, 784);

  telar::Matrix<float> x("x", a.batch, 784);
  telar::Labels<> y("y", a.batch);
  auto hx = Kokkos::create_mirror_view(x);
  auto hy = Kokkos::create_mirror_view(y);
  for (std::size_t i = 0; i < a.batch; ++i) {
    hy(i) = int(i % 10);
    for (std::size_t j = 0; j < 784; ++j)
      hx(i, j) = float((i * 784 + j) % 97) / 97.f;
  }
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(y, hy);

  std::vector<double> ms;
  for (int s = 0; s < a.warmup + a.steps; ++s) {
    if (s == a.warmup)
      trainer.clear_trace();
    MPI_Barrier(MPI_COMM_WORLD); // steps start together; the slowest rank sets the time
    double const t0 = MPI_Wtime();
    trainer.step(x, y);
    double dt = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (s >= a.warmup)
      ms.push_back(dt * 1e3);
  }
  if (!a.timeline.empty())
    trainer.write_trace(a.timeline + ".json");
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  double const median = sorted[sorted.size() / 2];
  double const mean = std::accumulate(ms.begin(), ms.end(), 0.0) / double(ms.size());
  if (trainer.rank() == 0) {
    char const* threads = std::getenv("OMP_NUM_THREADS");
    // Which kernels multiplied: oneDNN's bf16 matmul implementations as it
    // reported them, or the fp32 library call.
    std::string const kernels = bf16                                   ? telar::bf16_kernels()
                                : std::is_same_v<G, telar::OneDnnGemm> ? std::string("dnnl_sgemm")
                                                                       : std::string(G::name());
    std::printf("# telar MLP 784-%zu-%zu-10, batch %zu per dp rank, %s, SGD, gemm %s (%s), "
                "%d ranks (%s), schedule %s, %d micro-batches, allreduce %s, sharding %s%s, "
                "buckets %.1f MiB (%zu on rank 0), OMP_NUM_THREADS=%s, %d steps after %d "
                "warm-up\n",
                a.hidden, a.hidden, a.batch, bf16 ? "bf16 compute, fp32 master weights" : "fp32",
                G::name(), kernels.c_str(), trainer.size(), trainer.layout().c_str(),
                trainer.pipeline_schedule().name.c_str(), a.microbatches, Algorithm::name(),
                Sharding::name(),
                Sharding::stage > 0 ? (a.shared_memory ? " (shared memory)" : " (messages)") : "",
                a.bucket_mb, trainer.bucket_count(), threads ? threads : "unset", a.steps,
                a.warmup);
    std::printf("step_ms median %.2f mean %.2f min %.2f\n", median, mean, sorted.front());
    std::printf("{\"peer\":\"telar\",\"ranks\":%d,\"layout\":\"%s\",\"batch_per_rank\":%zu,"
                "\"hidden\":%zu,\"step_ms_median\":%.3f,\"step_ms_mean\":%.3f,"
                "\"algorithm\":\"%s\",\"sharding\":\"%s\",\"precision\":\"%s\","
                "\"gemm\":\"%s\",\"gemm_kernels\":\"%s\",\"bf16_weight_copy\":%s,"
                "\"host_loops\":\"%s\"}\n",
                trainer.size(), trainer.layout().c_str(), a.batch, a.hidden, median, mean,
                Algorithm::name(), Sharding::name(), bf16 ? "bf16" : "fp32", G::name(),
                kernels.c_str(), bf16 && a.bf16_weight_copy ? "true" : "false",
                telar::host_loops());
  }
  return 0;
}
} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      Args const a = parse(argc, argv);
      if (a.precision == "bf16") {
        if (a.zero != 0 || a.algorithm != "ring")
          throw std::invalid_argument(
              "bench_mlp_step: --precision bf16 runs with --algorithm ring and --zero 0");
        if constexpr (telar::bf16_layers_supported<float, telar::DefaultMemorySpace>())
          rc = run<telar::RingAllreduce, telar::NoSharding, telar::Bf16Gemm>(a);
        else
          throw std::invalid_argument("bench_mlp_step: --precision bf16 needs oneDNN (host memory) "
                                      "or cuBLAS (CUDA memory)");
      } else if (a.precision != "fp32")
        throw std::invalid_argument("bench_mlp_step: --precision takes fp32 or bf16");
      else if (a.zero == 1)
        rc = run<telar::RingAllreduce, telar::ZeRO<1>>(a);
      else if (a.zero != 0)
        throw std::invalid_argument("bench_mlp_step: --zero takes 0 or 1");
      else if (a.algorithm == "ring")
        rc = run<telar::RingAllreduce, telar::NoSharding>(a);
      else if (a.algorithm == "mpi")
        rc = run<telar::MpiAllreduce, telar::NoSharding>(a);
      else if (a.algorithm == "rhd")
        rc = run<telar::RecursiveHalvingDoubling, telar::NoSharding>(a);
      else if (a.algorithm == "hier")
        rc = run<telar::HierarchicalAllreduce, telar::NoSharding>(a);
      else if (a.algorithm == "auto") // TELAR_ALLREDUCE=flat|hierarchical overrides
        rc = run<telar::TopologyAwareAllreduce, telar::NoSharding>(a);
      else
        throw std::invalid_argument("bench_mlp_step: unknown --algorithm " + a.algorithm);
    } catch (std::exception const& e) {
      std::fprintf(stderr, "bench_mlp_step: %s\n", e.what());
      rc = 1;
    }
  }
  MPI_Finalize();
  return rc;
}
