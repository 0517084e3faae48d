// telar::SlabDataParallel: a 3-D U-Net SlabGraph trained over dp x sp with
// and without ZeRO sharding, on a telar::ProcessGrid of dp x sp, equals the
// same graph trained on the whole batch on one rank (double, 1e-11), at
// every dp x sp of 1, 2 and 4 ranks;
// and its checkpoints resume under another layout as if never stopped.
#include "support.hpp"
#include <telar/optim/adam.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/parallel/slab_data_parallel.hpp>
#include <telar/parallel/slab_step_cost.hpp>
#include <telar/parallel/spatial_unet.hpp>
#if TELAR_HAVE_HDF5
#include <telar/io/checkpoint.hpp>
#endif

#include <catch2/catch_test_macros.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using T = double;
// Slabs live where halos can be staged (host memory on a device build).
using M = telar::SlabMemorySpace;
using Exec = telar::SlabExecutionSpace;
using UNet = telar::SpatialUNetLayers<T, M>::Graph;

// Depth 1, width 2, GroupNorm (statistics per sample: independent of how
// the batch is split over dp), 8 planes: slabs of 2 at sp = 4.
telar::UNetOptions options() {
  telar::UNetOptions o;
  o.in_channels = 2, o.classes = 3, o.depth = 1, o.width = 2;
  o.norm = telar::UNetOptions::Norm::group;
  o.groups = 2;
  return o;
}
telar::Shape const shape{2, 8, 4, 4};
std::size_t const batch = 4, out_cols = 3 * 8 * 16;

// Samples [first, first + n) and rows `slab` of x [batch, C * 8 * 16].
telar::Matrix<T, M> part(telar::Matrix<T, M> const& x, std::size_t first, std::size_t n,
                         std::size_t C, telar::Slab slab) {
  std::size_t const plane = 16, rows = 8;
  telar::Matrix<T, M> out("test::part", n, C * slab.size() * plane);
  auto hx = telar::test::to_host(x);
  auto ho = Kokkos::create_mirror_view(out);
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t r = slab.begin; r < slab.end; ++r)
        for (std::size_t p = 0; p < plane; ++p)
          ho(s, (c * slab.size() + r - slab.begin) * plane + p) =
              hx(first + s, (c * rows + r) * plane + p);
  Kokkos::deep_copy(out, ho);
  return out;
}

// Steps [from, to) of `update` on L = mean over the batch of 0.5 sum y^2
// (this rank's n samples from `first`: dy = y / (n * out_cols), the mean
// over dp taken by the update). Returns the outputs of the last step.
template <class Update>
telar::Matrix<T, M> run(Update& update, UNet& g, std::size_t first, std::size_t n, int from,
                        int to) {
  telar::Matrix<T, M> y;
  for (int step = from; step < to; ++step) {
    auto const x = telar::test::random_matrix<T, M>(batch, shape.size(), 70 + std::uint64_t(step));
    auto const& out = update.forward(Exec{}, part(x, first, n, 2, g.input_slab()));
    Exec{}.fence();
    y = telar::Matrix<T, M>("test::y", out.extent(0), out.extent(1));
    Kokkos::deep_copy(y, out);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, y);
    telar::Matrix<T, M> dy("test::dy", out.extent(0), out.extent(1));
    auto hd = Kokkos::create_mirror_view(dy);
    for (std::size_t i = 0; i < h.span(); ++i)
      hd.data()[i] = h.data()[i] / T(n * out_cols);
    Kokkos::deep_copy(dy, hd);
    update.backward(Exec{}, dy);
    update.step(Exec{}, 0.01);
  }
  CHECK(update.steps() == to);
  update.gather(Exec{}); // ZeRO-3: the values back in the graph (outliving the update)
  return y;
}

