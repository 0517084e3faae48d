// Checkpoint write and read speed: the MLP 784-H-H-10 (H = 2048: 5.8 M
// parameters) with Adam's two state slots, fp32, so 3 x 23.3 MB per file.
//   [mpirun -np N] bench_checkpoint [--dir DIR] [--hidden 2048] [--repeats 5]
//        [--dp N] [--pp N] [--tp N] [--zero 0|1]
// Prints the median MB/s of save_checkpoint and load_checkpoint (file bytes
// of tensor data over the slowest rank's wall time) and one JSON line.
#include <telar/io/checkpoint.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/adam.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/train/trainer.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace {
struct Args {
  std::string dir = "bench_checkpoint_dir";
  std::size_t hidden = 2048;
  int repeats = 5, dp = 0, pp = 1, tp = 1, zero = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string const f = argv[i], v = argv[i + 1];
    if (f == "--dir")
      a.dir = v;
    else if (f == "--hidden")
      a.hidden = std::stoul(v);
    else if (f == "--repeats")
      a.repeats = std::stoi(v);
    else if (f == "--dp")
      a.dp = std::stoi(v);
    else if (f == "--pp")
      a.pp = std::stoi(v);
    else if (f == "--tp")
      a.tp = std::stoi(v);
    else if (f == "--zero")
      a.zero = std::stoi(v);
  }
  return a;
}

using Mlp = telar::Sequential<telar::ColumnParallel<telar::Dense<float>>, telar::ReLU<float>,
                              telar::RowParallel<telar::Dense<float>>, telar::ReLU<float>,
                              telar::Dense<float>>;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Strategy>
void run(Args const& a) {
  telar::TrainerOptions o;
  o.grid = {a.dp, a.pp, a.tp};
  o.microbatches = a.pp > 1 ? 2 : 1;
  telar::Trainer<Mlp, Strategy, telar::Adam<float>> t(
      MPI_COMM_WORLD,
      Mlp(telar::ColumnParallel<telar::Dense<float>>(784, a.hidden), {},
          telar::RowParallel<telar::Dense<float>>(a.hidden, a.hidden), {},
          telar::Dense<float>(a.hidden, 10)),
      telar::Adam<float>{}, o, 784);
  double const h = double(a.hidden);
  double const params = 784 * h + h + h * h + h + h * 10 + 10;
  double const mb = 3 * params * sizeof(float) / 1e6; // values, m, v
  std::vector<double> w, r;
  for (int i = 0; i < a.repeats; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    std::string const path = telar::save_checkpoint(t, a.dir, {}, {1});
    double dt = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    w.push_back(mb / dt);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    telar::load_checkpoint(t, path);
    dt = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    r.push_back(mb / dt);
  }
  if (t.rank() == 0) {
    std::printf("bench_checkpoint: %.2f M parameters + Adam state = %.1f MB, %s, %d ranks, "
                "median of %d: write %.0f MB/s, read %.0f MB/s\n",
                params / 1e6, mb, t.layout().c_str(), t.size(), a.repeats, median(w), median(r));
    std::printf("{\"params\":%.0f,\"mb\":%.2f,\"ranks\":%d,\"layout\":\"%s\",\"zero\":%d,"
                "\"write_mb_s\":%.1f,\"read_mb_s\":%.1f}\n",
                params, mb, t.size(), t.layout().c_str(), a.zero, median(w), median(r));
    std::error_code ec;
    std::filesystem::remove_all(a.dir, ec);
  }
}
} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    Args const a = parse(argc, argv);
    using Plain =
        telar::Strategy<telar::DataParallel<>, telar::PipelineParallel<>, telar::TensorParallel<>>;
    using Zero1 = telar::Strategy<telar::DataParallel<telar::RingAllreduce, telar::ZeRO<1>>,
                                  telar::PipelineParallel<>, telar::TensorParallel<>>;
    if (a.zero == 1)
      run<Zero1>(a);
    else
      run<Plain>(a);
  }
  MPI_Finalize();
  return 0;
}
