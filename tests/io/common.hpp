#pragma once
// Shared by the checkpoint and gather tests: a tiny tensor-parallel MLP with
// Adam under any layout, run on the first ranks of the world.
#include "support.hpp"

#include <telar/data/synthetic.hpp>
#include <telar/io/gather.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/adam.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/train/trainer.hpp>

#include <mpi.h>

#include <memory>
#include <string>

namespace telar::test {

using Mlp = Sequential<ColumnParallel<Dense<double>>, ReLU<double>, RowParallel<Dense<double>>,
                       GELU<double>, Dense<double>>;
inline Mlp make_mlp(std::size_t hidden = 16) {
  return Mlp(ColumnParallel<Dense<double>>(12, hidden), {}, RowParallel<Dense<double>>(hidden, 9),
             {}, Dense<double>(9, 4));
}

template <int Stage>
using ZeroStrategy =
    Strategy<DataParallel<RingAllreduce, ZeRO<Stage>>, PipelineParallel<>, TensorParallel<>>;
using Plain = Strategy<DataParallel<>, PipelineParallel<>, TensorParallel<>>;

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// The first `n` ranks of the world (MPI_COMM_NULL elsewhere).
struct SubComm {
  MPI_Comm comm = MPI_COMM_NULL;
  explicit SubComm(int n) {
    MPI_Comm_split(MPI_COMM_WORLD, world_rank() < n ? 0 : MPI_UNDEFINED, world_rank(), &comm);
  }
  ~SubComm() {
    if (comm != MPI_COMM_NULL)
      MPI_Comm_free(&comm);
  }
  SubComm(SubComm const&) = delete;
  SubComm& operator=(SubComm const&) = delete;
};

struct Data {
  Matrix<double> x;
  Labels<> y;
};
inline Data make_data(std::size_t n) {
  auto ds = make_synthetic(n, 12, 4, 99);
  Data d{Matrix<double>("x", n, 12), Labels<>("y", n)};
  auto hx = Kokkos::create_mirror_view(d.x);
  auto hy = Kokkos::create_mirror_view(d.y);
  for (std::size_t i = 0; i < n; ++i) {
    hy(i) = ds.y[i];
    for (std::size_t j = 0; j < 12; ++j)
      hx(i, j) = ds.x[i * 12 + j];
  }
  Kokkos::deep_copy(d.x, hx);
  Kokkos::deep_copy(d.y, hy);
  return d;
}

constexpr std::size_t batch = 24;

// Runs steps [first, last) of global batch `batch`; this rank's share.
// \p data: a Data, or anything with x and y of its kind (float ones too).
template <class Tr, class D>
void train_steps(Tr& t, D const& data, int first, int last) {
  int const dp = t.grid_shape().dp, d = t.grid_coords().dp;
  std::size_t const local = batch / std::size_t(dp);
  for (int s = first; s < last; ++s) {
    std::size_t const b = std::size_t(s) * batch + std::size_t(d) * local;
    t.step(rows(data.x, b, b + local), rows(data.y, b, b + local));
  }
}

struct Layout {
  int dp = 1, pp = 1, tp = 1;
  int zero = 0; // ZeRO stage, 0: none
  char const* schedule = "1f1b";
  int size() const { return dp * pp * tp; }
  std::string str() const {
    return "dp" + std::to_string(dp) + "xpp" + std::to_string(pp) + "xtp" + std::to_string(tp) +
           (zero ? "+zero" + std::to_string(zero) : "");
  }
};

inline TrainerOptions options_for(Layout const& l, std::uint64_t seed) {
  TrainerOptions o;
  o.seed = seed;
  o.lr = constant_lr(0.01);
  o.grid = {l.dp, l.pp, l.tp};
  o.schedule = l.schedule;
  o.microbatches = 2;
  return o;
}

// f(trainer) with a trainer of layout l on `comm` (the strategy type chosen
// by l.zero).
template <class F>
void with_trainer(MPI_Comm comm, Layout const& l, std::uint64_t seed, F&& f) {
  auto run = [&](auto tag) {
    using S = decltype(tag);
    Trainer<Mlp, S, Adam<double>> t(comm, make_mlp(), Adam<double>{}, options_for(l, seed), 12);
    f(t);
  };
  switch (l.zero) {
  case 1:
    run(ZeroStrategy<1>{});
    break;
  case 2:
    run(ZeroStrategy<2>{});
    break;
  case 3:
    run(ZeroStrategy<3>{});
    break;
  default:
    run(Plain{});
    break;
  }
}

// A fresh directory under the build tree, the same name on every rank.
inline std::string scratch_dir(std::string const& tag) {
  char buf[256] = {};
  if (world_rank() == 0) {
    std::string d = "telar_io_" + tag + "_" + std::to_string(world_size()) + "_XXXXXX";
    std::snprintf(buf, sizeof buf, "%s", d.c_str());
    if (mkdtemp(buf) == nullptr)
      buf[0] = 0;
  }
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
  return buf;
}

} // namespace telar::test
