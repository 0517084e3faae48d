#pragma once
// Dense and attention: Gemm, MatMul (by a weight or batched), embeddings,
// the moved-batch Softmax, ReduceMean and the LayerNormalization pattern: members of
// telar::onnx::detail::GraphReader (import_graph.hpp, which includes this
// file at its end).
#include <telar/onnx/detail/import_graph.hpp>

namespace telar::onnx::detail {

template <class T, class M>
void GraphReader<T, M>::gemm(::onnx::NodeProto const& n) {
  last_axis_in_place(n, n.input(0));
  if (layout_of(n.input(0)).groups.size() != 2)
    fail(n, "needs a matrix input (ONNX Gemm's A is 2-D), got the logical shape " +
                dims_str(logical_dims(layout_of(n.input(0)), shape_of(n.input(0)))));
  for (char const* a : {"alpha", "beta"})
    if (float_attr(n, a, 1.f) != 1.f)
      fail(n, std::string("attribute ") + a + " = " + std::to_string(float_attr(n, a, 1.f)) +
                  " is not supported (only 1, as PyTorch's nn.Linear exports)");
  if (int_attr(n, "transA", 0) != 0)
    fail(n, "attribute transA = 1 is not supported (the input must be [batch, features])");
  bool const tb = int_attr(n, "transB", 0) != 0;
  auto const& w = initializer(n, 1, "weight");
  if (w.dims_size() != 2)
    fail(n, "its weight must be a matrix");
  std::size_t const out = std::size_t(tb ? w.dims(0) : w.dims(1));
  std::size_t const in = std::size_t(tb ? w.dims(1) : w.dims(0));
  if (in != shape_of(n.input(0)).back())
    fail(n, "weight '" + w.name() + "' takes " + std::to_string(in) + " features, the input has " +
                std::to_string(shape_of(n.input(0)).back()));
  bool const bias = n.input_size() > 2 && !n.input(2).empty();
  bind(n, 1, "weight", "weight", !tb, out, in);
  if (bias)
    bind(n, 2, "bias", "bias", false, out, 1);
  emit(n, Dense<T, M>(in, out, bias), n.input(0));
}

// MatMul by a constant [in, out], with the Add of a constant [out] after it.
template <class T, class M>
void GraphReader<T, M>::matmul(::onnx::NodeProto const& n) {
  if (n.input_size() == 2 && !index_.is_constant(n.input(1)))
    return batched_matmul(n);
  last_axis_in_place(n, n.input(0));
  auto const& w = initializer(n, 1, "weight");
  if (w.dims_size() != 2)
    fail(n, "its second input must be a constant matrix [in, out]");
  std::size_t const in = std::size_t(w.dims(0)), out = std::size_t(w.dims(1));
  Shape const& s = shape_of(n.input(0));
  if (s.back() != in)
    fail(n, "weight '" + w.name() + "' takes " + std::to_string(in) + " features, the input " +
                s.str() + " has " + std::to_string(s.back()));
  bind(n, 1, "weight", "weight", true, out, in);
  std::string result = n.output(0);
  auto const& rs = index_.readers(result);
  bool bias = false;
  if (rs.size() == 1 && rs[0]->op_type() == "Add") {
    auto const& a = *rs[0];
    int const other = a.input(0) == result ? 1 : 0;
    auto const* b = index_.constant(a.input(other));
    if (b && b->data_type() == ::onnx::TensorProto::FLOAT && b->dims_size() == 1 &&
        std::size_t(b->dims(0)) == out) {
      bind(a, other, "bias", "bias", false, out, 1);
      skip_.insert(&a);
      bias = true;
      result = a.output(0);
    }
  }
  emit(n, Dense<T, M>(in, out, bias), n.input(0), result);
}

// Softmax over a logical axis of a tensor whose batch moved: over the
// stored axis it is (never the loss's softmax: the output is [batch, ...]).
template <class T, class M>
void GraphReader<T, M>::moved_softmax(::onnx::NodeProto const& n, std::int64_t def) {
  std::string const x = n.input(0);
  if (n.op_type() == "LogSoftmax" || opset_ < 13)
    fail(n, n.op_type() + " of the logical shape " + logical_str(x) +
                " (the batch moved) is supported only as Softmax from opset 13");
  std::size_t const a = logical_axis(n, x, int_attr(n, "axis", def));
  int const d = stored_axis(n, x, a);
  if (d < 0)
    fail(n, "axis " + std::to_string(a) + " of the logical shape " + logical_str(x) +
                " holds the batch: Telar's Softmax acts within each sample");
  emit(n, Softmax<T, M>(d), x);
}

// Q K^T and weights x V: [P..., M, K] x [P..., K, N] with the same
// leading (batch and head) axes, both stored in logical order.
template <class T, class M>
void GraphReader<T, M>::batched_matmul(::onnx::NodeProto const& n) {
  std::string const a = n.input(0), b = n.input(1);
  arrange(n, a);
  arrange(n, b);
  Layout const la = layout_of(a), lb = layout_of(b);
  std::size_t const r = la.groups.size();
  bool ok = r >= 2 && lb.groups.size() == r;
  for (std::size_t g = 0; ok && g < r; ++g)
    ok = g + 2 < r ? la.groups[g].size() == lb.groups[g].size()
                   : single_atom(la, g) >= 0 && single_atom(lb, g) >= 0;
  for (std::size_t g = 0; ok && g + 2 < r; ++g)
    for (std::size_t k = 0; k < la.groups[g].size(); ++k)
      ok = ok && (la.groups[g][k] == batch_atom) == (lb.groups[g][k] == batch_atom);
  Shape const out = ok ? telar::detail::graph_matmul_shape(shape_of(a), shape_of(b)) : Shape();
  if (!out.known())
    fail(n, "multiplies the logical shapes " + logical_str(a) + " and " + logical_str(b) +
                "; supported: [..., M, K] x [..., K, N] with equal leading axes (no "
                "broadcasting), the batch among them in the same place");
  Layout lo = la;
  lo.groups[r - 1] = {out.rank - 1};
  Ir node;
  node.kind = Ir::matmul;
  node.inputs = {resolve(a), resolve(b)};
  shapes_[n.output(0)] = out;
  if (lo != plain_layout(out.rank))
    layouts_[n.output(0)] = lo;
  push(n, std::move(node), n.output(0));
}

// Add of two tensors with the same logical axes, stored alike.
template <class T, class M>
Layout GraphReader<T, M>::same_layouts(::onnx::NodeProto const& n) {
  for (auto const& t : n.input())
    arrange(n, t);
  Layout const l = layout_of(n.input(0));
  for (auto const& t : n.input())
    if (layout_of(t) != l)
      fail(n, "adds the logical shapes " + logical_str(n.input(0)) + " and " + logical_str(t) +
                  ", stored differently (the batch at another axis)");
  return l;
}

// Rows of a constant [vocab, hidden] table picked by the graph's integer
// input [batch, seq]: a token embedding (telar::Embedding, trainable).
template <class T, class M>
void GraphReader<T, M>::gather(::onnx::NodeProto const& n) {
  auto const* w = index_.constant(n.input(0));
  if (!w && shapes_.count(resolve(n.input(0))))
    return gather_axis(n);
  if (!w || !ids_input_ || resolve(n.input(1)) != plan_.input_name || int_attr(n, "axis", 0) != 0)
    fail(n, "only a Gather of rows (axis 0) of a constant table by the graph's integer input "
            "(a token embedding), or one that folds as shape arithmetic, is supported");
  Shape const& s = shape_of(n.input(1));
  if (w->dims_size() != 2 || s.rank != 1)
    fail(n, "needs a table [vocab, hidden] and token ids [batch, seq]; got a table of rank " +
                std::to_string(w->dims_size()) + " and ids " + s.str() + " per sample");
  std::size_t const vocab = std::size_t(w->dims(0)), hidden = std::size_t(w->dims(1));
  bind(n, 0, "table", "weight", false, vocab, hidden);
  emit(n, Embedding<T, M>(vocab, hidden), n.input(1));
}

// Add of a tensor [seq, hidden] per sample and a constant of that shape
// (a leading 1 allowed): a learned positional embedding (trainable, as
// PyTorch's nn.Parameter it comes from). False for other Adds.
template <class T, class M>
bool GraphReader<T, M>::positional(::onnx::NodeProto const& n) {
  if (n.input_size() != 2 || index_.is_constant(n.input(0)) == index_.is_constant(n.input(1)))
    return false;
  int const c = index_.is_constant(n.input(1)) ? 1 : 0;
  auto const* p = index_.constant(n.input(c));
  std::string const x = n.input(1 - c);
  Shape const& s = shape_of(x);
  std::vector<std::int64_t> d(p->dims().begin(), p->dims().end());
  if (d.size() == 3 && d[0] == 1)
    d.erase(d.begin());
  if (p->data_type() != ::onnx::TensorProto::FLOAT || s.rank != 2 ||
      layout_of(x) != plain_layout(2) ||
      d != std::vector<std::int64_t>{std::int64_t(s[0]), std::int64_t(s[1])})
    return false;
  bind(n, c, "positional table", "weight", false, s[0], s[1]);
  emit(n, PositionalEmbedding<T, M>(s[0], s[1]), x);
  return true;
}

// ReduceMean over axes that are not the batch: the kept axes to the
// front, then GlobalAvgPool over [kept, reduced] (Rearranges as needed).
template <class T, class M>
void GraphReader<T, M>::reduce_mean(::onnx::NodeProto const& n) {
  std::string const x = n.input(0);
  auto axes = ints_attr(n, "axes", {});
  if (opset_ >= 18 && n.input_size() > 1 && !n.input(1).empty())
    axes = constant_ints(n, 1, "axes");
  bool const keep = int_attr(n, "keepdims", 1) != 0;
  arrange(n, x);
  Layout const l = layout_of(x);
  if (axes.empty())
    fail(n, "a ReduceMean over every axis (the batch included) is not supported");
  std::set<std::size_t> reduced;
  for (auto a : axes)
    reduced.insert(logical_axis(n, x, a));
  std::vector<int> kept_atoms; // stored axes kept, in logical order
  std::size_t kept = 1, over = 1;
  Layout out;
  for (std::size_t g = 0; g < l.groups.size(); ++g) {
    if (reduced.count(g) && single_atom(l, g) < 0)
      fail(n, "reduces axis " + std::to_string(g) + " of the logical shape " + logical_str(x) +
                  ", which holds the batch");
    if (reduced.count(g) && !keep)
      continue;
    out.groups.emplace_back(); // a kept reduced axis: extent 1, no atom
    for (int a = 0; !reduced.count(g) && a < int(l.groups[g].size()); ++a) {
      int const atom = l.groups[g][std::size_t(a)];
      out.groups.back().push_back(atom == batch_atom ? atom : int(kept_atoms.size()));
      if (atom != batch_atom)
        kept_atoms.push_back(atom), kept *= shape_of(x)[atom];
    }
  }
  std::vector<int> perm = kept_atoms;
  for (std::size_t g : reduced)
    perm.push_back(single_atom(l, g)), over *= shape_of(x)[single_atom(l, g)];
  std::string t = resolve(x);
  Layout const any = plain_layout(shape_of(x).rank); // inner tensors: never read as ONNX's
  if (!identity_perm(perm))
    t = emit_moved(n, Rearrange<T, M>::transpose(shape_of(x), perm), t, any, "T");
  if (shape_of(t) != Shape{kept, over})
    t = emit_moved(n, Rearrange<T, M>::reshape(shape_of(t), Shape{kept, over}), t, plain_layout(2),
                   "R");
  std::string const pooled = n.output(0) + (kept_atoms.size() == 1 ? "" : "#P");
  emit(n, GlobalAvgPool<T, M>{}, t, pooled);
  layouts_.erase(pooled);
  Shape ks;
  ks.rank = int(kept_atoms.size());
  for (std::size_t d = 0; d < kept_atoms.size(); ++d)
    ks.dims[d] = shape_of(x)[kept_atoms[d]];
  if (kept_atoms.size() != 1) {
    if (!ks.known())
      fail(n, "keeps no axis but the batch; Telar's samples need at least one");
    emit(n, Rearrange<T, M>::reshape(Shape(kept), ks), pooled);
  }
  if (out != plain_layout(ks.rank))
    layouts_[n.output(0)] = out;
}

// LayerNormalization as opset 13 exports it: x - ReduceMean(x) = d;
// d / Sqrt(ReduceMean(d ^ 2) + eps) * weight + bias, all over the last axis.
template <class T, class M>
void GraphReader<T, M>::layer_norm_pattern(::onnx::NodeProto const& r1) {
  if (r1.op_type() != "ReduceMean" || ints_attr(r1, "axes", {}) != std::vector<std::int64_t>{-1})
    return;
  auto only = [&](std::string const& t, char const* op) -> ::onnx::NodeProto const* {
    auto const& r = index_.readers(t);
    return r.size() == 1 && r[0]->op_type() == op ? r[0] : nullptr;
  };
  auto const* sub = only(r1.output(0), "Sub");
  if (!sub || sub->input(0) != r1.input(0) || sub->input(1) != r1.output(0))
    return;
  auto const& ds = index_.readers(sub->output(0));
  if (ds.size() != 2)
    return;
  auto const* pow = ds[0]->op_type() == "Pow" ? ds[0] : ds[1];
  auto const* div = pow == ds[0] ? ds[1] : ds[0];
  if (pow->op_type() != "Pow" || div->op_type() != "Div" || index_.scalar(pow->input(1)) != 2.f)
    return;
  auto const* r2 = only(pow->output(0), "ReduceMean");
  auto const* add = r2 && ints_attr(*r2, "axes", {}) == std::vector<std::int64_t>{-1}
                        ? only(r2->output(0), "Add")
                        : nullptr;
  auto const* sqrt = add ? only(add->output(0), "Sqrt") : nullptr;
  if (!sqrt || div->input(1) != sqrt->output(0) || div->input(0) != sub->output(0))
    return;
  auto const* mul = only(div->output(0), "Mul");
  auto const* bias = mul ? only(mul->output(0), "Add") : nullptr;
  NormMatch m{r1.input(0), mul, bias, index_.scalar(add->input(1))};
  if (!bias || mul->input(0) != div->output(0) || bias->input(0) != mul->output(0) ||
      std::isnan(m.eps) || !index_.is_constant(mul->input(1)) ||
      !index_.is_constant(bias->input(1)))
    return;
  for (auto const* k : {&r1, sub, pow, r2, add, sqrt, div, mul})
    skip_.insert(k);
  norm_[bias] = m;
}

template <class T, class M>
void GraphReader<T, M>::layer_norm(::onnx::NodeProto const& n, NormMatch const& m) {
  last_axis_in_place(n, m.x);
  std::size_t const d = shape_of(m.x).back();
  bind(*m.mul, 1, "weight", "weight", false, d, 1);
  bind(*m.bias, 1, "bias", "bias", false, d, 1);
  emit(n, LayerNorm<T, M>(d, double(m.eps)), m.x);
}

// LayerNormalization (opset 17) with its scale and bias B: telar::LayerNorm
// over the last axis; over several trailing axes, of a sample stored in
// place, LayerNorm of their product between two Rearrange reshapes (the
// scale's values in the same C order). Its Mean and InvStdDev outputs only
// when nothing reads them.
template <class T, class M>
void GraphReader<T, M>::layer_normalization(::onnx::NodeProto const& n) {
  std::string const x = n.input(0);
  std::size_t const rank = layout_of(x).groups.size();
  std::int64_t const axis = int_attr(n, "axis", -1);
  std::size_t const a = logical_axis(n, x, axis);
  for (int o = 1; o < n.output_size(); ++o)
    if (!n.output(o).empty() &&
        (!index_.readers(n.output(o)).empty() || n.output(o) == plan_.output_name))
      fail(n, std::string("its output ") + (o == 1 ? "Mean" : "InvStdDev") + " '" + n.output(o) +
                  "' is read; only Y is supported");
  if (n.input_size() < 3 || n.input(2).empty())
    fail(n, "has no bias B (input 2): telar::LayerNorm trains a bias (PyTorch's "
            "nn.LayerNorm(d) with elementwise_affine, its default)");
  if (a + 1 == rank)
    last_axis_in_place(n, x);
  else
    plain(n, x);
  if (a + 1 != rank && a == 0)
    fail(n, "axis " + std::to_string(axis) + " normalises over the batch (logical shape " +
                logical_str(x) + "); LayerNorm normalises within a sample");
  Shape const s = shape_of(x);
  std::size_t const r = std::size_t(s.rank), first = a + 1 == rank ? r - 1 : a - 1;
  Shape flat = s; // the stored axes from `first` on as one
  flat.rank = int(first) + 1;
  for (std::size_t d = first + 1; d < r; ++d)
    flat.dims[first] *= s[d];
  std::size_t const size = flat.back();
  std::string const out = n.output(0), in = first + 1 == r ? x : out + "#flat";
  if (in != x)
    emit(n, Rearrange<T, M>::reshape(s, flat), x, in);
  bind(n, 1, "weight", "weight", false, size, 1);
  bind(n, 2, "bias", "bias", false, size, 1);
  float const eps = float_attr(n, "epsilon", 1e-5f);
  if (in == x)
    return emit(n, LayerNorm<T, M>(size, double(eps)), x);
  emit(n, LayerNorm<T, M>(size, double(eps)), in, out + "#norm");
  emit(n, Rearrange<T, M>::reshape(flat, s), out + "#norm", out);
}

} // namespace telar::onnx::detail
