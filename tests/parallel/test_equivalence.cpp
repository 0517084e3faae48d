// Every strategy, alone and composed, trains to the parameters of serial
// training with the same global batch and seed: checked on the L2 norm of
// every parameter tensor and of all of them (relative 1e-5 in float, 1e-11 in
// double) after a few steps, at whatever world size the test runs with.
#include "equivalence.hpp"

#include <telar/data/synthetic.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/adam.hpp>
#include <telar/optim/lamb.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>

namespace {

// A Megatron pair (column- then row-parallel) and a replicated last layer;
// at tp = 1 the wrappers are plain Dense layers, bit for bit.
template <class T>
using Mlp = telar::Sequential<telar::ColumnParallel<telar::Dense<T>>, telar::ReLU<T>,
                              telar::RowParallel<telar::Dense<T>>, telar::GELU<T>, telar::Dense<T>>;
template <class T>
Mlp<T> make_mlp() {
  return Mlp<T>(telar::ColumnParallel<telar::Dense<T>>(12, 16), {},
                telar::RowParallel<telar::Dense<T>>(16, 9), {}, telar::Dense<T>(9, 4));
}

using Full =
    telar::Strategy<telar::DataParallel<>, telar::PipelineParallel<>, telar::TensorParallel<>>;

using telar::test::require_same;
using telar::test::world_size;

// Global batches for `steps` steps, the same on every rank.
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

struct Result : telar::test::NormResult {
  telar::GridOrder order = telar::default_grid_order;
  double last_loss = 0;
  std::string reduce_label; // ZeRO-1's "reduce shard ..." trace event (opts.trace)
};

// Trains `steps` steps of global batch `batch` with the given strategy and
// degrees; the rank's data-parallel share is its contiguous slice.
template <class T, class Strategy, class Opt>
Result train(MPI_Comm comm, Opt opt, telar::TrainerOptions opts, Data<T> const& data,
             std::size_t batch, int steps) {
  telar::Trainer<Mlp<T>, Strategy, Opt> trainer(comm, make_mlp<T>(), opt, opts, 12);
  int const dp = trainer.grid_shape().dp, d = trainer.grid_coords().dp;
  std::size_t const local = batch / std::size_t(dp);
  Result r;
  for (int s = 0; s < steps; ++s) {
    std::size_t const b = std::size_t(s) * batch + std::size_t(d) * local;
    r.last_loss =
        trainer.step(telar::rows(data.x, b, b + local), telar::rows(data.y, b, b + local)).loss;
  }
  r.l2 = trainer.param_l2();
  r.norms = trainer.tensor_norms();
  for (auto const& e : trainer.trace().events())
    if (e.name.rfind("reduce shard", 0) == 0)
      r.reduce_label = e.name;
  if (trainer.grid())
    r.order = trainer.grid()->order();
  return r;
}

template <class T, class Opt>
Result serial(Opt opt, telar::TrainerOptions opts, Data<T> const& data, std::size_t batch,
              int steps) {
  opts.grid = {1, 1, 1};
  opts.schedule.clear();
  return train<T, telar::Serial>(MPI_COMM_SELF, opt, opts, data, batch, steps);
}

struct Layout {
  int dp, pp, tp;
  char const* schedule;
  int microbatches;
};

} // namespace