// Buckets of 2 KiB: several per step (the graph has ~1.3k parameters);
// the gradient norm clipped to `clip` (0: not).
telar::SlabDataParallelOptions small_buckets(telar::Communicator const* world = nullptr,
                                             double clip = 0) {
  telar::SlabDataParallelOptions o;
  o.bucket_bytes = std::size_t(2) << 10;
  o.world = world;
  o.clip_grad_norm = clip;
  return o;
}

// Three steps of `opt` (see run()); with `world`, the slabs' gradient
// parts summed over it with the dp average (sums_over_world).
template <class DP, class Opt>
telar::Matrix<T, M> train(UNet& g, telar::Communicator const* dp, std::size_t first, std::size_t n,
                          Opt opt, telar::Communicator const* world = nullptr, double clip = 0) {
  telar::SlabDataParallel<UNet, DP, Opt> update(g, dp, 5, opt, small_buckets(world, clip));
  bool const fused = world != nullptr && g.spatial_size() > 1;
  CHECK(update.sums_over_world() == fused);
  CHECK(update.sync_size() == (fused ? world->size() : dp != nullptr ? dp->size() : 1));
  return run(update, g, first, n, 0, 3);
}

double max_diff(telar::Matrix<T, M> const& a, telar::Matrix<T, M> const& b) {
  auto ha = telar::test::to_host(a), hb = telar::test::to_host(b);
  REQUIRE(ha.span() == hb.span());
  double worst = 0;
  for (std::size_t i = 0; i < ha.span(); ++i)
    worst = std::max(worst, std::abs(double(ha.data()[i]) - double(hb.data()[i])));
  return worst;
}

std::vector<double> parameters_of(UNet& g) {
  std::vector<double> all;
  g.parameters([&](char const*, auto& v, auto&) {
    auto h = telar::test::to_host(v);
    all.insert(all.end(), h.data(), h.data() + h.span());
  });
  return all;
}

// Three steps of `opt` on a grid of dp x sp ranks (the update summing
// over its world, sums_over_world).
template <class DP, class Opt>
telar::Matrix<T, M> train(UNet& g, telar::ProcessGrid const& grid, std::size_t first, std::size_t n,
                          Opt opt, double clip) {
  using S = telar::Strategy<DP, telar::SpatialParallel>;
  telar::SlabDataParallel<UNet, S, Opt> update(g, grid, 5, opt, small_buckets(nullptr, clip));
  static_assert(std::is_same_v<typename decltype(update)::sharding, typename DP::sharding>);
  CHECK(update.sums_over_world() == (g.spatial_size() > 1));
  CHECK(update.sync_size() == grid.world().size());
  return run(update, g, first, n, 0, 3);
}

// One layout of check_layouts: dp replicas of sp ranks, on a ProcessGrid
// (summed over its world) or summed by each wrapper over sp and synced over dp.
template <class DP, class Opt>
void check_layout(telar::Communicator const& world, int sp, bool over_world, Opt opt, double clip,
                  telar::Matrix<T, M> const& y, std::vector<double> const& initial,
                  std::vector<double> const& want) {
  telar::GridShape split;
  split.sp = sp; // dp from the world
  telar::ProcessGrid const grid(world, split);
  UNet g = telar::spatial_unet<T, M>(grid.sp(), options());
  g.build(shape); // the update draws it (seed 5, as serial's)
  std::size_t const n = batch / std::size_t(grid.shape().dp);
  std::size_t const first = std::size_t(grid.coords().dp) * n;
  auto const ys = over_world ? train<DP>(g, grid, first, n, opt, clip)
                             : train<DP>(g, &grid.dp(), first, n, opt, nullptr, clip);
  CHECK(max_diff(ys, part(y, first, n, 3, g.output_slab())) < 1e-11);
  auto const got = parameters_of(g);
  REQUIRE(got.size() == want.size());
  double worst = 0, moved = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]));
    moved = std::max(moved, std::abs(want[i] - initial[i]));
  }
  CHECK(worst < 1e-11);
  CHECK(moved > (clip > 0 ? 1e-5 : 1e-4)); // training moved them (clipped: by lr x clip a step)
}

