// What telar/core/shape.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/core/error.hpp>
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

TELAR_DECL void detail::check_layer_call(char const* layer, char const* what, bool built,
                                         std::size_t in, std::size_t out, std::size_t xn,
                                         std::size_t xf, std::size_t yn, std::size_t yf) {
  auto where = [&] { return std::string("telar::") + layer + "::" + what; };
  if (!built)
    throw Error(where() + ": call build(input shape) first (telar::Sequential does)");
  if (xn != yn || xf != in || yf != out)
    throw ShapeError(where() + ": expected [n, " + std::to_string(in) + "] -> [n, " +
                     std::to_string(out) + "], got [" + std::to_string(xn) + ", " +
                     std::to_string(xf) + "] -> [" + std::to_string(yn) + ", " +
                     std::to_string(yf) + "]");
}

} // namespace telar
