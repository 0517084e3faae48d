// 1000 gradient tensors of 4 KB through Telar's data-parallel buckets, next
// to one 4 MB allreduce (ring and MPI_Allreduce), at whatever rank count.
//   mpirun -np 2 bench_buckets [--reps 50]
// The tensors belong to 10 layers of 100 tensors each; a step announces the
// layers last to first, as backward does, and waits for every bucket.
#include <telar/comm/allreduce.hpp>
#include <telar/core/parameters.hpp>
#include <telar/core/sequential.hpp>
#include <telar/parallel/detail/gradient_buckets.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

// A layer that only owns 100 parameter tensors of 1024 floats (4 KB each).
struct ManyTensors {
  using value_type = float;
  using memory_space = telar::DefaultMemorySpace;
  static constexpr int count = 100;
  std::vector<telar::Vector<float>> values, grads;
  telar::Shape output_shape(telar::Shape const& in) const { return in; }
  void initialize(std::uint64_t) {
    for (int i = 0; i < count; ++i) {
      values.emplace_back("v", 1024);
      grads.emplace_back("g", 1024);
    }
  }
  template <class F>
  void parameters(F&& f) {
    for (int i = 0; i < count; ++i)
      f("t", values[std::size_t(i)], grads[std::size_t(i)]);
  }
  template <class E>
  void forward(E const&, telar::ConstMatrix<float>, telar::Matrix<float>, telar::NoSaved&) const {}
  template <class E>
  void backward_input(E const&, telar::ConstMatrix<float>, telar::Matrix<float>,
                      telar::NoSaved const&) const {}
  template <class E>
  void backward_weight(E const&, telar::ConstMatrix<float>, telar::NoSaved const&) const {}
};
using L = ManyTensors;
using Model = telar::Sequential<L, L, L, L, L, L, L, L, L, L>;

double median_ms(std::function<void()> const& f, int reps) {
  std::vector<double> t;
  for (int r = 0; r < reps + 3; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    double const t0 = MPI_Wtime();
    f();
    double dt = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r >= 3)
      t.push_back(dt * 1e3);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int reps = 50;
    for (int i = 1; i + 1 < argc; ++i)
      if (std::strcmp(argv[i], "--reps") == 0)
        reps = std::atoi(argv[i + 1]);
    telar::Communicator comm(MPI_COMM_WORLD, "bench");
    Model model;
    model.initialize(1);
    telar::ParameterStore<float, telar::DefaultMemorySpace> store;
    store.bind(model, 0, Model::size);
    std::size_t const n = store.size();
    Kokkos::DefaultExecutionSpace exec;

    std::vector<float> packed(n, 1.f);
    double const t_mpi = median_ms(
        [&] {
          MPI_Allreduce(MPI_IN_PLACE, packed.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        },
        reps);
    double const t_ring =
        median_ms([&] { telar::RingAllreduce{}.start(comm, packed.data(), n).wait(); }, reps);
    if (comm.rank() == 0)
      std::printf("# %d ranks, %zu tensors of 4 KB = %.2f MiB flat (%zu elements), %d reps, median "
                  "of the slowest rank\n"
                  "one 4 MB MPI_Allreduce       %7.3f ms\n"
                  "one 4 MB ring allreduce      %7.3f ms\n",
                  comm.size(), store.entries().size(), n * 4.0 / (1 << 20), n, reps, t_mpi, t_ring);
    for (double mb : {4.0, 1.0, 0.25}) {
      telar::detail::GradientBuckets<float, telar::DefaultMemorySpace, telar::RingAllreduce>
          buckets(&comm, telar::RingAllreduce{}, store, std::size_t(mb * (1 << 20)), nullptr);
      double const t = median_ms(
          [&] {
            buckets.begin_step(1);
            for (int k = int(Model::size) - 1; k >= 0; --k)
              buckets.layer_done(exec, std::size_t(k));
            buckets.finish(exec);
          },
          reps);
      if (comm.rank() == 0)
        std::printf("buckets of %.2f MiB (%zu)  %7.3f ms  = %.2fx the one ring allreduce, %.2fx "
                    "MPI_Allreduce\n",
                    mb, buckets.bucket_count(), t, t / t_ring, t / t_mpi);
    }
  }
  MPI_Finalize();
  return 0;
}
