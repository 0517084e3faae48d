// telar::ProcessGrid: every factorisation of the world, sub-communicator
// membership and ranks, and the error paths.
#include <telar/comm/process_grid.hpp>

#include "mpi_check.hpp"

#include <catch2/catch_test_macros.hpp>

#include <cstdlib>
#include <string>
#include <vector>

using telar::Communicator;
using telar::GridShape;
using telar::ProcessGrid;

namespace {
// World ranks of the members of `sub`, ordered by their rank in `sub`.
std::vector<int> members(Communicator const& sub, int world_rank) {
  std::vector<int> out(static_cast<std::size_t>(sub.size()));
  sub.allgather(&world_rank, 1, out.data());
  return out;
}

void check_grid(Communicator const& world, GridShape shape, telar::GridOrder order) {
  using telar::GridAxis;
  ProcessGrid grid(world, shape, order);
  GridShape const s = grid.shape();
  int const me = world.rank();
  auto const c = grid.coords();
  bool ok = s.dp * s.sp * s.pp * s.tp == world.size() && grid.rank_of(c) == me;
  ok = ok && grid.world().size() == world.size() && grid.world().rank() == me;
  // Each axis's group: its size and my rank in it, and its members, the
  // ranks that differ from me in that coordinate only.
  for (GridAxis axis : {GridAxis::dp, GridAxis::pp, GridAxis::tp, GridAxis::sp}) {
    auto const g = axis == GridAxis::dp   ? telar::GridGroup::dp
                   : axis == GridAxis::pp ? telar::GridGroup::pp
                   : axis == GridAxis::tp ? telar::GridGroup::tp
                                          : telar::GridGroup::sp;
    Communicator const& sub = grid.group(g);
    ok = ok && sub.size() == s.along(axis) && sub.rank() == c.along(axis);
    auto const ranks = members(sub, me);
    for (int k = 0; k < s.along(axis); ++k) {
      auto at = c;
      at.along(axis) = k;
      ok = ok && ranks[std::size_t(k)] == grid.rank_of(at);
    }
  }
  ok = ok && &grid.sp() == &grid.group(telar::GridGroup::sp) &&
       &grid.dp() == &grid.group(telar::GridGroup::dp);
  // The model-parallel group: every rank with my dp coordinate, in world order.
  auto mp = members(grid.mp(), me);
  ok = ok && grid.mp().size() == s.sp * s.pp * s.tp;
  for (std::size_t k = 0; k < mp.size(); ++k)
    ok = ok && grid.coords_of(mp[k]).dp == c.dp && (k == 0 || mp[k - 1] < mp[k]);
  ok = ok && &grid.group(telar::GridGroup::mp) == &grid.mp() &&
       &grid.group(telar::GridGroup::world) == &grid.world();
  if (order == telar::default_grid_order) // the documented layout
    ok = ok && me == ((c.pp * s.dp + c.dp) * s.sp + c.sp) * s.tp + c.tp;
  for (int r = 0; r < world.size(); ++r)
    ok = ok && grid.rank_of(grid.coords_of(r)) == r &&
         ProcessGrid::coords_in(s, order, r).along(GridAxis::sp) == grid.coords_of(r).sp;
  INFO(grid.name());
  TELAR_REQUIRE_ALL(ok);
}
} // namespace

TEST_CASE("every factorisation of the world", "[comm][grid]") {
  using telar::GridAxis;
  Communicator world(MPI_COMM_WORLD, "world");
  int const p = world.size();
  for (int sp = 1; sp <= p; ++sp)
    for (int pp = 1; pp <= p; ++pp)
      for (int tp = 1; tp <= p; ++tp) {
        if (p % (sp * pp * tp) != 0)
          continue;
        check_grid(world, GridShape{0, pp, tp, sp}, telar::default_grid_order);
        check_grid(world, GridShape{p / (sp * pp * tp), pp, tp, sp}, telar::default_grid_order);
        check_grid(world, GridShape{0, pp, tp, sp},
                   {GridAxis::tp, GridAxis::sp, GridAxis::pp, GridAxis::dp});
        check_grid(world, GridShape{0, pp, tp, sp},
                   {GridAxis::sp, GridAxis::tp, GridAxis::dp, GridAxis::pp});
      }
}

TEST_CASE("grid names and default layout", "[comm][grid]") {
  Communicator world(MPI_COMM_WORLD, "world");
  int const p = world.size();
  ProcessGrid grid(world, GridShape{});
  TELAR_REQUIRE_ALL(grid.name() == "dp=" + std::to_string(p) + " x pp=1 x tp=1");
  TELAR_REQUIRE_ALL(grid.dp().size() == p && grid.dp().rank() == world.rank());
  TELAR_REQUIRE_ALL(ProcessGrid::describe({2, 1, 2}) == "dp=2 x pp=1 x tp=2");
  TELAR_REQUIRE_ALL(ProcessGrid::describe({2, 1, 1, 2}) == "dp=2 x sp=2 x pp=1 x tp=1");
  // Sub-communicators work for collectives.
  int v = 1;
  grid.dp().allreduce(&v, 1);
  TELAR_REQUIRE_ALL(v == p);
}

