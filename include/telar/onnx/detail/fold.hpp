#pragma once
// Constant folding of an imported graph's shape arithmetic: PyTorch writes
// Shape -> Gather -> Mul/Div -> Unsqueeze -> Concat -> Reshape for every
// view(). Each integer tensor is evaluated at import time from the
// initializers and the static per-sample shapes; the batch extent stays a
// symbol, so every value is a monomial coef * batch^pow (a Reshape to
// [seq, batch * heads, head] keeps knowing which extent is the batch).
#include <telar/onnx/detail/proto.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace telar::onnx::detail {

// coef * batch^pow.
struct Sym {
  std::int64_t coef = 1;
  int pow = 0;
  friend bool operator==(Sym a, Sym b) { return a.coef == b.coef && a.pow == b.pow; }
  friend bool operator!=(Sym a, Sym b) { return !(a == b); }
  friend Sym operator*(Sym a, Sym b) { return {a.coef * b.coef, a.pow + b.pow}; }
  std::string str() const {
    std::string const c = std::to_string(coef);
    return pow == 0
               ? c
               : (coef == 1 ? "" : c + "*") + (pow == 1 ? "batch" : "batch^" + std::to_string(pow));
  }
};
// a / b when it is a monomial (b divides a exactly, or floor division of
// two constants, as ONNX's integer Div), else nothing.
inline std::optional<Sym> divide(Sym a, Sym b, bool floor = false) {
  if (b.coef == 0 || a.pow < b.pow || (a.pow != b.pow && a.coef % b.coef != 0))
    return std::nullopt;
  if (a.coef % b.coef != 0 && !(floor && a.pow == 0))
    return std::nullopt;
  return Sym{a.coef / b.coef, a.pow - b.pow};
}

// A folded integer tensor: rank 0 (a scalar) or 1, as shape arithmetic is.
struct Folded {
  bool scalar = false;
  std::vector<Sym> v;
  std::string str() const {
    std::string s = scalar ? "" : "[";
    for (std::size_t i = 0; i < v.size(); ++i)
      s += (i ? ", " : "") + v[i].str();
    return s + (scalar ? "" : "]");
  }
};

inline Folded folded_ints(std::vector<std::int64_t> const& v, bool scalar) {
  Folded f;
  f.scalar = scalar;
  for (auto x : v)
    f.v.push_back({x, 0});
  return f;
}

// f(a[i], b[i]) for every i, numpy's broadcasting of an operand of one
// value included. Throws std::string (the caller names the node) when the
// operands do not broadcast.
template <class V, class F>
auto broadcast_values(std::vector<V> const& a, std::vector<V> const& b, F f) {
  if (a.size() != b.size() && a.size() != 1 && b.size() != 1)
    throw std::string("operands of " + std::to_string(a.size()) + " and " +
                      std::to_string(b.size()) + " values do not broadcast");
  std::vector<std::decay_t<decltype(f(a[0], b[0]))>> r;
  for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i)
    r.push_back(f(a[a.size() == 1 ? 0 : i], b[b.size() == 1 ? 0 : i]));
  return r;
}

// Element-wise arithmetic with numpy broadcasting of a one-value operand.
// Throws std::string (the caller names the node) when a result is not a
// monomial.
inline Folded fold_arith(std::string const& op, Folded const& a, Folded const& b) {
  Folded r;
  r.scalar = a.scalar && b.scalar;
  r.v = broadcast_values(a.v, b.v, [&](Sym const x, Sym const y) {
    std::optional<Sym> z;
    if (op == "Mul")
      z = x * y;
    else if (op == "Div")
      z = divide(x, y, true);
    else if (x.pow == y.pow || x.coef == 0 || y.coef == 0) // Add, Sub
      z = Sym{op == "Add" ? x.coef + y.coef : x.coef - y.coef, x.coef == 0 ? y.pow : x.pow};
    if (!z)
      throw std::string(x.str() + " " + op + " " + y.str() +
                        " is not a multiple of a power of the batch size");
    return *z;
  });
  return r;
}

// ONNX's integer Mod (fmod = 0): the sign of the divisor, as Python's %.
inline std::int64_t integer_mod(std::int64_t x, std::int64_t y) {
  if (y == 0)
    throw std::string("Mod by zero");
  std::int64_t const m = x % y;
  return m != 0 && (m < 0) != (y < 0) ? m + y : m;
}

// Float32 Sqrt, Cast (of a; b is a again), Add, Sub, Mul or Div of literal
// values, broadcast as above.
inline std::vector<float> fold_float_arith(std::string const& op, std::vector<float> const& a,
                                           std::vector<float> const& b) {
  return broadcast_values(a, b, [&](float const x, float const y) {
    return op == "Sqrt"  ? std::sqrt(x)
           : op == "Add" ? x + y
           : op == "Sub" ? x - y
           : op == "Mul" ? x * y
           : op == "Div" ? x / y
                         : x;
  });
}