// `clip`: the gradient norm clipped to it (the serial run's too).
template <class Sharding, class Opt>
void check_layouts(char const* name, Opt opt, double clip = 0) {
  using DP = telar::DataParallel<telar::TopologyAwareAllreduce, Sharding>;
  telar::Communicator world(MPI_COMM_WORLD, "world"), self(MPI_COMM_SELF, "self");
  UNet serial = telar::spatial_unet<T, M>(self, options());
  serial.build(shape);
  serial.initialize(5);
  auto const initial = parameters_of(serial);
  auto const y = train<DP>(serial, nullptr, 0, batch, opt, nullptr, clip);
  auto const want = parameters_of(serial);
  if (clip > 0) { // the clip binds: unclipped steps end elsewhere
    UNet free = telar::spatial_unet<T, M>(self, options());
    free.build(shape);
    free.initialize(5);
    train<DP>(free, nullptr, 0, batch, opt);
    auto const other = parameters_of(free);
    double apart = 0;
    for (std::size_t i = 0; i < other.size(); ++i)
      apart = std::max(apart, std::abs(other[i] - want[i]));
    CHECK(apart > 1e-6);
  }
  for (int sp = 1; sp <= world.size(); sp *= 2)
    for (bool const over_world : {true, false}) {
      if (sp == 1 && !over_world)
        continue; // the same run
      INFO(name << ", dp " << world.size() / sp << " x sp " << sp
                << (over_world ? ", summed over the world" : "") << ", rank " << world.rank());
      check_layout<DP>(world, sp, over_world, opt, clip, y, initial, want);
    }
}

} // namespace

TEST_CASE("SlabDataParallel: a U-Net over dp x sp trains to the serial parameters, with and "
          "without ZeRO",
          "[spatial][mpi]") {
  check_layouts<telar::NoSharding>("no sharding, Adam", telar::Adam<T>{});
  check_layouts<telar::ZeRO<1>>("ZeRO-1, Adam", telar::Adam<T>{});
  check_layouts<telar::ZeRO<2>>("ZeRO-2, Adam", telar::Adam<T>{});
  check_layouts<telar::ZeRO<3>>("ZeRO-3, Adam", telar::Adam<T>{});
  // SGD's update is proportional to the gradient (Adam's nearly is not):
  // a sum over dp where the mean belongs would show here.
  telar::SGD<T> sgd;
  sgd.momentum = 0.9;
  check_layouts<telar::NoSharding>("no sharding, SGD", sgd);
  check_layouts<telar::ZeRO<2>>("ZeRO-2, SGD", sgd);
  // Clipping takes the norm of the whole gradient: over ZeRO's shards, once
  // over replicated values.
  check_layouts<telar::NoSharding>("no sharding, SGD, clipped", sgd, 1e-3);
  check_layouts<telar::ZeRO<2>>("ZeRO-2, SGD, clipped", sgd, 1e-3);
}

