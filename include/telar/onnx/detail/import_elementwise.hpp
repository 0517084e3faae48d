#pragma once
// Element-wise nodes and activations: joins (Add, Mul, Sub, Div, Concat),
// Bias, Softmax, Clip, Dropout, Scale, Multiplier, Where (masked_fill) and
// the SiLU and GELU patterns: members of telar::onnx::detail::GraphReader
// (import_graph.hpp, which includes this file at its end).
#include <telar/onnx/detail/import_graph.hpp>

namespace telar::onnx::detail {

// Add, Mul, Sub, Div of two tensors and Concat along the channels: joins of
// the graph. A constant operand: Scale or Multiplier (Mul, Div), a
// positional table or Bias (Add, Sub).
template <class T, class M>
void GraphReader<T, M>::join(::onnx::NodeProto const& n) {
  std::string const& op = n.op_type();
  if (scale(n))
    return;
  if (op == "Add" && positional(n))
    return;
  if (bias(n))
    return;
  for (auto const& in : n.input())
    if (index_.is_constant(in))
      fail(n, op + " of the constant '" + in +
                  "' and a tensor is not supported (Mul, Div by a float32 constant: a Scale or "
                  "a Multiplier; Add, Sub: a float32 constant broadcast over each sample, a "
                  "Bias; a constant divided by a tensor: no layer); " +
                  op + " is supported between tensors (a join)");
  if (op == "Concat" && n.input_size() == 1) {    // DenseNet's first layer: torch.cat([x])
    axis_of(n, 1, shape_of(n.input(0)).rank + 1); // still a valid axis
    return alias(n, n.input(0));
  }
  if (n.input_size() < 2)
    fail(n, op + " needs two inputs or more");
  // An Add of two shapes broadcasts as Mul does, on plain layouts; of equal
  // shapes it keeps the inputs' common layout (a moved batch included).
  bool const same =
      op == "Add" && (n.input_size() != 2 || shape_of(n.input(0)) == shape_of(n.input(1)));
  Layout const l = same ? same_layouts(n) : Layout{};
  if (!same)
    for (auto const& t : n.input())
      plain(n, t);
  std::vector<Shape> in;
  for (auto const& t : n.input())
    in.push_back(shape_of(t));
  Shape out = in[0];
  Ir node;
  if (op == "Add") {
    if (same && l != plain_layout(out.rank))
      layouts_[n.output(0)] = l;
    node.kind = Ir::add;
    for (auto const& s : in)
      if (same && s != in[0])
        fail(n, "adds " + in[0].str() + " and " + s.str() +
                    "; three tensors or more are added only of equal shapes");
    if (!same)
      out = elementwise_shape(n, in);
  } else if (op == "Concat") {
    node.kind = Ir::concat;
    if (axis_of(n, 1, in[0].rank + 1) != 1)
      fail(n, "axis " + std::to_string(int_attr(n, "axis", 1)) +
                  " is not supported: Concat joins along the channels (axis 1)");
    out.dims[0] = 0;
    for (auto const& s : in) {
      Shape a = s, b = in[0];
      a.dims[0] = b.dims[0] = 0;
      if (a != b)
        fail(n, "concatenates " + in[0].str() + " and " + s.str() +
                    "; the shapes must be equal but for the channels");
      out.dims[0] += s[0];
    }
  } else {
    node.kind = op == "Mul" ? Ir::mul : op == "Sub" ? Ir::sub : Ir::div;
    out = elementwise_shape(n, in);
  }
  for (auto const& t : n.input())
    node.inputs.push_back(resolve(t));
  shapes_[n.output(0)] = out;
  push(n, std::move(node), n.output(0));
}

// The result of Add, Mul, Sub or Div of two tensors (DynamicGraph's
// element-wise joins): equal shapes, or one side one value per channel ([C, 1, ...]
// against [C, ...]) or per sample ([1, ..., 1]), as ONNX broadcasts them.
template <class T, class M>
Shape GraphReader<T, M>::elementwise_shape(::onnx::NodeProto const& n,
                                           std::vector<Shape> const& in) const {
  auto const spread = [](Shape const& a, Shape const& b) { // a [C or 1, 1, ...] against b
    if (a.rank != b.rank || (a[0] != b[0] && a[0] != 1))
      return false;
    for (int d = 1; d < a.rank; ++d)
      if (a[std::size_t(d)] != 1)
        return false;
    return true;
  };
  if (n.input_size() != 2 || (in[1] != in[0] && !spread(in[1], in[0]) && !spread(in[0], in[1])))
    fail(n, n.op_type() + " of " + in[0].str() + " and " + in[1].str() +
                (n.input_size() != 2 ? " and more" : "") +
                " per sample is not supported; only two tensors of equal shapes, or one value per "
                "channel ([C, 1, 1] against [C, H, W]) or per sample ([1, 1, 1]) on either side");
  return spread(in[0], in[1]) ? in[1] : in[0];
}

// Over the last axis as the last node: the loss's softmax (the model
// gives logits, Imported::output_activation says which). Anywhere else, a
// telar::Softmax layer over one axis of the sample.
template <class T, class M>
void GraphReader<T, M>::softmax(::onnx::NodeProto const& n) {
  std::string const& op = n.op_type();
  // Before opset 13 the default axis is 1 and the input is flattened from it.
  std::int64_t const def = opset_ < 13 ? 1 : -1;
  if (layout_of(n.input(0)) != plain_layout(shape_of(n.input(0)).rank))
    return moved_softmax(n, def);
  Shape const& s = shape_of(n.input(0));
  std::size_t const rank = s.rank + 1;
  std::int64_t const a = axis_of(n, def, rank);
  std::string const given = "axis " + std::to_string(int_attr(n, "axis", def));
  bool trailing = true; // no axis of extent > 1 after a (then opsets < 13 agree)
  for (std::size_t d = std::size_t(std::max<std::int64_t>(a, 1)); d < s.rank; ++d)
    trailing = trailing && s[d] == 1;
  if (n.output(0) == plan_.output_name &&
      (a == std::int64_t(rank) - 1 || (opset_ < 13 && a > 0 && trailing))) {
    plan_.output_activation = op;
    return alias(n, n.input(0));
  }
  if (op == "LogSoftmax")
    fail(n, "LogSoftmax is supported only as the graph's last node over the last axis (the "
            "loss's input); " +
                given + " of rank " + std::to_string(rank));
  if (a == 0)
    fail(n, given + " (the batch) is not supported: Telar's Softmax acts within each sample");
  if (opset_ < 13 && !trailing)
    fail(n, given + " with opset " + std::to_string(opset_) +
                " spans every axis from it on (the input flattened); supported only when the "
                "axes after it have extent 1 (export with opset 13+ for a one-axis softmax)");
  emit(n, Softmax<T, M>(int(a - 1)), n.input(0));
}

// Clip with constant bounds (inputs 1 and 2 from opset 11, attributes
// before): telar::ReLU6 for [0, 6] (PyTorch's nn.ReLU6), telar::Clip otherwise.
template <class T, class M>
void GraphReader<T, M>::clip(::onnx::NodeProto const& n) {
  float lo = -std::numeric_limits<float>::infinity(), hi = -lo;
  if (opset_ < 11) {
    lo = float_attr(n, "min", std::numeric_limits<float>::lowest());
    hi = float_attr(n, "max", std::numeric_limits<float>::max());
  } else {
    auto bound = [&](int i, float def) {
      if (n.input_size() <= i || n.input(i).empty())
        return def;
      float const v = index_.scalar(n.input(i));
      if (std::isnan(v))
        fail(n, std::string("its ") + (i == 1 ? "min" : "max") + " (input " + std::to_string(i) +
                    ", '" + n.input(i) + "') must be a float32 constant with one value");
      return v;
    };
    lo = bound(1, lo);
    hi = bound(2, hi);
  }
  if (!(lo <= hi))
    fail(n, "min " + std::to_string(lo) + " > max " + std::to_string(hi) +
                " is not supported (ONNX gives max everywhere)");
  if (lo == 0.f && hi == 6.f)
    return emit(n, ReLU6<T, M>{}, n.input(0));
  emit(n, Clip<T, M>(T(lo), T(hi)), n.input(0));
}

// Opset 12+: ratio and training_mode are inputs 1 and 2 (constants);
// earlier: a ratio attribute, and the node is inactive in inference. An
// active dropout trains as telar::Dropout; an inactive one is the identity.
template <class T, class M>
void GraphReader<T, M>::dropout(::onnx::NodeProto const& n) {
  bool active = false;
  float ratio = float_attr(n, "ratio", 0.5f);
  if (opset_ >= 12) {
    ratio = n.input_size() > 1 && !n.input(1).empty() ? index_.scalar(n.input(1)) : 0.5f;
    if (n.input_size() > 2 && !n.input(2).empty()) {
      auto const* t = index_.constant(n.input(2));
      if (!t || t->data_type() != ::onnx::TensorProto::BOOL)
        fail(n, "its training_mode '" + n.input(2) + "' must be a boolean constant");
      active = bools_of(*t) == std::vector<bool>{true};
    }
  }
  if (!active)
    return alias(n, n.input(0));
  if (!(ratio >= 0.f && ratio < 1.f))
    fail(n, "its ratio must be a constant in [0, 1)");
  emit(n, Dropout<T, M>(double(ratio)), n.input(0));
}

// Where(condition, a, b) with a constant boolean condition, one branch a
// constant scalar and the other a tensor: masked_fill by a constant mask
// (a causal mask), telar::MaskedFill. The mask covers the sample's last
// axes and repeats over the others.
template <class T, class M>
void GraphReader<T, M>::where(::onnx::NodeProto const& n) {
  auto const* c = n.input_size() == 3 ? index_.constant(n.input(0)) : nullptr;
  int const t = n.input_size() == 3 && index_.is_constant(n.input(1)) ? 2 : 1;
  float const v = n.input_size() == 3 ? index_.scalar(n.input(3 - t)) : 0.f;
  if (!c || c->data_type() != ::onnx::TensorProto::BOOL || index_.is_constant(n.input(t)) ||
      std::isnan(v))
    fail(n, "only a Where with a constant boolean condition, a constant float32 scalar and a "
            "tensor (masked_fill by a constant mask) is supported");
  std::string const x = n.input(t);
  plain(n, x);
  Shape const& s = shape_of(x);
  std::vector<std::int64_t> d(c->dims().begin(), c->dims().end());
  while (!d.empty() && d.front() == 1)
    d.erase(d.begin());
  bool fits = int(d.size()) <= s.rank;
  for (std::size_t k = 0; fits && k < d.size(); ++k)
    fits = std::size_t(d[k]) == s[std::size_t(s.rank) - d.size() + k];
  if (!fits) {
    fail(n, "its condition '" + n.input(0) + "' " + dims_str(*c) +
                " does not match the last axes of the tensor '" + x + "' " + s.str() +
                " per sample (a mask over the batch is not supported)");
  }
  std::vector<bool> mask = bools_of(*c);
  if (t == 1) // the tensor where the condition holds: fill where it does not
    mask.flip();
  emit(n, MaskedFill<T, M>(s, mask, T(v)), x);
}

// Exp, Sqrt, Erf of a tensor and Pow of a tensor by a constant scalar:
// telar::MathFunction (outside the GELU and LayerNorm patterns, which
// import as those layers).
template <class T, class M>
void GraphReader<T, M>::math_function(::onnx::NodeProto const& n) {
  std::string const& op = n.op_type();
  if (index_.is_constant(n.input(0)))
    fail(n, op + " of the constant '" + n.input(0) +
                "' is not supported (computed constants fold only from shapes and float32 "
                "literals)");
  if (op != "Pow")
    return emit(n,
                MathFunction<T, M>(op == "Exp"    ? MathFn::exp
                                   : op == "Sqrt" ? MathFn::sqrt
                                                  : MathFn::erf),
                n.input(0));
  auto const* c = n.input_size() == 2 ? index_.constant(n.input(1)) : nullptr;
  std::vector<double> p;
  if (c) {
    try {
      p = numbers_of(*c);
    } catch (OnnxError const& e) {
      fail(n, e.what());
    }
  }
  if (p.size() != 1)
    fail(n, "its exponent '" + (n.input_size() == 2 ? n.input(1) : std::string()) +
                "' must be a constant with one value (x^p); a tensor exponent, or one per "
                "position, is not supported");
  emit(n, MathFunction<T, M>(MathFn::pow, T(p[0])), n.input(0));
}

// Mul or Div of a tensor by a float32 constant: telar::Scale for one
// literal value (a fixed factor, as attention's 1 / sqrt(d)), else a
// telar::Multiplier broadcast over each sample, trained for an initializer
// (PyTorch's `x * self.gamma`, one value or a table), fixed for a literal
// table (`x * torch.tensor([...])`).
template <class T, class M>
bool GraphReader<T, M>::scale(::onnx::NodeProto const& n) {
  std::string const& op = n.op_type();
  if ((op != "Mul" && op != "Div") || n.input_size() != 2)
    return false;
  int const c = index_.is_constant(n.input(1)) ? 1 : op == "Mul" ? 0 : -1;
  if (c < 0 || !index_.is_constant(n.input(c)) || index_.is_constant(n.input(1 - c)))
    return false;
  auto const* t = index_.constant(n.input(c));
  bool const literal = index_.is_literal(n.input(c));
  if (t && t->data_type() == ::onnx::TensorProto::FLOAT && (floats_of(*t).size() > 1 || !literal))
    return multiplier(n, c, !literal);
  float const v = index_.scalar(n.input(c));
  if (std::isnan(v) || (op == "Div" && v == 0.f))
    fail(n, op + " by the constant '" + n.input(c) +
                "' is supported only for float32 values, nonzero for a Div (a literal value: "
                "a Scale; else a Multiplier broadcast over each sample)");
  emit(n, Scale<T, M>(op == "Div" ? T(1) / T(v) : T(v)), n.input(1 - c));
  return true;
}

// Mul or Div of a tensor by the float32 constant input \p c, a table
// broadcast over each sample (as bias_table reads it): a telar::Multiplier,
// \p trained or fixed; a divisor is kept as such, so the export writes it
// back as the Div's constant.
template <class T, class M>
bool GraphReader<T, M>::multiplier(::onnx::NodeProto const& n, int c, bool trained) {
  bool const divide = n.op_type() == "Div";
  table_layer(n, c, "weight", trained, [&](Shape const& s, Shape const& table) {
    if (divide)
      for (float const v : floats_of(*index_.constant(n.input(c))))
        if (v == 0.f)
          fail(n, "the constant divisor '" + n.input(c) + "' holds a zero");
    return Multiplier<T, M>(s, table, divide, trained);
  });
  return true;
}

// Add or Sub of a tensor and a float32 constant broadcast over each sample
// (ONNX's rule: the constant's axes right-aligned, each equal or 1; a
// leading batch axis of 1): a telar::Bias, trained for an initializer, as
// PyTorch trains the nn.Parameter it usually comes from, fixed for a
// literal (`x + 1.0`). False for other nodes.
template <class T, class M>
bool GraphReader<T, M>::bias(::onnx::NodeProto const& n) {
  std::string const& op = n.op_type();
  if ((op != "Add" && op != "Sub") || n.input_size() != 2 ||
      index_.is_constant(n.input(0)) == index_.is_constant(n.input(1)))
    return false;
  int const c = index_.is_constant(n.input(1)) ? 1 : 0;
  T const sign = op == "Sub" ? T(-1) : T(1); // x - c, or c - x
  bool const trained = !index_.is_literal(n.input(c));
  table_layer(n, c, "bias", trained, [&](Shape const& s, Shape const& table) {
    return Bias<T, M>(s, table, c == 1 ? sign : T(1), c == 0 ? sign : T(1), trained);
  });
  return true;
}

// Emits make(sample, table), the layer of node \p n whose constant input
// \p c is a table broadcast over each sample of its other input (Bias,
// Multiplier), the constant bound as its parameter \p param (\p trained)
// or buffer; a table that does not broadcast is refused naming both shapes.
template <class T, class M>
template <class Make>
void GraphReader<T, M>::table_layer(::onnx::NodeProto const& n, int c, char const* param,
                                    bool trained, Make const& make) {
  std::string const x = n.input(1 - c);
  plain(n, x);
  Shape const& s = shape_of(x);
  Shape const table = bias_table(n, c, s);
  try {
    auto layer = make(s, table);
    bind(n, c, "constant", param, false, table.size(), 1, !trained);
    emit(n, std::move(layer), x);
  } catch (ShapeError const& e) {
    fail(n, "the constant '" + n.input(c) + "' " + dims_str(*index_.constant(n.input(c))) +
                " does not broadcast over the tensor '" + x + "' " + s.str() +
                " per sample: " + e.what());
  }
}

// The per-sample table of the float32 constant input \p c against samples
// \p s: its dimensions less the leading 1s beyond the sample's rank (the
// batch's and ONNX's implicit ones); refused when it spans the batch.
template <class T, class M>
Shape GraphReader<T, M>::bias_table(::onnx::NodeProto const& n, int c, Shape const& s) {
  auto const& t = initializer(n, c, "constant");
  std::vector<std::int64_t> d(t.dims().begin(), t.dims().end());
  while (int(d.size()) > s.rank && d.front() == 1)
    d.erase(d.begin());
  if (int(d.size()) > s.rank)
    fail(n, "the constant '" + n.input(c) + "' " + dims_str(t) +
                " spans the batch of the tensor '" + n.input(1 - c) + "' " + s.str() +
                " per sample; only a constant broadcast over each sample (its axes right-aligned "
                "with the sample's, each equal or 1) is supported");
  Shape table{1}; // a scalar: one value
  for (std::size_t k = 0; k < d.size(); ++k)
    table.dims[k] = std::size_t(d[k]);
  table.rank = d.empty() ? 1 : int(d.size());
  return table;
}

// SiLU as PyTorch 1.13 exports nn.SiLU: Sigmoid(x) read only by a Mul by x.
template <class T, class M>
void GraphReader<T, M>::silu_pattern(::onnx::NodeProto const& n) {
  if (n.op_type() != "Sigmoid" || n.input_size() != 1)
    return;
  auto const& rs = index_.readers(n.output(0));
  if (rs.size() != 1 || rs[0]->op_type() != "Mul" || rs[0]->input_size() != 2)
    return;
  auto const& m = *rs[0];
  std::string const other = m.input(0) == n.output(0) ? m.input(1) : m.input(0);
  if (other != n.input(0) || n.output(0) == plan_.output_name)
    return;
  skip_.insert(&n);
  silu_[&m] = n.input(0);
}

// PyTorch's exact GELU: 0.5 * (x * (1 + erf(x / sqrt 2))); the five nodes
// are skipped but the last, which becomes a GELU of x.
template <class T, class M>
void GraphReader<T, M>::gelu_pattern(std::string const& x,
                                     std::vector<::onnx::NodeProto const*> const& rs) {
  auto const* div = rs[0]->op_type() == "Div" ? rs[0] : rs[1];
  auto const* mul = div == rs[0] ? rs[1] : rs[0];
  auto single = [&](std::string const& t, char const* op) -> ::onnx::NodeProto const* {
    auto const& r = index_.readers(t);
    return r.size() == 1 && r[0]->op_type() == op ? r[0] : nullptr;
  };
  auto other = [](::onnx::NodeProto const& n, std::string const& t) {
    return n.input(0) == t ? n.input(1) : n.input(0);
  };
  if (div->op_type() != "Div" || mul->op_type() != "Mul" || div->input(0) != x ||
      std::abs(index_.scalar(div->input(1)) - 1.41421356f) > 1e-4f)
    return;
  auto const* erf = single(div->output(0), "Erf");
  auto const* one = erf ? single(erf->output(0), "Add") : nullptr;
  if (!one || index_.scalar(other(*one, erf->output(0))) != 1.f)
    return;
  if (index_.readers(one->output(0)).size() != 1 || index_.readers(one->output(0))[0] != mul ||
      other(*mul, one->output(0)) != x)
    return;
  auto const* half = single(mul->output(0), "Mul");
  if (!half || index_.scalar(other(*half, mul->output(0))) != 0.5f)
    return;
  for (auto const* n : {div, erf, one, mul})
    skip_.insert(n);
  gelu_[half] = x;
}

} // namespace telar::onnx::detail