// Index i of a tensor of n values, ONNX's negative indices allowed.
inline std::size_t fold_index(std::int64_t i, std::size_t n) {
  std::int64_t const r = std::int64_t(n);
  if (i < -r || i >= r)
    throw std::string("index " + std::to_string(i) + " is outside [" + std::to_string(-r) + ", " +
                      std::to_string(r) + ")");
  return std::size_t(i < 0 ? i + r : i);
}

inline std::vector<std::int64_t> constants_of(Folded const& f, char const* what) {
  std::vector<std::int64_t> v;
  for (Sym s : f.v) {
    if (s.pow != 0)
      throw std::string(std::string(what) + " " + f.str() + " depends on the batch size");
    v.push_back(s.coef);
  }
  return v;
}

// Gather, Unsqueeze, Squeeze, Concat, Cast, Identity, Add/Sub/Mul/Div, Mod,
// Reshape and Slice of folded operands (inputs in node order; an absent optional input
// is nullopt); throws std::string for what it cannot fold.
inline Folded fold_node(::onnx::NodeProto const& n, std::vector<std::optional<Folded>> const& in,
                        int opset) {
  std::string const& op = n.op_type();
  auto arg = [&](std::size_t i) -> Folded const& {
    if (i >= in.size() || !in[i])
      throw std::string("input " + std::to_string(i) + " is missing");
    return *in[i];
  };
  if (op == "Identity" || op == "Cast")
    return arg(0);
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div")
    return fold_arith(op, arg(0), arg(1));
  if (op == "Mod") { // PyTorch 2's unflatten: dim % rank of constants
    if (int_attr(n, "fmod", 0) != 0)
      throw std::string("only Mod with fmod = 0 (integers) folds");
    auto const a = constants_of(arg(0), "its dividend"), b = constants_of(arg(1), "its divisor");
    auto const r = broadcast_values(a, b, integer_mod);
    return folded_ints(r, arg(0).scalar && arg(1).scalar);
  }
  if (op == "Reshape") { // of shape values: a scalar to [1] or [-1], or a vector kept
    auto const t = constants_of(arg(1), "its shape");
    Folded r = arg(0);
    bool const one = t.size() == 1 && (t[0] == -1 || t[0] == std::int64_t(r.v.size()));
    if (!(one || (t.empty() && r.v.size() == 1)))
      throw std::string("only a Reshape of " + std::to_string(r.v.size()) +
                        " values to a vector of them (or of one value to a scalar) folds");
    r.scalar = t.empty();
    return r;
  }
  if (op == "Gather") {
    if (int_attr(n, "axis", 0) != 0 || arg(0).scalar)
      throw std::string("only a Gather along axis 0 of a vector folds");
    Folded r;
    r.scalar = arg(1).scalar;
    for (auto i : constants_of(arg(1), "its indices"))
      r.v.push_back(arg(0).v[fold_index(i, arg(0).v.size())]);
    return r;
  }
  if (op == "Unsqueeze" || op == "Squeeze") {
    auto const axes = opset >= 13 && in.size() > 1 && in[1] ? constants_of(*in[1], "its axes")
                                                            : ints_attr(n, "axes", {});
    Folded r = arg(0);
    bool const to_vector =
        op == "Unsqueeze" && r.scalar && axes.size() == 1 && (axes[0] == 0 || axes[0] == -1);
    bool const to_scalar = op == "Squeeze" && !r.scalar && r.v.size() == 1 &&
                           (axes.empty() || (axes.size() == 1 && (axes[0] == 0 || axes[0] == -1)));
    if (!to_vector && !to_scalar)
      throw std::string("only a scalar unsqueezed to one value (or back) folds");
    r.scalar = to_scalar;
    return r;
  }
  if (op == "Concat") {
    Folded r;
    for (std::size_t i = 0; i < in.size(); ++i)
      r.v.insert(r.v.end(), arg(i).v.begin(), arg(i).v.end());
    return r;
  }
  if (op == "Slice") {
    auto const v = arg(0).v;
    std::size_t const k = v.size();
    auto const b = constants_of(arg(1), "its starts"), e = constants_of(arg(2), "its ends");
    if (b.size() != 1 || (in.size() > 4 && in[4] &&
                          constants_of(*in[4], "its steps") != std::vector<std::int64_t>{1}))
      throw std::string("only a Slice of one axis with step 1 folds");
    auto clamp = [&](std::int64_t x) {
      std::int64_t const r = std::int64_t(k);
      return std::size_t(std::min(r, std::max<std::int64_t>(0, x < 0 ? x + r : x)));
    };
    Folded r;
    for (std::size_t i = clamp(b[0]); i < clamp(e[0]); ++i)
      r.v.push_back(v[i]);
    return r;
  }
  throw std::string("operator " + op +
                    " on constant integer tensors is not folded (supported: "
                    "Shape, Gather, Unsqueeze, Squeeze, Concat, Cast, Identity, Slice, Add, "
                    "Sub, Mul, Div, Mod, Reshape)");
}

} // namespace telar::onnx::detail
