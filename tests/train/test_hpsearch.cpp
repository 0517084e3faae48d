// Successive halving over groups of ranks: the search space, promotion by
// validation loss, diverged and failed configurations recorded without
// stopping the others, and a leaderboard independent of the group count.
#include "support.hpp"

#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/adam.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/train/hpsearch.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

using Catch::Matchers::ContainsSubstring;

namespace {

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

int comm_size(MPI_Comm c) {
  int n = 0;
  MPI_Comm_size(c, &n);
  return n;
}

int comm_rank(MPI_Comm c) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}

telar::SearchSpace lr_space() {
  telar::SearchSpace s;
  s.add("lr", {"1e-4", "1e-3", "1e-2", "1e-1"}).add("width", {"8", "16"});
  return s;
}

// A stand-in for training: the loss is smallest at lr = 1e-2 and falls with the budget.
telar::TrialOutcome fake_train(telar::Trial const& t) {
  double const d = std::log10(t.config().real("lr")) + 2;
  double const loss = d * d + double(t.config().integer("width")) / 100 + 10.0 / double(t.budget());
  return {loss, 1 / (1 + loss), t.budget()};
}

std::vector<int> ids(telar::SearchResult const& r) {
  std::vector<int> out;
  for (auto const& t : r.leaderboard)
    out.push_back(t.id);
  return out;
}

} // namespace

TEST_CASE("A search space is the product of its axes, the last fastest", "[hpsearch]") {
  auto const grid = lr_space().grid();
  REQUIRE(grid.size() == 8);
  CHECK(grid[0].str() == "lr=1e-4 width=8");
  CHECK(grid[1].str() == "lr=1e-4 width=16");
  CHECK(grid[7].str() == "lr=1e-1 width=16");
  CHECK(grid[2].real("lr") == 1e-3);
  CHECK(grid[3].integer("width") == 16);
  CHECK_THROWS_WITH(grid[0].get("momentum"), ContainsSubstring("no parameter 'momentum'"));
  CHECK_THROWS_WITH(grid[0].integer("lr"), ContainsSubstring("lr=1e-4 is not an integer"));
  telar::SearchSpace bad;
  CHECK_THROWS_WITH(bad.add("lr", {}), ContainsSubstring("'lr' has no values"));
}

TEST_CASE("Successive halving keeps the best 1/eta and multiplies the budget", "[hpsearch]") {
  int const world = world_size();
  telar::HalvingOptions opts;
  opts.groups = world;
  opts.budget = 10;
  std::vector<int> sizes;
  auto const r = telar::successive_halving(MPI_COMM_WORLD, lr_space().grid(), opts,
                                           [&](telar::Trial const& t) {
                                             sizes.push_back(comm_size(t.comm()));
                                             return fake_train(t);
                                           });
  // 8 -> 4 -> 2 -> 1 configurations, 10 -> 20 -> 40 -> 80 steps.
  REQUIRE(r.rounds.size() == 4);
  for (int k = 0; k < 4; ++k) {
    CHECK(r.rounds[std::size_t(k)].configurations == 8 >> k);
    CHECK(r.rounds[std::size_t(k)].budget == 10LL << k);
  }
  for (int n : sizes)
    CHECK(n == 1); // one rank per group
  // lr 1e-2 (ids 4 and 5) is best, width 8 before 16, then lr 1e-3 and 1e-1.
  REQUIRE(ids(r) == std::vector<int>{4, 5, 2, 6, 3, 7, 0, 1});
  CHECK(r.leaderboard[0].status == telar::TrialStatus::finished);
  CHECK(r.leaderboard[0].steps == 80);
  CHECK(r.leaderboard[0].rounds == 4);
  CHECK(r.leaderboard[1].reason == "stopped after round 3");
  CHECK(r.leaderboard[7].rounds == 1);
  CHECK_THAT(r.table(), ContainsSubstring("lr=1e-2 width=8"));
  CHECK_THAT(r.json(), ContainsSubstring("\"leaderboard\":[{\"rank\":1,\"id\":4,"));

  SECTION("one group gives the same leaderboard") {
    opts.groups = 1;
    auto const one = telar::successive_halving(MPI_COMM_WORLD, lr_space().grid(), opts, fake_train);
    CHECK(ids(one) == ids(r));
    for (std::size_t i = 0; i < one.leaderboard.size(); ++i)
      CHECK(one.leaderboard[i].val_loss == r.leaderboard[i].val_loss);
  }
  SECTION("groups that do not divide the world are refused on every rank") {
    opts.groups = world + 1;
    CHECK_THROWS_WITH(
        telar::successive_halving(MPI_COMM_WORLD, lr_space().grid(), opts, fake_train),
        ContainsSubstring("cannot be split into " + std::to_string(world + 1) + " equal groups"));
  }
}

