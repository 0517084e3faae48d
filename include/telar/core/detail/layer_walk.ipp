// What telar/core/detail/layer_walk.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/core/detail/layer_walk.hpp>

namespace telar::detail {

TELAR_DECL std::vector<std::size_t> feature_sizes(std::vector<Shape> const& shapes) {
  std::vector<std::size_t> f;
  for (Shape const& s : shapes)
    f.push_back(s.size());
  return f;
}

} // namespace telar::detail