TEST_CASE("shapes that do not fit throw the same GridError on every rank", "[comm][grid]") {
  Communicator world(MPI_COMM_WORLD, "world");
  int const p = world.size();
  auto message = [&](GridShape s) {
    try {
      ProcessGrid g(world, s);
    } catch (telar::GridError const& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // Product mismatch, the exact wording promised in the docs.
  std::string m = message(GridShape{p + 1, 1, 1});
  INFO(m);
  TELAR_REQUIRE_ALL(m == "telar::ProcessGrid: world size " + std::to_string(p) +
                             " does not fit dp=" + std::to_string(p + 1) +
                             " x pp=1 x tp=1 (product " + std::to_string(p + 1) +
                             "); choose degrees whose product is " + std::to_string(p));
  m = message(GridShape{0, p + 1, 1});
  TELAR_REQUIRE_ALL(m.find("is not divisible by pp=" + std::to_string(p + 1)) != std::string::npos);
  m = message(GridShape{0, 1, 1, p + 1});
  TELAR_REQUIRE_ALL(m == "telar::ProcessGrid: world size " + std::to_string(p) +
                             " is not divisible by sp=" + std::to_string(p + 1) +
                             " x pp=1 x tp=1 (product " + std::to_string(p + 1) +
                             "), so dp cannot be deduced; choose sp, pp and tp whose product "
                             "divides " +
                             std::to_string(p));
  m = message(GridShape{1, 1, 1, 0});
  TELAR_REQUIRE_ALL(m.find("degrees must be positive") != std::string::npos);
  m = message(GridShape{1, 0, 1});
  TELAR_REQUIRE_ALL(m.find("degrees must be positive") != std::string::npos);
  m = message(GridShape{-1, 1, 1});
  TELAR_REQUIRE_ALL(m.find("degrees must be positive") != std::string::npos);
  bool threw = false;
  try {
    ProcessGrid::resolve(
        p, GridShape{0, 1, 1},
        {telar::GridAxis::dp, telar::GridAxis::dp, telar::GridAxis::sp, telar::GridAxis::tp});
  } catch (telar::GridError const& e) {
    threw = std::string(e.what()) ==
            "telar::ProcessGrid: the axis order must name dp, sp, pp and tp once each";
  }
  TELAR_REQUIRE_ALL(threw);
  // The message is identical on every rank: compare lengths and a hash.
  std::string const same = message(GridShape{p + 1, 2, 1});
  long h = static_cast<long>(std::hash<std::string>{}(same) % 1000003);
  long lo = h, hi = h;
  world.allreduce(&lo, 1, telar::ReduceOp::min);
  world.allreduce(&hi, 1, telar::ReduceOp::max);
  TELAR_REQUIRE_ALL(lo == hi);
  // Resolution itself needs no communicator.
  TELAR_REQUIRE_ALL(ProcessGrid::resolve(12, GridShape{0, 3, 2}).dp == 2);
  TELAR_REQUIRE_ALL(ProcessGrid::resolve(12, GridShape{0, 1, 2, 3}).dp == 2);
}

TEST_CASE("node-aware placement keeps tp groups and then pipelines on one node", "[comm][grid]") {
  using telar::GridAxis;
  telar::GridOrder const by_node = {GridAxis::dp, GridAxis::pp, GridAxis::sp, GridAxis::tp};
  telar::NodeLayout two_nodes;
  two_nodes.nodes = 2;
  two_nodes.ranks_per_node = 4;
  // Several nodes: dp outermost when pp and dp are both > 1; otherwise the
  // orders coincide and the default stays.
  CHECK(ProcessGrid::node_aware_order({2, 2, 2}, two_nodes) == by_node);
  CHECK(ProcessGrid::node_aware_order({4, 2, 1}, two_nodes) == by_node);
  CHECK(ProcessGrid::node_aware_order({4, 1, 2}, two_nodes) == telar::default_grid_order);
  CHECK(ProcessGrid::node_aware_order({1, 2, 4}, two_nodes) == telar::default_grid_order);
  CHECK(ProcessGrid::node_aware_order({2, 2, 2}, telar::NodeLayout{}) ==
        telar::default_grid_order); // one node: unchanged
  auto irregular = two_nodes;
  irregular.uniform = false;
  CHECK(ProcessGrid::node_aware_order({2, 2, 2}, irregular) == telar::default_grid_order);

  // Fake nodes of 2 consecutive ranks: every tp group (tp = 2), at pp = 2
  // every pipeline, at sp = 2 every sample's slabs, lies on one node; dp
  // groups cross nodes.
  int const p = telar_test::world_size();
  setenv("TELAR_RANKS_PER_NODE", "2", 1);
  Communicator world(MPI_COMM_WORLD, "world");
  int const me = world.rank();
  auto node_of = [](int r) { return r / 2; };
  for (GridShape shape : {GridShape{0, 1, 2}, GridShape{0, 2, 1}, GridShape{0, 1, 1, 2}}) {
    if (p % 2 != 0)
      break;
    ProcessGrid grid(world, shape);
    bool ok = true;
    auto const& inner = shape.tp == 2 ? grid.tp() : shape.pp == 2 ? grid.pp() : grid.sp();
    for (int r : members(inner, me))
      ok = ok && node_of(r) == node_of(me);
    if (p == 4)
      for (int r : members(grid.dp(), me))
        ok = ok && (r == me || node_of(r) != node_of(me));
    INFO(grid.name());
    TELAR_REQUIRE_ALL(ok);
  }
  unsetenv("TELAR_RANKS_PER_NODE");
}
