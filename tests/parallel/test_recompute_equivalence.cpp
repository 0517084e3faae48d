// Activation recomputation under every strategy: a model with full
// recomputation (every top-level unit wrapped in telar::Recompute), trained
// under data, pipeline (1F1B, ZB-H1, interleaved), tensor and dp x pp
// parallelism, ends with the parameters of the serial model that keeps its
// activations (relative 1e-5 in float, 1e-11 in double, as
// test_equivalence). Two models: the flat Megatron MLP of test_equivalence,
// and one of blocks whose first block holds the Column/RowParallel pair, so
// the recomputed forward repeats the row-parallel allreduce.
#include "equivalence.hpp"

#include <telar/core/recompute.hpp>
#include <telar/data/synthetic.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <mpi.h>

#include <map>
#include <string>
#include <vector>

namespace {

template <class T>
using Col = telar::ColumnParallel<telar::Dense<T>>;
template <class T>
using Row = telar::RowParallel<telar::Dense<T>>;

// Flat: five units.
template <class T>
using Flat = telar::Sequential<Col<T>, telar::ReLU<T>, Row<T>, telar::GELU<T>, telar::Dense<T>>;
template <class T>
Flat<T> make_flat() {
  return Flat<T>(Col<T>(12, 16), {}, Row<T>(16, 9), {}, telar::Dense<T>(9, 4));
}

// Blocks: the tensor-parallel pair in one block, then a block and a layer.
template <class T>
using Pair = telar::Sequential<Col<T>, telar::ReLU<T>, Row<T>>;
template <class T>
using Tail = telar::Sequential<telar::Dense<T>, telar::GELU<T>>;
template <class T>
using Blocks = telar::Sequential<Pair<T>, telar::GELU<T>, Tail<T>, telar::Dense<T>>;
template <class T>
Blocks<T> make_blocks() {
  return Blocks<T>(Pair<T>(Col<T>(12, 16), {}, Row<T>(16, 9)), {},
                   Tail<T>(telar::Dense<T>(9, 7), {}), telar::Dense<T>(7, 4));
}

using Full =
    telar::Strategy<telar::DataParallel<>, telar::PipelineParallel<>, telar::TensorParallel<>>;

using telar::test::require_same;
using telar::test::world_size;

template <class T>
struct Data {
  telar::Matrix<T> x;
  telar::Labels<> y;
};
template <class T>
Data<T> make_data(std::size_t n) {
  auto ds = telar::make_synthetic(n, 12, 4, 99);
  Data<T> d{telar::Matrix<T>("x", n, 12), telar::Labels<>("y", n)};
  auto hx = Kokkos::create_mirror_view(d.x);
  auto hy = Kokkos::create_mirror_view(d.y);
  for (std::size_t i = 0; i < n; ++i) {
    hy(i) = ds.y[i];
    for (std::size_t j = 0; j < 12; ++j)
      hx(i, j) = T(ds.x[i * 12 + j]);
  }
  Kokkos::deep_copy(d.x, hx);
  Kokkos::deep_copy(d.y, hy);
  return d;
}

using Result = telar::test::NormResult;

template <class Model, class Strategy, class T, class Opt>
Result train(MPI_Comm comm, Model model, Opt opt, telar::TrainerOptions opts, Data<T> const& data,
             std::size_t batch, int steps) {
  telar::Trainer<Model, Strategy, Opt> trainer(comm, std::move(model), opt, opts, 12);
  int const dp = trainer.grid_shape().dp, d = trainer.grid_coords().dp;
  std::size_t const local = batch / std::size_t(dp);
  for (int s = 0; s < steps; ++s) {
    std::size_t const b = std::size_t(s) * batch + std::size_t(d) * local;
    trainer.step(telar::rows(data.x, b, b + local), telar::rows(data.y, b, b + local));
  }
  return {trainer.param_l2(), trainer.tensor_norms()};
}

struct Layout {
  int dp, pp, tp;
  char const* schedule;
  int microbatches;
};

// Layouts at world size n for a model of `units` top-level units: dp alone,
// pp (1F1B, ZB-H1, interleaved), tp, dp x pp.
std::vector<Layout> layouts(int n, int units) {
  std::vector<Layout> out{{n, 1, 1, "1f1b", 2}}; // dp (or serial at n = 1)
  for (int pp = 2; pp <= n && pp <= units; ++pp)
    if (n % pp == 0) {
      out.push_back({n / pp, pp, 1, "1f1b", 4});
      out.push_back({n / pp, pp, 1, "zb-h1", 4});
      if (2 * pp <= units)
        out.push_back({n / pp, pp, 1, "interleaved", 4});
    }
  for (int tp = 2; tp <= n; tp *= 2)
    if (n % tp == 0)
      out.push_back({n / tp, 1, tp, "1f1b", 2});
  return out;
}

template <class T, class Model, class MakeModel>
void check_model(MakeModel make, int units, char const* label) {
  int const n = world_size();
  double const tol = std::is_same_v<T, float> ? 1e-5 : 1e-11;
  std::size_t const batch = 24;
  int const steps = 3;
  auto const data = make_data<T>(batch * steps);
  telar::SGD<T> sgd;
  sgd.momentum = T(0.9);
  telar::TrainerOptions base;
  base.seed = 7;
  base.lr = telar::constant_lr(0.05);

  telar::TrainerOptions serial = base;
  serial.grid = {1, 1, 1};
  serial.schedule.clear();
  Result const want =
      train<Model, telar::Serial>(MPI_COMM_SELF, make(), sgd, serial, data, batch, steps);
  for (auto const& l : layouts(n, units)) {
    telar::TrainerOptions opts = base;
    opts.grid = {l.dp, l.pp, l.tp};
    opts.schedule = l.schedule;
    opts.microbatches = l.microbatches;
    std::string const what = std::string(label) + " dp=" + std::to_string(l.dp) +
                             " pp=" + std::to_string(l.pp) + " tp=" + std::to_string(l.tp) + " " +
                             l.schedule + " m=" + std::to_string(l.microbatches);
    Result const got = train<telar::RecomputeAll<Model>, Full>(
        MPI_COMM_WORLD, telar::recompute_all(make()), sgd, opts, data, batch, steps);
    require_same(got, want, tol, what);
  }
}

} // namespace

