#pragma once
// Constant folding at import: shape arithmetic (fold.hpp evaluates it),
// float32 arithmetic on shape values and boolean masks of literals, each
// turned into a literal constant the nodes after it read: members of
// telar::onnx::detail::GraphReader (import_graph.hpp, which includes this
// file at its end).
#include <telar/onnx/detail/import_graph.hpp>

namespace telar::onnx::detail {

// Folds \p n when it is shape arithmetic: a Shape of a tensor, or a node
// whose inputs are all integer constants or folded. False otherwise.
template <class T, class M>
bool GraphReader<T, M>::fold(::onnx::NodeProto const& n) {
  if (n.op_type() == "Shape") {
    if (!shapes_.count(resolve(n.input(0))) || find_attr(n, "start") || find_attr(n, "end"))
      fail(n, "only a Shape (no start, end) of a tensor computed from the input folds");
    folded_[n.output(0)].v = logical_dims(layout_of(n.input(0)), shape_of(n.input(0)));
    return true;
  }
  if (n.op_type() == "Equal" ||
      (n.op_type() == "Cast" && int_attr(n, "to", 0) == ::onnx::TensorProto::BOOL))
    return fold_mask(n);
  if (fold_float(n))
    return true;
  std::vector<std::optional<Folded>> in;
  for (auto const& t : n.input()) {
    if (t.empty()) {
      in.emplace_back();
      continue;
    }
    auto const f = folded(t);
    if (!f)
      return false;
    in.push_back(*f);
  }
  if (in.empty() || n.op_type() == "Constant")
    return false;
  try {
    folded_[n.output(0)] = fold_node(n, in, int(opset_));
  } catch (std::string const& why) {
    fail(n, "shape arithmetic: " + why);
  }
  return true;
}

// Float32 arithmetic on shape values, evaluated at import: a Cast to
// float32 of a folded integer tensor (PyTorch 2's scaled_dot_product_attention
// computes its scale as sqrt(1 / sqrt(Cast(Shape(q)[-1])))), then Sqrt, Add,
// Sub, Mul, Div and Cast to float32 of such values and float32 literals. The
// result is a literal constant (a fixed Scale where a Mul reads it). False
// for other nodes.
template <class T, class M>
bool GraphReader<T, M>::fold_float(::onnx::NodeProto const& n) {
  std::string const& op = n.op_type();
  bool const to_float = op != "Cast" || int_attr(n, "to", 0) == ::onnx::TensorProto::FLOAT;
  if (!to_float || n.input_size() < 1)
    return false;
  std::vector<float> v;
  bool scalar = true;
  if (op == "Cast" && folded(n.input(0))) {
    Folded const f = *folded(n.input(0));
    for (Sym const e : f.v)
      if (e.pow != 0)
        return false; // depends on the batch: folded as integers only (as before)
    for (Sym const e : f.v)
      v.push_back(float(e.coef));
    scalar = f.scalar;
    folded_[n.output(0)] = f; // still readable as integers
  } else {
    static std::set<std::string> const ops{"Cast", "Sqrt", "Add", "Sub", "Mul", "Div"};
    if (!ops.count(op))
      return false;
    bool any = false;
    for (auto const& in : n.input()) {
      auto const* t = index_.constant(in);
      if (!t || t->data_type() != ::onnx::TensorProto::FLOAT || !index_.is_literal(in))
        return false;
      any = any || computed_.count(in) > 0;
    }
    if (!any || n.input_size() != (op == "Cast" || op == "Sqrt" ? 1 : 2))
      return false;
    auto const a = floats_of(*index_.constant(n.input(0)));
    auto const b = n.input_size() > 1 ? floats_of(*index_.constant(n.input(1))) : a;
    for (auto const* t :
         {index_.constant(n.input(0)), index_.constant(n.input(n.input_size() - 1))})
      scalar = scalar && t->dims_size() == 0;
    try {
      v = fold_float_arith(op, a, b);
    } catch (std::string const& why) {
      fail(n, "float32 shape arithmetic: " + why);
    }
  }
  ::onnx::TensorProto& t = computed_literal(n.output(0), ::onnx::TensorProto::FLOAT);
  if (!scalar)
    t.add_dims(std::int64_t(v.size()));
  for (float const x : v)
    t.add_float_data(x);
  return true;
}

// A folded value or an int64 constant.
template <class T, class M>
std::optional<Folded> GraphReader<T, M>::folded(std::string const& t) const {
  if (auto const f = folded_.find(t); f != folded_.end())
    return f->second;
  auto const* c = index_.constant(t);
  if (!c || c->data_type() != ::onnx::TensorProto::INT64)
    return std::nullopt;
  return folded_ints(ints_of(*c), c->dims_size() == 0);
}

template <class T, class M>
std::vector<Sym> GraphReader<T, M>::folded_input(::onnx::NodeProto const& n, int i,
                                                 char const* what) {
  auto const f = i < n.input_size() ? folded(n.input(i)) : std::nullopt;
  if (!f)
    fail(n, std::string("its ") + what + " (input " + std::to_string(i) +
                ") must be a constant, or computed from shapes and constants");
  return f->v;
}

template <class T, class M>
std::vector<std::int64_t> GraphReader<T, M>::constant_ints(::onnx::NodeProto const& n, int i,
                                                           char const* what) {
  try {
    return constants_of(Folded{false, folded_input(n, i, what)}, what);
  } catch (std::string const& why) {
    fail(n, why);
  }
}

// Equal of two constants, or a Cast to bool of one: a mask PyTorch
// computes in its forward (an Equal stays a node when exported without
// constant folding; a folded mask is a Cast of a literal), a boolean
// literal for the Where that reads it. Numbers compare as doubles; equal
// shapes or one side a single value.
template <class T, class M>
bool GraphReader<T, M>::fold_mask(::onnx::NodeProto const& n) {
  bool const cast = n.op_type() == "Cast";
  auto const* a = n.input_size() == (cast ? 1 : 2) ? index_.constant(n.input(0)) : nullptr;
  auto const* b = cast ? a : n.input_size() == 2 ? index_.constant(n.input(1)) : nullptr;
  if (!a || !b)
    return false;
  std::vector<double> va, vb;
  try {
    va = numbers_of(*a);
    vb = cast ? std::vector<double>{0.0} : numbers_of(*b);
  } catch (OnnxError const& e) {
    fail(n, e.what());
  }
  std::vector<bool> eq;
  try {
    eq = broadcast_values(va, vb, [&](double p, double q) { return cast ? p != q : p == q; });
  } catch (std::string const& why) {
    fail(n, why);
  }
  auto const& shape = va.size() >= vb.size() ? *a : *b; // cast: a
  ::onnx::TensorProto& t = computed_literal(n.output(0), ::onnx::TensorProto::BOOL);
  for (auto const dim : shape.dims())
    t.add_dims(dim);
  for (bool const e : eq)
    t.add_int32_data(e ? 1 : 0);
  return true;
}

// A constant computed at import (fold_float, fold_mask), registered as a
// literal so the nodes that read it see an initializer; the caller fills
// its dims and values.
template <class T, class M>
::onnx::TensorProto& GraphReader<T, M>::computed_literal(std::string const& name, int type) {
  ::onnx::TensorProto& t = computed_[name];
  t.set_name(name);
  t.set_data_type(type);
  index_.constants[name] = &t;
  index_.literals.insert(name);
  return t;
}

} // namespace telar::onnx::detail