namespace {
// One step of `update` on a loss gradient that is NaN in one value of the
// last rank's slab (or finite): true when the update skipped it.
template <class Update>
bool poisoned_step(Update& update, UNet& g, telar::Communicator const& world, bool poison) {
  auto const x = telar::test::random_matrix<T, M>(batch, shape.size(), 9);
  auto const& y = update.forward(Exec{}, part(x, 0, batch, 2, g.input_slab()));
  telar::Matrix<T, M> dy("test::dy", y.extent(0), y.extent(1));
  auto h = Kokkos::create_mirror_view(dy);
  for (std::size_t i = 0; i < h.span(); ++i)
    h.data()[i] = T(1e-3);
  if (poison && world.rank() == world.size() - 1)
    h.data()[h.span() / 2] = std::nan("");
  Kokkos::deep_copy(dy, h);
  update.backward(Exec{}, dy);
  return update.step(Exec{}, 0.01);
}

// A gradient NaN on one rank stops every rank with the same message
// (NonFinite::stop), or skips the update everywhere (skip), leaving the
// parameters as they were.
template <class Sharding>
void check_nonfinite(char const* name) {
  using DP = telar::DataParallel<telar::TopologyAwareAllreduce, Sharding>;
  telar::Communicator world(MPI_COMM_WORLD, "world");
  INFO(name << ", " << world.size() << " ranks");
  UNet g = telar::spatial_unet<T, M>(world, options()); // one sample over every rank
  g.build(shape);
  auto o = small_buckets(&world);
  {
    telar::SlabDataParallel<UNet, DP> update(g, nullptr, 5, telar::Adam<T>{}, o);
    std::string what;
    try {
      poisoned_step(update, g, world, true);
    } catch (telar::NonFiniteError const& e) {
      what = e.what();
    }
    INFO(what);
    CHECK(what.find("telar::SlabDataParallel::step: step 1: the gradient of node") == 0);
    CHECK(what.find("SlabDataParallelOptions::nonfinite") != std::string::npos);
    CHECK(what.find("the loss") == std::string::npos); // it saw no loss
    unsigned long long const mine = what.size();
    unsigned long long most = mine;
    world.allreduce(&most, 1, telar::ReduceOp::max);
    CHECK(most == mine); // the same message on every rank (its length, at least)
  }
  o.nonfinite = telar::NonFinite::skip;
  telar::SlabDataParallel<UNet, DP> update(g, nullptr, 5, telar::Adam<T>{}, o);
  CHECK_FALSE(poisoned_step(update, g, world, false));
  update.gather(Exec{});
  auto const before = parameters_of(g);
  CHECK(poisoned_step(update, g, world, true));
  update.gather(Exec{});
  CHECK(parameters_of(g) == before);
  CHECK(update.steps() == 2);
  CHECK(update.skipped_steps() == 1);
  CHECK_FALSE(poisoned_step(update, g, world, false)); // and trains on
  update.gather(Exec{});
  CHECK(parameters_of(g) != before);
}
} // namespace

TEST_CASE("SlabDataParallel: a gradient that is not finite stops every rank or is skipped",
          "[spatial][mpi]") {
  check_nonfinite<telar::NoSharding>("no sharding");
  check_nonfinite<telar::ZeRO<1>>("ZeRO-1");
  check_nonfinite<telar::ZeRO<3>>("ZeRO-3");
}

TEST_CASE("SlabDataParallel: ZeRO shards the optimizer state, the gradients (2) and the "
          "values (3) over dp",
          "[spatial][mpi]") {
  telar::Communicator world(MPI_COMM_WORLD, "world");
  telar::Communicator dp = world.split(world.rank(), 0, "dp"); // each rank alone
  // Every rank the whole sample (a group of one), the world as dp.
  auto unet = [&] {
    UNet g = telar::spatial_unet<T, M>(dp, options());
    g.build(shape);
    return g;
  };
  UNet g = unet(), h = unet(), k = unet(), l = unet();
  using Z1 = telar::DataParallel<telar::TopologyAwareAllreduce, telar::ZeRO<1>>;
  using Z2 = telar::DataParallel<telar::TopologyAwareAllreduce, telar::ZeRO<2>>;
  using Z3 = telar::DataParallel<telar::TopologyAwareAllreduce, telar::ZeRO<3>>;
  telar::SlabDataParallel<UNet, Z1> alone(g, &dp, 5), one(h, &world, 5);
  telar::SlabDataParallel<UNet, Z2> two(k, &world, 5);
  telar::SlabDataParallel<UNet, Z3> three(l, &world, 5);
  std::size_t const N = alone.size(), W = std::size_t(world.size());
  CHECK(alone.shard() == std::make_pair(std::size_t(0), N));
  auto const [lo, hi] = one.shard();
  CHECK(hi - lo == one.size() / W);
  CHECK(three.shard().second - three.shard().first == three.size() / W);
  CHECK(alone.state_bytes() == sizeof(T) * 4 * N); // values, gradients, Adam's m and v
  CHECK(one.state_bytes() == sizeof(T) * (2 * one.size() + 2 * one.size() / W));
  CHECK(two.state_bytes() == sizeof(T) * (two.size() + 3 * two.size() / W));
  CHECK(three.state_bytes() == sizeof(T) * 4 * (three.size() / W));
  // ZeRO-3's graph holds no values between steps; gather() brings them back.
  std::size_t held = 0;
  l.parameters([&](char const*, auto& v, auto&) { held += v.data() != nullptr ? 1 : 0; });
  CHECK(held == 0);
  three.gather(Exec{});
  l.parameters([&](char const*, auto& v, auto&) { CHECK(v.data() != nullptr); });
}

