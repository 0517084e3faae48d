// What the install tests build: Telar through its umbrella header, a
// two-layer MLP trained one step on synthetic data, and (with parallel HDF5)
// a checkpoint written and read back, so the package's dependencies link.
// Prints "telar consumer: loss L" and, with HDF5, "checkpoint step 1".
#include <telar/telar.hpp>

#include <cstdio>
#include <filesystem>
#include <string>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    using Model = telar::Sequential<telar::Dense<float>, telar::ReLU<float>, telar::Dense<float>>;
    using Strategy = telar::Strategy<telar::DataParallel<>>;
    telar::Trainer<Model, Strategy, telar::SGD<float>> trainer(
        MPI_COMM_WORLD, Model(telar::Dense<float>(8, 16), {}, telar::Dense<float>(16, 3)),
        telar::SGD<float>{}, telar::TrainerOptions{}, telar::Shape{8});
    telar::Dataset const ds = telar::make_synthetic(32, 8, 3, 1);
    telar::Matrix<float> x("x", ds.size, ds.features);
    telar::Labels<> y("y", ds.size);
    auto hx = Kokkos::create_mirror_view(x);
    auto hy = Kokkos::create_mirror_view(y);
    for (std::size_t i = 0; i < ds.size; ++i) {
      hy(i) = ds.y[i];
      for (std::size_t j = 0; j < ds.features; ++j)
        hx(i, j) = ds.x[i * ds.features + j];
    }
    Kokkos::deep_copy(x, hx);
    Kokkos::deep_copy(y, hy);
    auto const r = trainer.step(x, y);
    std::printf("telar consumer: loss %.6f\n", r.loss);
#if TELAR_HAVE_HDF5
    std::string const dir = "telar_consumer_checkpoints"; // in the working directory
    std::filesystem::remove_all(dir);
    telar::load_checkpoint(trainer, telar::save_checkpoint(trainer, dir));
    std::printf("checkpoint step %lld\n", trainer.steps());
    std::filesystem::remove_all(dir);
#endif
    rc = r.loss > 0 ? 0 : 1;
  }
  MPI_Finalize();
  return rc;
}