TEMPLATE_TEST_CASE("Full recomputation matches serial training without it", "[recompute]", float,
                   double) {
  using T = TestType;
  check_model<T, Flat<T>>(make_flat<T>, 5, "flat");
  check_model<T, Blocks<T>>(make_blocks<T>, 4, "blocks");
}

TEST_CASE("Selective recomputation (one block) matches serial training", "[recompute]") {
  using T = double;
  using Sel =
      telar::Sequential<telar::Recompute<Pair<T>>, telar::GELU<T>, Tail<T>, telar::Dense<T>>;
  int const n = world_size();
  std::size_t const batch = 24;
  auto const data = make_data<T>(batch * 3);
  telar::SGD<T> sgd;
  telar::TrainerOptions base;
  base.seed = 9;
  base.lr = telar::constant_lr(0.05);
  telar::TrainerOptions serial = base;
  serial.grid = {1, 1, 1};
  serial.schedule.clear();
  Result const want =
      train<Blocks<T>, telar::Serial>(MPI_COMM_SELF, make_blocks<T>(), sgd, serial, data, batch, 3);
  for (auto const& l : layouts(n, 4)) {
    telar::TrainerOptions opts = base;
    opts.grid = {l.dp, l.pp, l.tp};
    opts.schedule = l.schedule;
    opts.microbatches = l.microbatches;
    auto b = make_blocks<T>();
    Sel model(telar::Recompute<Pair<T>>(b.template layer<0>()), {}, b.template layer<2>(),
              b.template layer<3>());
    require_same(train<Sel, Full>(MPI_COMM_WORLD, model, sgd, opts, data, batch, 3), want, 1e-11,
                 std::string("selective ") + l.schedule + " dp=" + std::to_string(l.dp) +
                     " pp=" + std::to_string(l.pp) + " tp=" + std::to_string(l.tp));
  }
}
