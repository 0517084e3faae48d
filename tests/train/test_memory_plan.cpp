// The memory plan against the meter: for every layout of the world and every
// sharding policy, the measured per-category peaks after two steps are
// within 5% of telar::plan_memory (small categories: within an absolute
// slack, see kSlack). And a layout over the budget is refused before any
// allocation, with the same message on every rank.
#include "support.hpp"

#include <telar/core/recompute.hpp>
#include <telar/data/synthetic.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/adam.hpp>
#include <telar/parallel/memory_plan.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

namespace {

using T = float;
// Sizes are multiples of 16 floats, so the store's per-tensor padding is 0
// and parameters, gradients and optimizer state are predicted exactly.
using Mlp = telar::Sequential<telar::ColumnParallel<telar::Dense<T>>, telar::ReLU<T>,
                              telar::RowParallel<telar::Dense<T>>, telar::GELU<T>, telar::Dense<T>>;
Mlp make_mlp() {
  return Mlp(telar::ColumnParallel<telar::Dense<T>>(64, 128), {},
             telar::RowParallel<telar::Dense<T>>(128, 64), {}, telar::Dense<T>(64, 16));
}

// The loss's per-row buffers and Kokkos' own reduction scratch are a few
// hundred bytes the plan only estimates; 4 KiB is far below every category
// that matters here (parameters alone are ~45 KiB).
constexpr std::size_t kSlack = 4096;

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

struct Layout {
  int dp, pp, tp;
  std::string schedule;
};

// Every factorisation of n, each pipeline one with every schedule that fits
// 5 layers.
std::vector<Layout> layouts(int n) {
  std::vector<Layout> out;
  for (int pp = 1; pp <= n; ++pp)
    for (int tp = 1; tp <= n / pp; ++tp) {
      if (n % (pp * tp) != 0)
        continue;
      int const dp = n / (pp * tp);
      if (pp == 1) {
        out.push_back({dp, pp, tp, ""});
        continue;
      }
      for (char const* s : {"gpipe", "1f1b", "zb-h1", "interleaved"})
        if (std::string(s) != "interleaved" || pp * 2 <= 5)
          out.push_back({dp, pp, tp, s});
    }
  return out;
}

template <class Sharding>
using Strat = telar::Strategy<telar::DataParallel<telar::RingAllreduce, Sharding>,
                              telar::PipelineParallel<>, telar::TensorParallel<>>;

// Measured vs planned on this rank; returns what is off ("" if all fit).
std::string compare(telar::MemoryBytes const& got, telar::MemoryBytes const& want) {
  std::string off;
  for (int i = 0; i < telar::MemoryBytes::count; ++i) {
    auto const c = telar::MemoryCategory(i);
    double const g = double(got[c]), w = double(want[c]);
    double const tol = std::max(0.05 * w, double(kSlack));
    if (g > w + tol || g < w - tol)
      off += std::string(telar::MemoryBytes::key(c)) + " measured " + std::to_string(got[c]) +
             " planned " + std::to_string(want[c]) + "; ";
  }
  return off;
}

using RecomputedMlp = telar::RecomputeAll<Mlp>;
RecomputedMlp make_recomputed() {
  return telar::recompute_all(make_mlp());
}

template <class Sharding, class Model = Mlp>
void check_layouts(bool shared_memory, Model (*make)() = make_mlp) {
  int const n = world_size();
  std::size_t const batch = 32;
  auto const ds = telar::make_synthetic(batch, 64, 16, 5);
  telar::Matrix<T> x("x", batch, 64);
  telar::Labels<> y("y", batch);
  auto hx = Kokkos::create_mirror_view(x);
  auto hy = Kokkos::create_mirror_view(y);
  for (std::size_t i = 0; i < batch; ++i) {
    hy(i) = ds.y[i];
    for (std::size_t j = 0; j < 64; ++j)
      hx(i, j) = T(ds.x[i * 64 + j]);
  }
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(y, hy);
  for (Layout const& l : layouts(n)) {
    telar::TrainerOptions opts;
    opts.grid = {l.dp, l.pp, l.tp};
    opts.schedule = l.schedule;
    opts.microbatches = 4;
    opts.batch_size = batch;
    opts.shared_memory = shared_memory;
    opts.bucket_bytes = 16 << 10;
    std::string off;
    if (std::getenv("TELAR_TEST_VERBOSE"))
      std::fprintf(stderr, "layout dp=%d pp=%d tp=%d %s\n", l.dp, l.pp, l.tp, l.schedule.c_str());
    {
      telar::Trainer<Model, Strat<Sharding>, telar::AdamW<T>> trainer(MPI_COMM_WORLD, make(),
                                                                      telar::AdamW<T>{}, opts, 64);
      std::size_t const local = batch / std::size_t(l.dp), b = trainer.grid_coords().dp * local;
      for (int s = 0; s < 2; ++s)
        trainer.step(telar::rows(x, b, b + local), telar::rows(y, b, b + local));
      CHECK(trainer.memory_plan().warnings.empty());
      off = compare(trainer.memory(), trainer.memory_plan().bytes);
      if (std::getenv("TELAR_TEST_VERBOSE"))
        std::fprintf(stderr, "  rank %d measured %s\n  rank %d planned  %s\n", trainer.rank(),
                     trainer.memory().json().c_str(), trainer.rank(),
                     trainer.memory_plan().bytes.json().c_str());
      INFO("rank " << trainer.rank() << " " << trainer.memory_plan().layout() << " " << l.schedule
                   << ": measured " << trainer.memory().str() << " | planned "
                   << trainer.memory_plan().bytes.str() << " | " << off);
      CHECK(off.empty());
    }
    int bad = off.empty() ? 0 : 1, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    REQUIRE(any == 0); // stop every rank together at the first layout off
  }
}

} // namespace