TEST_CASE("SlabDataParallel: summed over the world, ZeRO shards span dp x sp; the graph sums "
          "its own gradients again after",
          "[spatial][mpi]") {
  telar::Communicator world(MPI_COMM_WORLD, "world");
  std::size_t const W = std::size_t(world.size());
  UNet g = telar::spatial_unet<T, M>(world, options()); // one sample split over every rank
  g.build(shape);
  using Z1 = telar::DataParallel<telar::TopologyAwareAllreduce, telar::ZeRO<1>>;
  {
    telar::SlabDataParallel<UNet, Z1> update(g, nullptr, 5, telar::Adam<T>{},
                                             small_buckets(&world));
    CHECK(update.sums_over_world() == (W > 1));
    CHECK(update.shard().second - update.shard().first == update.size() / W);
    CHECK(update.state_bytes() == sizeof(T) * (2 * update.size() + 2 * update.size() / W));
    telar::group_sum_tally() = {};
    run(update, g, 0, batch, 0, 1);
    CHECK(telar::group_sum_tally().sums == 0); // the sync summed the parts
  }
  // A world of other than dp x sp ranks is refused, the same on every rank.
  if (W == 4) {
    telar::Communicator half = world.split(world.rank() / 2, world.rank() % 2, "sp");
    UNet split = telar::spatial_unet<T, M>(half, options());
    split.build(shape);
    using Plain = telar::DataParallel<telar::TopologyAwareAllreduce, telar::NoSharding>;
    try {
      telar::SlabDataParallel<UNet, Plain> wrong(split, nullptr, 5, telar::Adam<T>{},
                                                 small_buckets(&world));
      FAIL("a world of 4 ranks for dp x sp = 1 x 2 was taken");
    } catch (telar::Error const& e) {
      CHECK(std::string(e.what()) ==
            "telar::SlabDataParallel: the world has 4 ranks, not dp x sp = 1 x 2");
    }
  }
  // A grid that is not the graph's dp x sp is refused, naming both.
  if (W > 1) {
    using Plain = telar::DataParallel<telar::TopologyAwareAllreduce, telar::NoSharding>;
    auto refusal = [&](telar::GridShape shape, auto policies) {
      telar::ProcessGrid const grid(world, shape);
      try {
        telar::SlabDataParallel<UNet, decltype(policies)> wrong(g, grid, 5);
      } catch (telar::Error const& e) {
        return std::string(e.what());
      }
      return std::string("taken");
    };
    std::string const w = std::to_string(W);
    CHECK(refusal({}, Plain{}) ==
          "telar::SlabDataParallel: the grid dp=" + w +
              " x pp=1 x tp=1 splits each sample over sp=1 ranks, the graph over " + w +
              " (build it over the grid's sp group)");
    CHECK(refusal({1, 1, int(W)}, Plain{}) ==
          "telar::SlabDataParallel: the grid dp=1 x pp=1 x tp=" + w +
              " has pipeline or tensor-parallel ranks; a SlabGraph trains on dp x sp");
    CHECK(refusal({1, 1, 1, int(W)}, telar::Strategy<Plain>{}) ==
          "telar::SlabDataParallel: the grid dp=1 x sp=" + w +
              " x pp=1 x tp=1 splits samples, but the strategy (dp) has no SpatialParallel; add "
              "telar::SpatialParallel to the Strategy or set sp=1");
  }
  // The graph on its own: each wrapper with parameters sums over the group.
  auto const x = telar::test::random_matrix<T, M>(batch, shape.size(), 3);
  auto const& y = g.forward(Exec{}, part(x, 0, batch, 2, g.input_slab()));
  telar::Matrix<T, M> dy("test::dy", y.extent(0), y.extent(1));
  Kokkos::deep_copy(dy, T(1));
  telar::group_sum_tally() = {};
  g.backward(Exec{}, dy);
  CHECK((telar::group_sum_tally().sums > 0) == (W > 1));
}

