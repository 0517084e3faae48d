// What telar/comm/process_grid.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/comm/process_grid.hpp>

namespace telar {

TELAR_DECL ProcessGrid::ProcessGrid(Communicator const& world, GridShape shape, GridOrder order)
    : shape_(resolve(world.size(), shape, order)), order_(order) {
  world_ = world.dup(world.name());
  coord_ = coords_of(world_.rank());
  auto sub = [&](GridAxis axis, const char* name) {
    // Same coordinates on the two other axes -> same color.
    GridCoord c = coord_;
    int const key = get(c, axis);
    set(c, axis, 0);
    return world_.split(rank_of(c), key, name);
  };
  dp_ = sub(GridAxis::dp, "dp");
  pp_ = sub(GridAxis::pp, "pp");
  tp_ = sub(GridAxis::tp, "tp");
  // One model replica: pipeline stages and tensor shards, ranked as in world.
  mp_ = world_.split(coord_.dp, world_.rank(), "model_parallel");
}

TELAR_DECL Communicator const& ProcessGrid::group(GridGroup g) const noexcept {
  switch (g) {
  case GridGroup::dp:
    return dp_;
  case GridGroup::pp:
    return pp_;
  case GridGroup::tp:
    return tp_;
  case GridGroup::mp:
    return mp_;
  case GridGroup::world:
    break;
  }
  return world_;
}

TELAR_DECL int ProcessGrid::rank_of(GridCoord c) const noexcept {
  int r = 0;
  for (GridAxis a : order_)
    r = r * degree(a) + get(c, a);
  return r;
}

TELAR_DECL GridCoord ProcessGrid::coords_of(int world_rank) const noexcept {
  GridCoord c;
  for (int i = 2; i >= 0; --i) {
    GridAxis const a = order_[static_cast<std::size_t>(i)];
    set(c, a, world_rank % degree(a));
    world_rank /= degree(a);
  }
  return c;
}

TELAR_DECL GridOrder ProcessGrid::node_aware_order(GridShape shape,
                                                   NodeLayout const& nodes) noexcept {
  bool const spread = nodes.regular() && nodes.nodes > 1 && nodes.ranks_per_node > 1;
  if (!spread || shape.dp == 1 || shape.pp == 1)
    return default_grid_order; // the two orders place ranks identically
  return {GridAxis::dp, GridAxis::pp, GridAxis::tp};
}

} // namespace telar