namespace {
// Waits like a slow trial whose collectives keep entering MPI: the queue's
// counter lives on world rank 0, and without asynchronous progress (MPICH's
// default) other ranks' fetch-and-adds wait while rank 0 stays out of MPI.
// A bare sleep there made the test depend on which group drew config 0.
void busy_in_mpi(std::chrono::milliseconds d) {
  auto const end = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < end) {
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}
} // namespace

TEST_CASE("Groups take the next configuration when they are done with one", "[hpsearch]") {
  int const world = world_size();
  telar::SearchSpace space;
  space.add("cost", {"5", "0", "0", "0", "0", "0", "0", "0"});
  telar::HalvingOptions opts;
  opts.groups = world;
  opts.rounds = 1;
  std::vector<int> mine; // the configurations this rank's group trained
  auto const r =
      telar::successive_halving(MPI_COMM_WORLD, space.grid(), opts, [&](telar::Trial const& t) {
        mine.push_back(t.id());
        if (t.config().integer("cost") > 0 && world > 1) // config 0 is slow: the rest go elsewhere
          busy_in_mpi(std::chrono::milliseconds(600));
        return telar::TrialOutcome{double(t.id()), 0, 1};
      });
  REQUIRE(r.leaderboard.size() == 8);
  for (auto const& t : r.leaderboard)
    CHECK(t.status == telar::TrialStatus::finished);
  // The slow one's group trained nothing else (round-robin would have given it 0 and 4 at 4 ranks).
  if (world > 1 && std::find(mine.begin(), mine.end(), 0) != mine.end())
    CHECK(mine == std::vector<int>{0});
  int trained = int(mine.size());
  MPI_Allreduce(MPI_IN_PLACE, &trained, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(trained == 8); // each once, whatever the timing
}

TEST_CASE("Diverged and failed configurations are recorded and rank last", "[hpsearch]") {
  telar::SearchSpace space;
  space.add("kind", {"good", "nan", "throws", "one_rank_throws", "better"});
  telar::HalvingOptions opts;
  opts.groups = world_size() >= 2 ? 2 : 1;
  opts.rounds = 2;
  opts.budget = 4;
  auto const r =
      telar::successive_halving(MPI_COMM_WORLD, space.grid(), opts, [](telar::Trial const& t) {
        std::string const& k = t.config().get("kind");
        if (k == "nan")
          t.check(3, std::numeric_limits<double>::quiet_NaN());
        if (k == "throws")
          throw telar::Error("no room for this layout");
        if (k == "one_rank_throws" && comm_rank(t.comm()) == comm_size(t.comm()) - 1)
          throw telar::Error("only the last rank of the group saw this");
        return telar::TrialOutcome{k == "better" ? 0.5 : 1.0, 0.5, t.budget()};
      });
  REQUIRE(ids(r) == std::vector<int>{4, 0, 1, 2, 3});
  CHECK(r.leaderboard[0].status == telar::TrialStatus::finished);
  CHECK(r.leaderboard[0].steps == 8);
  CHECK(r.leaderboard[1].status == telar::TrialStatus::finished); // 5 / 2 = 2 survivors
  auto const& nan = r.leaderboard[2];
  CHECK(nan.status == telar::TrialStatus::diverged);
  CHECK(nan.reason == "diverged at step 3: loss nan");
  CHECK(nan.steps == 3);
  CHECK(r.leaderboard[3].status == telar::TrialStatus::failed);
  CHECK(r.leaderboard[3].reason == "no room for this layout");
  CHECK(r.leaderboard[4].status == telar::TrialStatus::failed);
  CHECK(r.leaderboard[4].reason == "only the last rank of the group saw this");
  CHECK_THAT(r.table(), ContainsSubstring("failed: no room for this layout"));
  CHECK_THAT(r.json(), ContainsSubstring("\"val_loss\":null"));
}

namespace {

using Mlp = telar::Sequential<telar::Dense<float>, telar::ReLU<float>, telar::Dense<float>>;

// Three classes around fixed centres: learnable in a few steps.
std::pair<telar::Matrix<float>, telar::Labels<>> blobs(std::size_t n, std::uint64_t seed) {
  std::size_t const f = 6;
  telar::Matrix<float> x("x", n, f);
  telar::Labels<> y("y", n);
  auto hx = Kokkos::create_mirror_view(x);
  auto hy = Kokkos::create_mirror_view(y);
  for (std::size_t i = 0; i < n; ++i) {
    hy(i) = int(i % 3);
    for (std::size_t j = 0; j < f; ++j)
      hx(i, j) = float(0.8 * telar::test::hash_uniform(seed, i * f + j) +
                       1.5 * telar::test::hash_uniform(777, std::size_t(hy(i)) * f + j));
  }
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(y, hy);
  return {x, y};
}

// A real Trainer over the group, dp = the group's size unless "dp" says otherwise.
template <class Optimizer>
telar::TrialOutcome train_mlp(telar::Trial const& t, Optimizer opt) {
  auto const train = blobs(48, 1), val = blobs(30, 2);
  telar::TrainerOptions o;
  o.seed = t.seed();
  o.lr = telar::constant_lr(t.config().real("lr"));
  o.grid = {t.config().has("dp") ? int(t.config().integer("dp")) : 0, 1, 1};
  telar::Trainer<Mlp, telar::Strategy<telar::DataParallel<>>, Optimizer> trainer(
      t.comm(), Mlp(telar::Dense<float>(6, 8), {}, telar::Dense<float>(8, 3)), opt, o, 6);
  std::size_t const dp = std::size_t(trainer.grid_shape().dp), d = trainer.grid_coords().dp;
  auto const x = telar::rows(train.first, 48 * d / dp, 48 * (d + 1) / dp);
  auto const y = telar::rows(train.second, 48 * d / dp, 48 * (d + 1) / dp);
  for (long long s = 1; s <= t.budget(); ++s)
    t.check(s, trainer.step(x, y).loss);
  auto const v = trainer.evaluate(val.first, val.second);
  return {v.loss, v.accuracy, t.budget()};
}

telar::TrialOutcome train_real(telar::Trial const& t) {
  if (t.config().get("optimizer") == "sgd")
    return train_mlp(t, telar::SGD<float>{});
  return train_mlp(t, telar::Adam<float>{});
}

} // namespace

TEST_CASE("A search of real trainers is deterministic and survives a diverging one",
          "[hpsearch][trainer]") {
  int const world = world_size();
  telar::SearchSpace space;
  space.add("lr", {"0.05", "1e6"}).add("optimizer", {"sgd", "adam"});
  auto configs = space.grid();
  configs.push_back(telar::HyperParams().set("lr", "0.05").set("optimizer", "sgd").set("dp", "3"));
  telar::HalvingOptions opts;
  opts.groups = world >= 2 ? 2 : 1;
  opts.budget = 6;
  opts.rounds = 2;
  opts.seed = 5;
  auto const a = telar::successive_halving(MPI_COMM_WORLD, configs, opts, train_real);
  INFO(a.table());
  auto by_id = [](telar::SearchResult const& r, int id) {
    for (auto const& t : r.leaderboard)
      if (t.id == id)
        return t;
    FAIL("no configuration " << id);
    return telar::TrialRecord{};
  };
  auto const sgd_huge = by_id(a, 2);
  CHECK(sgd_huge.status == telar::TrialStatus::diverged);
  CHECK_THAT(sgd_huge.reason, ContainsSubstring("diverged")); // at a step or at evaluation
  auto const& bad_layout = a.leaderboard.back();
  CHECK(bad_layout.id == 4);
  CHECK(bad_layout.status == telar::TrialStatus::failed);
  CHECK_THAT(bad_layout.reason, ContainsSubstring("dp"));
  int finished = 0;
  for (auto const& t : a.leaderboard)
    if (t.status == telar::TrialStatus::finished) {
      ++finished;
      CHECK(std::isfinite(t.val_loss));
      CHECK(t.steps == 12);
    }
  CHECK(finished == 2); // 5 configurations, eta 2

  auto const b = telar::successive_halving(MPI_COMM_WORLD, configs, opts, train_real);
  REQUIRE(ids(b) == ids(a));
  for (std::size_t i = 0; i < a.leaderboard.size(); ++i)
    if (std::isfinite(a.leaderboard[i].val_loss)) // same seed: bit for bit
      CHECK(b.leaderboard[i].val_loss == a.leaderboard[i].val_loss);

  opts.dynamic = false; // round-robin instead of first come, first served: the same results
  auto const d = telar::successive_halving(MPI_COMM_WORLD, configs, opts, train_real);
  REQUIRE(ids(d) == ids(a));
  for (std::size_t i = 0; i < a.leaderboard.size(); ++i)
    if (std::isfinite(a.leaderboard[i].val_loss))
      CHECK(d.leaderboard[i].val_loss == a.leaderboard[i].val_loss);

  opts.groups = 1; // dp = the whole world: the same values up to rounding
  auto const c = telar::successive_halving(MPI_COMM_WORLD, configs, opts, train_real);
  REQUIRE(ids(c) == ids(a));
  for (std::size_t i = 0; i < a.leaderboard.size(); ++i)
    if (std::isfinite(a.leaderboard[i].val_loss))
      CHECK(telar::test::rel_diff(c.leaderboard[i].val_loss, a.leaderboard[i].val_loss) < 1e-5);
}