TEST_CASE("SlabGraph: an input read with its halo rows skips the first exchange and changes "
          "nothing",
          "[spatial][mpi]") {
  telar::Communicator world(MPI_COMM_WORLD, "world");
  int const W = world.size();
  auto unet = [&] {
    UNet g = telar::spatial_unet<T, M>(world, options()); // one sample over every rank
    g.build(shape);
    g.initialize(5);
    return g;
  };
  UNet a = unet(), b = unet();
  auto const h = b.input_halo();
  telar::Slab const slab = b.input_slab();
  telar::Slab const wide{slab.begin - h[0], slab.end + h[1]};
  INFO("rank " << world.rank() << " of " << W << ", halo " << h[0] << ", " << h[1]);
  CHECK(h[0] == (world.rank() > 0 ? 1u : 0u)); // the first 3x3x3 convolution's
  CHECK(h[1] == (world.rank() + 1 < W ? 1u : 0u));
  CHECK(b.input_size_with_halo() == 2 * wide.size() * 16);
  auto const x = telar::test::random_matrix<T, M>(batch, shape.size(), 21);
  telar::Matrix<T, M> dy("test::dy", batch, b.output_slab().size() * 3 * 16);
  Kokkos::deep_copy(dy, T(1e-2));
  auto step = [&](UNet& g, telar::Slab rows) { // forward and backward: bytes sent
    telar::halo_tally() = {};
    auto const& y = g.forward(Exec{}, part(x, 0, batch, 2, rows));
    g.backward(Exec{}, dy);
    return std::make_pair(y, double(telar::halo_tally().bytes_sent));
  };
  auto const [ya, sent_a] = step(a, slab);
  auto const [yb, sent_b] = step(b, wide);
  CHECK(max_diff(ya, yb) < 1e-13);
  CHECK((sent_b < sent_a) == (W > 1)); // the input's rows were not sent
  // The cost model counts the same bytes either way.
  telar::MachineProfile const prof;
  telar::SlabSyncShape alone;
  alone.over_world = false;
  CHECK(telar::predict_slab_step(a, batch, 1, W, prof, alone).halo_bytes == sent_a);
  CHECK(telar::predict_slab_step(b, batch, 1, W, prof, alone, true).halo_bytes == sent_b);
  std::vector<double> ga, gb;
  a.parameters([&](char const*, auto&, auto& g) {
    auto hg = telar::test::to_host(g);
    ga.insert(ga.end(), hg.data(), hg.data() + hg.span());
  });
  b.parameters([&](char const*, auto&, auto& g) {
    auto hg = telar::test::to_host(g);
    gb.insert(gb.end(), hg.data(), hg.data() + hg.span());
  });
  REQUIRE(ga.size() == gb.size());
  double worst = 0;
  for (std::size_t i = 0; i < ga.size(); ++i)
    worst = std::max(worst, std::abs(ga[i] - gb[i]));
  CHECK(worst < 1e-13);
}

