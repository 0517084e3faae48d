#pragma once
// Where the ranks of one communication group of a grid run, given how many
// ranks share a node: what the cost model (link classes) and the memory plan
// (ZeRO-1's windows per node) both need.
#include <telar/comm/process_grid.hpp>

#include <algorithm>
#include <cstddef>

namespace telar::detail {

// Where the ranks of one communication group run: `size` ranks, `local` of
// them on each node, `spans` when they are on more than one node.
struct CommGroup {
  int size = 1;
  int local = 1;
  bool spans = false;
  // Over several nodes that each hold the same number (> 1) of its ranks:
  // where ZeRO-1 keeps a window per node (zero_sharding.hpp).
  bool per_node() const { return spans && local > 1 && size % local == 0; }
};

// The group along `axis` of a grid laid out in `order` (outermost first;
// consecutive ranks share a node, `ranks_per_node` each; 0: one node):
// its members are `stride` ranks apart, stride the product of the inner
// axes' degrees.
inline CommGroup comm_group(GridShape g, GridOrder order, GridAxis axis, int ranks_per_node) {
  int stride = 1;
  for (auto a = order.rbegin(); a != order.rend() && *a != axis; ++a)
    stride *= g.along(*a);
  CommGroup c;
  c.size = g.along(axis);
  if (ranks_per_node <= 0 || c.size * stride <= ranks_per_node) {
    c.local = c.size;
    return c;
  }
  c.local = std::max(1, std::min(c.size, ranks_per_node / stride));
  c.spans = c.size > 1;
  return c;
}

// The Trainer's rank order for a grid over `world` ranks on nodes of
// `ranks_per_node` consecutive ones: `order` unless it is the default and
// the world spans whole nodes, then ProcessGrid::node_aware_order.
inline GridOrder planned_order(GridShape g, GridOrder order, int world, int ranks_per_node) {
  int const rpn = ranks_per_node;
  if (order != default_grid_order || rpn <= 0 || world <= rpn || world % rpn != 0)
    return order;
  return ProcessGrid::node_aware_order(g, NodeLayout{world / rpn, rpn, 0, true, true});
}

} // namespace telar::detail
