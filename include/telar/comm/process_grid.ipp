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
    // Same coordinates on the other axes -> same color.
    GridCoord c = coord_;
    int const key = c.along(axis);
    c.along(axis) = 0;
    return world_.split(rank_of(c), key, name);
  };
  dp_ = sub(GridAxis::dp, "dp");
  pp_ = sub(GridAxis::pp, "pp");
  tp_ = sub(GridAxis::tp, "tp");
  sp_ = sub(GridAxis::sp, "sp");
  // One model replica: pipeline stages, slabs and tensor shards, ranked as in world.
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
  case GridGroup::sp:
    return sp_;
  case GridGroup::world:
    break;
  }
  return world_;
}

TELAR_DECL GridOrder ProcessGrid::node_aware_order(GridShape shape,
                                                   NodeLayout const& nodes) noexcept {
  bool const spread = nodes.regular() && nodes.nodes > 1 && nodes.ranks_per_node > 1;
  if (!spread || shape.dp == 1 || shape.pp == 1)
    return default_grid_order; // the two orders place ranks identically
  return {GridAxis::dp, GridAxis::pp, GridAxis::sp, GridAxis::tp};
}

} // namespace telar
