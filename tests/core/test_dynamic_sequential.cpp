// telar::DynamicSequential (layers chosen at run time) trains exactly as the
// telar::Sequential of the same layers: the same parameters, bit for bit,
// serial and under dp, pp and tp at 2 ranks; DynamicResidual as Residual.
#include "support.hpp"

#include <telar/core/dynamic_sequential.hpp>
#include <telar/core/residual.hpp>
#include <telar/data/synthetic.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_test_macros.hpp>

#include <mpi.h>

#include <string>
#include <variant>
#include <vector>

namespace {

using T = float;
using D = telar::Dense<T>;
using Col = telar::ColumnParallel<D>;
using Row = telar::RowParallel<D>;
using Static = telar::Sequential<Col, telar::ReLU<T>, Row, telar::Residual<D, telar::Tanh<T>>,
                                 telar::Sigmoid<T>, D>;
using Branch = std::variant<D, telar::Tanh<T>>;
using Dynamic = telar::DynamicSequential<
    std::variant<Col, Row, D, telar::ReLU<T>, telar::Sigmoid<T>, telar::DynamicResidual<Branch>>>;
using Full =
    telar::Strategy<telar::DataParallel<>, telar::PipelineParallel<>, telar::TensorParallel<>>;

Static make_static() {
  return Static(Col(10, 16), {}, Row(16, 8), telar::Residual<D, telar::Tanh<T>>(D(8, 8), {}), {},
                D(8, 3));
}
Dynamic make_dynamic() {
  Dynamic m;
  m.push_back(Col(10, 16));
  m.push_back(telar::ReLU<T>{});
  m.push_back(Row(16, 8));
  telar::DynamicSequential<Branch> body;
  body.push_back(D(8, 8));
  body.push_back(telar::Tanh<T>{});
  m.push_back(telar::DynamicResidual<Branch>(body));
  m.push_back(telar::Sigmoid<T>{});
  m.push_back(D(8, 3));
  return m;
}

template <class Model>
std::vector<T> train(MPI_Comm comm, Model model, telar::GridShape grid) {
  std::size_t const batch = 8, steps = 3;
  auto ds = telar::make_synthetic(batch * steps, 10, 3, 5);
  telar::Matrix<T> x("x", batch * steps, 10);
  telar::Labels<> y("y", batch * steps);
  auto hx = Kokkos::create_mirror_view(x);
  auto hy = Kokkos::create_mirror_view(y);
  for (std::size_t i = 0; i < batch * steps; ++i) {
    hy(i) = ds.y[i];
    for (std::size_t j = 0; j < 10; ++j)
      hx(i, j) = T(ds.x[i * 10 + j]);
  }
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(y, hy);
  telar::TrainerOptions o;
  o.grid = grid;
  o.microbatches = grid.pp > 1 ? 2 : 1;
  o.lr = telar::constant_lr(0.1);
  telar::Trainer<Model, Full, telar::SGD<T>> trainer(comm, std::move(model), {}, o, 10);
  std::size_t const local = batch / std::size_t(trainer.grid_shape().dp);
  for (std::size_t s = 0; s < steps; ++s) {
    std::size_t const b = s * batch + std::size_t(trainer.grid_coords().dp) * local;
    trainer.step(telar::rows(x, b, b + local), telar::rows(y, b, b + local));
  }
  return trainer.parameters();
}

} // namespace

TEST_CASE("DynamicSequential trains as the Sequential of the same layers", "[dynamic]") {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  // Collective calls in a fixed order on every rank.
  auto const dyn = train(MPI_COMM_SELF, make_dynamic(), {1, 1, 1});
  auto const ref = train(MPI_COMM_SELF, make_static(), {1, 1, 1});
  CHECK(dyn == ref);
  if (n != 2)
    return;
  for (telar::GridShape g :
       {telar::GridShape{2, 1, 1}, telar::GridShape{1, 2, 1}, telar::GridShape{1, 1, 2}}) {
    INFO("dp=" << g.dp << " pp=" << g.pp << " tp=" << g.tp);
    auto const d = train(MPI_COMM_WORLD, make_dynamic(), g);
    auto const s = train(MPI_COMM_WORLD, make_static(), g);
    CHECK(d == s);
  }
}

TEST_CASE("DynamicSequential names a layer that cannot take its input", "[dynamic]") {
  Dynamic m = make_dynamic();
  try {
    m.shapes(telar::Shape{7});
    FAIL("no error");
  } catch (telar::ShapeError const& e) {
    CHECK(std::string(e.what()).find("layer 0 (ColumnParallel<Dense>)") != std::string::npos);
  }
}