#if TELAR_HAVE_HDF5
namespace {

// A graph of `sp` ranks per replica, `dp` replicas, on this run's world:
// its communicators, this rank's samples, the graph (built).
struct Replica {
  Replica(telar::Communicator const& world, int dp_size)
      : sp_size(world.size() / dp_size), d(world.rank() / sp_size), s(world.rank() % sp_size),
        sp(world.split(d, s, "sp")), dp(world.split(s, d, "dp")),
        g(telar::spatial_unet<T, M>(sp, options())), n(batch / std::size_t(dp_size)),
        first(std::size_t(d) * n) {
    g.build(shape);
  }
  int sp_size, d, s;
  telar::Communicator sp, dp;
  UNet g;
  std::size_t n, first;
};

// Two Adam steps under (dp_a, ZeRO stage A), a checkpoint, then the third
// step under (dp_b, stage B) on a graph drawn from another seed and
// restored from the file: the parameters of three serial steps.
template <class A, class B>
void check_resume(int dp_a, int dp_b, std::string const& dir) {
  telar::Communicator world(MPI_COMM_WORLD, "world"), self(MPI_COMM_SELF, "self");
  INFO("saved at dp " << dp_a << " " << A::name() << ", resumed at dp " << dp_b << " " << B::name()
                      << " (" << world.size() << " ranks)");
  UNet serial = telar::spatial_unet<T, M>(self, options());
  serial.build(shape);
  serial.initialize(5);
  train<telar::DataParallel<telar::TopologyAwareAllreduce, telar::NoSharding>>(
      serial, nullptr, 0, batch, telar::Adam<T>{});
  auto const want = parameters_of(serial);
  using Opt = telar::Adam<T>;
  std::string path;
  {
    Replica r(world, dp_a);
    telar::SlabDataParallel<UNet, telar::DataParallel<telar::TopologyAwareAllreduce, A>, Opt> u(
        r.g, &r.dp, 5, Opt{}, small_buckets(&world));
    run(u, r.g, r.first, r.n, 0, 2);
    path = telar::save_checkpoint(u, dir, {0, 2, 7});
  }
  Replica r(world, dp_b);
  telar::SlabDataParallel<UNet, telar::DataParallel<telar::TopologyAwareAllreduce, B>, Opt> u(
      r.g, &r.dp, 99, Opt{}, small_buckets(&world));
  auto const pos = telar::load_checkpoint(u, path);
  CHECK(pos.batch == 2);
  CHECK(u.steps() == 2);
  run(u, r.g, r.first, r.n, 2, 3);
  auto const got = parameters_of(r.g);
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - want[i]));
  CHECK(worst < 1e-11);
}

} // namespace

TEST_CASE("SlabDataParallel: a checkpoint resumes under another dp x sp and ZeRO stage",
          "[spatial][mpi][checkpoint]") {
  telar::Communicator world(MPI_COMM_WORLD, "world");
  std::string const dir = "slab_checkpoints_np" + std::to_string(world.size());
  int const all = world.size();
  // Every rank a replica with ZeRO-1 shards -> one replica split over every rank.
  check_resume<telar::ZeRO<1>, telar::NoSharding>(all, 1, dir + "/a");
  // Split over every rank -> every rank a replica, gradients in ZeRO-2 groups.
  check_resume<telar::NoSharding, telar::ZeRO<2>>(1, all, dir + "/b");
  // ZeRO-3's value shards -> ZeRO-1 (the same dp: the shards are laid out alike).
  check_resume<telar::ZeRO<3>, telar::ZeRO<1>>(all, all, dir + "/c");
  // One replica split over every rank, ZeRO-3 shards over all of them (the
  // parts summed over the world) -> every rank a replica, ZeRO-1.
  check_resume<telar::ZeRO<3>, telar::ZeRO<1>>(1, all, dir + "/d");
}
#endif