TEMPLATE_TEST_CASE("Every composition matches serial training", "[equivalence]", float, double) {
  using T = TestType;
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

  // All layouts whose product is the world size.
  std::vector<Layout> layouts;
  for (char const* sched : {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"})
    for (int m : {1, 2, 3, 4, 6})
      for (int pp = 1; pp <= n; ++pp)
        for (int tp = 1; tp <= n; ++tp)
          if (n % (pp * tp) == 0) {
            if (pp > 4)
              continue; // five layers: at most 4 pipeline stages here
            if (pp == 1 && std::string(sched) != "1f1b")
              continue;
            if (tp > 1 && (m > 2 || std::string(sched) == "gpipe"))
              continue; // keeps the run short; tensor parallelism does not see the schedule
            if (std::string(sched) == "interleaved" && 2 * pp > 5)
              continue; // five layers: at most 5 virtual stages
            if (batch / std::size_t(n / (pp * tp)) < std::size_t(m))
              continue; // fewer local samples than micro-batches
            layouts.push_back({n / (pp * tp), pp, tp, sched, m});
          }

  for (auto const& l : layouts) {
    telar::TrainerOptions opts = base;
    opts.grid = {l.dp, l.pp, l.tp};
    opts.schedule = l.schedule;
    opts.microbatches = l.microbatches;
    std::string const what = "dp=" + std::to_string(l.dp) + " pp=" + std::to_string(l.pp) +
                             " tp=" + std::to_string(l.tp) + " " + l.schedule +
                             " m=" + std::to_string(l.microbatches);
    // The serial reference runs the same micro-batches (same summation order
    // within each data-parallel share is not required: tolerances cover it).
    telar::TrainerOptions ref_opts = base;
    Result const want = serial<T>(sgd, ref_opts, data, batch, steps);
    Result const got = train<T, Full>(MPI_COMM_WORLD, sgd, opts, data, batch, steps);
    require_same(got, want, tol, what);
  }
}

TEMPLATE_TEST_CASE("Hierarchical gradient allreduce over fake nodes matches serial",
                   "[equivalence][hierarchical]", float, double) {
  using T = TestType;
  int const n = world_size();
  double const tol = std::is_same_v<T, float> ? 1e-5 : 1e-11;
  std::size_t const batch = 24;
  auto const data = make_data<T>(batch * 3);
  telar::SGD<T> sgd;
  telar::TrainerOptions base;
  base.seed = 5;
  base.lr = telar::constant_lr(0.05);
  // Nodes of 2 consecutive ranks: at 4 ranks DataParallel<>'s allreduce is
  // hierarchical by itself (checked below); at 1 and 2 it is forced.
  setenv("TELAR_RANKS_PER_NODE", "2", 1);
  if (n < 4)
    setenv("TELAR_ALLREDUCE", "hierarchical", 1);
  int group = 0;
  {
    telar::Communicator world(MPI_COMM_WORLD, "world");
    group = telar::TopologyAwareAllreduce{}.group_size_for(world);
  }
  telar::TrainerOptions opts = base;
  opts.grid = {n, 1, 1};
  Result const got = train<T, Full>(MPI_COMM_WORLD, sgd, opts, data, batch, 3);
  // dp = 2 x pp = 2 on 2 nodes: the Trainer places each pipeline on one node
  // ({dp, pp, tp}), dp crosses nodes (one rank per node: the flat ring).
  Result placed;
  if (n == 4) {
    opts.grid = {2, 2, 1};
    opts.microbatches = 2;
    placed = train<T, Full>(MPI_COMM_WORLD, sgd, opts, data, batch, 3);
  }
  unsetenv("TELAR_RANKS_PER_NODE");
  unsetenv("TELAR_ALLREDUCE");
  CHECK(group == (n >= 4 ? 2 : 1)); // 1: forced, HierarchicalAllreduce picks its groups
  Result const want = serial<T>(sgd, base, data, batch, 3);
  require_same(got, want, tol, "dp=" + std::to_string(n) + " hierarchical");
  if (n == 4) {
    CHECK(placed.order == telar::GridOrder{telar::GridAxis::dp, telar::GridAxis::pp,
                                           telar::GridAxis::sp, telar::GridAxis::tp});
    require_same(placed, want, tol, "dp=2 x pp=2 placed by node");
  }
}

TEST_CASE("Adam and LAMB (per-tensor norms across stages) match serial", "[equivalence]") {
  int const n = world_size();
  std::size_t const batch = 24;
  auto const data = make_data<double>(batch * 3);
  telar::TrainerOptions base;
  base.seed = 3;
  base.lr = telar::constant_lr(0.01);
  base.clip_grad_norm = 0.5; // the global norm crosses stages too
  for (int pp : {1, 2, 4})
    for (int tp : {1, 2, 4})
      if (n % (pp * tp) == 0) {
        telar::TrainerOptions opts = base;
        opts.grid = {n / (pp * tp), pp, tp};
        opts.microbatches = 2;
        std::string const where = " pp=" + std::to_string(pp) + " tp=" + std::to_string(tp);
        require_same(
            train<double, Full>(MPI_COMM_WORLD, telar::Adam<double>{}, opts, data, batch, 3),
            serial<double>(telar::Adam<double>{}, base, data, batch, 3), 1e-11, "adam" + where);
        require_same(
            train<double, Full>(MPI_COMM_WORLD, telar::LAMB<double>{}, opts, data, batch, 3),
            serial<double>(telar::LAMB<double>{}, base, data, batch, 3), 1e-11, "lamb" + where);
      }
}

TEST_CASE("ZeRO-1 (sharded optimizer state) matches serial, on one node and per node",
          "[equivalence][zero]") {
  using Zero = telar::Strategy<telar::DataParallel<telar::RingAllreduce, telar::ZeRO<1>>,
                               telar::PipelineParallel<>, telar::TensorParallel<>>;
  int const n = world_size();
  std::size_t const batch = 24;
  auto const data = make_data<double>(batch * 3);
  telar::TrainerOptions base;
  base.seed = 5;
  base.lr = telar::constant_lr(0.02);
  base.clip_grad_norm = 0.5;
  telar::SGD<double> momentum;
  momentum.momentum = 0.9;
  for (bool shared : {true, false})
    for (int pp : {1, 2})
      for (int tp : {1, 2})
        if (n % (pp * tp) == 0) {
          telar::TrainerOptions opts = base;
          opts.grid = {n / (pp * tp), pp, tp};
          opts.microbatches = 2;
          opts.shared_memory = shared;
          std::string const where = std::string(shared ? " shared" : " messages") +
                                    " dp=" + std::to_string(n / (pp * tp)) +
                                    " pp=" + std::to_string(pp) + " tp=" + std::to_string(tp);
          require_same(train<double, Zero>(MPI_COMM_WORLD, momentum, opts, data, batch, 3),
                       serial<double>(momentum, base, data, batch, 3), 1e-11, "sgd" + where);
          require_same(
              train<double, Zero>(MPI_COMM_WORLD, telar::AdamW<double>{}, opts, data, batch, 3),
              serial<double>(telar::AdamW<double>{}, base, data, batch, 3), 1e-11, "adamw" + where);
          require_same(
              train<double, Zero>(MPI_COMM_WORLD, telar::LAMB<double>{}, opts, data, batch, 3),
              serial<double>(telar::LAMB<double>{}, base, data, batch, 3), 1e-11, "lamb" + where);
        }

  // Over nodes of 2 consecutive ranks: at 4 ranks two nodes of two (a
  // window per node, reduce-scatter and all-gather across); at 2 one node.
  telar::TrainerOptions opts = base;
  opts.grid = {n, 1, 1};
  opts.trace = true;
  setenv("TELAR_RANKS_PER_NODE", "2", 1);
  Result const sgd = train<double, Zero>(MPI_COMM_WORLD, momentum, opts, data, batch, 3);
  Result const adamw =
      train<double, Zero>(MPI_COMM_WORLD, telar::AdamW<double>{}, opts, data, batch, 3);
  unsetenv("TELAR_RANKS_PER_NODE");
  // Nodes of unequal sizes (an odd n > 1) use messages.
  CHECK(sgd.reduce_label ==
        (n == 1       ? ""
         : n == 2     ? "reduce shard (shared memory)"
         : n % 2 == 0 ? "reduce shard (" + std::to_string(n / 2) + " nodes of 2, shared within)"
                      : "reduce shard"));
  std::string const where = " dp=" + std::to_string(n) + " on nodes of 2";
  require_same(sgd, serial<double>(momentum, base, data, batch, 3), 1e-11, "sgd" + where);
  require_same(adamw, serial<double>(telar::AdamW<double>{}, base, data, batch, 3), 1e-11,
               "adamw" + where);
}

namespace {
// A user's own optimizer (Lion, docs/writing_an_optimizer.md) that asks for
// the global gradient norm: the norm must cross every shard.
template <class T>
struct NormedLion {
  using value_type = T;
  static constexpr int state_size = 1;
  static constexpr bool needs_grad_norm = true;
  static constexpr char const* name() { return "normed_lion"; }
  T beta1 = T(0.9), beta2 = T(0.99);
  KOKKOS_INLINE_FUNCTION void update(T& w, T g, telar::OptimizerState<T> s,
                                     telar::StepInfo<T> const& info) const {
    T const c = beta1 * s[0] + (T(1) - beta1) * g;
    w -= info.lr * c / (info.grad_norm + T(1));
    s[0] = beta2 * s[0] + (T(1) - beta2) * g;
  }
};

// Trains with a ZeRO sharding policy under every layout of the world with
// pp, tp in {1, 2}, and compares with serial training.
template <class Sharding, class Opt>
void check_sharding(Opt opt, telar::TrainerOptions base, char const* sched, bool shared,
                    std::string const& what) {
  using Zero = telar::Strategy<telar::DataParallel<telar::RingAllreduce, Sharding>,
                               telar::PipelineParallel<>, telar::TensorParallel<>>;
  int const n = world_size();
  std::size_t const batch = 24;
  auto const data = make_data<double>(batch * 3);
  Result const want = serial<double>(opt, base, data, batch, 3);
  for (int pp : {1, 2})
    for (int tp : {1, 2})
      if (n % (pp * tp) == 0 && (pp > 1 || std::string(sched) == "1f1b")) {
        telar::TrainerOptions opts = base;
        opts.grid = {n / (pp * tp), pp, tp};
        opts.microbatches = 2;
        opts.schedule = sched;
        opts.shared_memory = shared;
        std::string const where = what + " " + sched + " dp=" + std::to_string(n / (pp * tp)) +
                                  " pp=" + std::to_string(pp) + " tp=" + std::to_string(tp);
        require_same(train<double, Zero>(MPI_COMM_WORLD, opt, opts, data, batch, 3), want, 1e-11,
                     where);
      }
}
template <int Stage, class Opt>
void check_zero(Opt opt, telar::TrainerOptions base, char const* sched, bool shared,
                std::string const& what) {
  check_sharding<telar::ZeRO<Stage>>(opt, base, sched, shared, what);
}
} // namespace

TEST_CASE("ZeRO-2 (sharded gradients and optimizer state) matches serial", "[equivalence][zero]") {
  telar::TrainerOptions base;
  base.seed = 5;
  base.lr = telar::constant_lr(0.02);
  base.clip_grad_norm = 0.5;
  // Small buckets: several per rank, most of them across shard boundaries.
  base.bucket_bytes = 256;
  telar::SGD<double> momentum;
  momentum.momentum = 0.9;
  for (char const* sched : {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"}) {
    check_zero<2>(momentum, base, sched, false, "sgd");
    check_zero<2>(telar::AdamW<double>{}, base, sched, false, "adamw");
    check_zero<2>(telar::LAMB<double>{}, base, sched, false, "lamb");
    check_zero<2>(NormedLion<double>{}, base, sched, false, "user optimizer");
  }
  telar::TrainerOptions one_bucket = base;
  one_bucket.bucket_bytes = std::size_t(1) << 30;
  check_zero<2>(telar::AdamW<double>{}, one_bucket, "1f1b", false, "adamw, one bucket");
}

TEST_CASE("ZeRO-1 under every schedule, with a user's optimizer, matches serial",
          "[equivalence][zero]") {
  telar::TrainerOptions base;
  base.seed = 9;
  base.lr = telar::constant_lr(0.02);
  base.clip_grad_norm = 0.5;
  for (char const* sched : {"gpipe", "interleaved", "zb-h1", "zb-h2"})
    for (bool shared : {true, false})
      check_zero<1>(NormedLion<double>{}, base, sched, shared, "user optimizer");
}

namespace {
// ZeRO-3 in one gather mode: every schedule, SGD with momentum, AdamW, LAMB
// and a user's optimizer, with clipping; small groups (most across shard
// boundaries) and one group.
template <telar::ZeRO3Gather Gather>
void check_zero3(char const* mode) {
  using Z3 = telar::ZeRO<3, Gather>;
  telar::TrainerOptions base;
  base.seed = 5;
  base.lr = telar::constant_lr(0.02);
  base.clip_grad_norm = 0.5;
  base.bucket_bytes = 256;
  telar::SGD<double> momentum;
  momentum.momentum = 0.9;
  std::string const m = std::string(mode) + " ";
  for (char const* sched : {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"}) {
    check_sharding<Z3>(momentum, base, sched, false, m + "sgd");
    check_sharding<Z3>(telar::AdamW<double>{}, base, sched, false, m + "adamw");
    check_sharding<Z3>(telar::LAMB<double>{}, base, sched, false, m + "lamb");
    check_sharding<Z3>(NormedLion<double>{}, base, sched, false, m + "user optimizer");
  }
  telar::TrainerOptions one_group = base;
  one_group.bucket_bytes = std::size_t(1) << 30;
  check_sharding<Z3>(telar::Adam<double>{}, one_group, "1f1b", false, m + "adam, one group");
}
} // namespace

TEST_CASE("ZeRO-3 (sharded parameters, gathered per micro-batch) matches serial",
          "[equivalence][zero][zero3]") {
  check_zero3<telar::ZeRO3Gather::PerMicrobatch>("per micro-batch");
}

TEST_CASE("ZeRO-3 (sharded parameters, gathered once per step) matches serial",
          "[equivalence][zero][zero3]") {
  check_zero3<telar::ZeRO3Gather::PerStep>("per step");
}

TEST_CASE("ZeRO-3 parameters(), evaluate() and norms match serial", "[equivalence][zero][zero3]") {
  using Z3 = telar::Strategy<telar::DataParallel<telar::RingAllreduce, telar::ZeRO<3>>>;
  std::size_t const batch = 24;
  auto const data = make_data<double>(batch * 3);
  telar::TrainerOptions opts;
  opts.seed = 5;
  opts.lr = telar::constant_lr(0.02);
  opts.bucket_bytes = 256;
  opts.microbatches = 2;
  telar::TrainerOptions serial_opts = opts;
  serial_opts.grid = {1, 1, 1};
  int const n = world_size();
  std::size_t const local = batch / std::size_t(n);
  telar::Trainer<Mlp<double>, Z3, telar::Adam<double>> zero(MPI_COMM_WORLD, make_mlp<double>(), {},
                                                            opts, 12);
  telar::Trainer<Mlp<double>, telar::Serial, telar::Adam<double>> ref(
      MPI_COMM_SELF, make_mlp<double>(), {}, serial_opts, 12);
  for (std::size_t s = 0; s < 2; ++s) {
    std::size_t const b = s * batch + std::size_t(zero.grid_coords().dp) * local;
    zero.step(telar::rows(data.x, b, b + local), telar::rows(data.y, b, b + local));
    ref.step(telar::rows(data.x, s * batch, (s + 1) * batch),
             telar::rows(data.y, s * batch, (s + 1) * batch));
  }
  // No full copy of the parameters is kept: the store has no values.
  CHECK(zero.parameter_store().values().size() == 0);
  CHECK(zero.parameter_store().grads().size() == 0);
  auto const got = zero.parameters(), want = ref.parameters();
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - want[i]));
  CHECK(worst <= 1e-12);
  CHECK_THAT(zero.evaluate(data.x, data.y).loss,
             Catch::Matchers::WithinAbs(ref.evaluate(data.x, data.y).loss, 1e-12));
  // n + 1 samples one at a time: some ranks have a chunk without samples
  // but must still take part in the gathers.
  std::size_t const m = std::size_t(n) + 1;
  auto const xs = telar::rows(data.x, 0, m);
  auto const ys = telar::rows(data.y, 0, m);
  CHECK_THAT(zero.evaluate(xs, ys, 1).loss,
             Catch::Matchers::WithinAbs(ref.evaluate(xs, ys, 1).loss, 1e-12));
  CHECK(telar::test::rel_diff(zero.param_l2(), ref.param_l2()) <= 1e-11);
  auto const zn = zero.tensor_norms(), rn = ref.tensor_norms();
  REQUIRE(zn.size() == rn.size());
  for (auto const& [name, v] : rn)
    CHECK(telar::test::rel_diff(zn.at(name), v) <= 1e-11);
}
