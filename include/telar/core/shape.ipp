// What telar/core/shape.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/core/shape.hpp>

namespace telar {

TELAR_DECL std::string Shape::str() const {
  if (!known())
    return "[?]";
  std::string s = "[";
  for (int i = 0; i < rank; ++i)
    s += (i ? ", " : "") + std::to_string(dims[std::size_t(i)]);
  return s + "]";
}

} // namespace telar