TEST_CASE("The memory plan matches the meter: NoSharding", "[memory]") {
  check_layouts<telar::NoSharding>(true);
}
TEST_CASE("The memory plan matches the meter: ZeRO<1> distributed", "[memory]") {
  check_layouts<telar::ZeRO<1>>(false);
}
TEST_CASE("The memory plan matches the meter: ZeRO<1> shared memory", "[memory]") {
  check_layouts<telar::ZeRO<1>>(true);
}
TEST_CASE("The memory plan matches the meter: ZeRO<2>", "[memory]") {
  check_layouts<telar::ZeRO<2>>(true);
}
TEST_CASE("The memory plan matches the meter: ZeRO<3>, gathered per micro-batch", "[memory]") {
  check_layouts<telar::ZeRO<3>>(true);
}
TEST_CASE("The memory plan matches the meter: ZeRO<3>, gathered per step", "[memory]") {
  check_layouts<telar::ZeRO<3, telar::ZeRO3Gather::PerStep>>(true);
}

// Recompute keeps one rebuilt state per layer (more between the split
// backward halves of zero-bubble schedules) instead of saved state per slot.
TEST_CASE("The memory plan matches the meter: recompute_all", "[memory]") {
  check_layouts<telar::NoSharding>(true, make_recomputed);
}

TEST_CASE("The plan allocates nothing", "[memory]") {
  telar::MemoryMeterInstall install;
  auto& meter = telar::MemoryMeter::instance();
  telar::MemoryMeter::Scope scope(telar::MemoryCategory::workspace);
  std::uint64_t const before = meter.allocations();
  telar::TrainerOptions opts;
  opts.batch_size = 64;
  auto plan =
      telar::plan_memory<Mlp, Strat<telar::ZeRO<1>>, telar::AdamW<T>>(make_mlp(), opts, 64, 4, 1);
  CHECK(meter.allocations() == before);
  CHECK(plan.bytes[telar::MemoryCategory::optimizer_state] > 0);
  telar::Vector<T> probe("telar::probe", 8); // the meter does see allocations
  CHECK(meter.allocations() == before + 1);
}

TEST_CASE("A layout over the budget is refused before any allocation", "[memory]") {
  auto& meter = telar::MemoryMeter::instance();
  std::uint64_t const before = meter.allocations();
  telar::TrainerOptions opts;
  opts.grid = {0, 1, 1};
  opts.batch_size = 32;
  opts.memory_budget = 1024; // far too small for anything
  std::string what;
  try {
    telar::Trainer<Mlp, Strat<telar::NoSharding>, telar::AdamW<T>> trainer(
        MPI_COMM_WORLD, make_mlp(), telar::AdamW<T>{}, opts, 64);
  } catch (telar::MemoryError const& e) {
    what = e.what();
  }
  INFO(what);
  CHECK(meter.allocations() == before);
  CHECK(what.find("over the budget of 1 KiB") != std::string::npos);
  CHECK(what.find("no layout of " + std::to_string(world_size()) + " ranks fits") !=
        std::string::npos);
  unsigned long long const h = std::hash<std::string>{}(what), lo = h, hi = h;
  unsigned long long mn = 0, mx = 0;
  MPI_Allreduce(&lo, &mn, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&hi, &mx, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  CHECK(mn == mx); // the same message on every rank
}
