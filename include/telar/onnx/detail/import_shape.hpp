#pragma once
// Shape nodes and tensors whose batch moved (layout.hpp): views,
// Rearranges, Transpose, Reshape, Slice, Split (their constant inputs are
// folded by import_fold.hpp): members of
// telar::onnx::detail::GraphReader (import_graph.hpp, which includes this
// file at its end).
#include <telar/onnx/detail/import_graph.hpp>

namespace telar::onnx::detail {

template <class T, class M>
bool GraphReader<T, M>::layout_aware(std::string const& op) {
  // clang-format off
  static std::set<std::string> const ops{
      "Relu", "Sigmoid", "Tanh", "Gelu", "Clip", "LeakyRelu", "Elu", "HardSigmoid",
      "HardSwish", "Dropout", "Identity", "Transpose", "Reshape", "MatMul", "Gemm", "Add",
      "Sub", "Mul", "Div", "Softmax", "Slice", "ReduceMean", "Unsqueeze", "Squeeze",
      "Gather", "Exp", "Sqrt", "Erf", "Pow", "Split", "LayerNormalization"};
  // clang-format on
  return ops.count(op) > 0;
}

// The logical axes of tensor \p t: the first name along its alias chain
// that has a layout, else [batch, stored axes...].
template <class T, class M>
Layout GraphReader<T, M>::layout_of(std::string t) const {
  for (;;) {
    if (auto const l = layouts_.find(t); l != layouts_.end())
      return l->second;
    auto const a = alias_.find(t);
    if (a == alias_.end())
      return plain_layout(shapes_.at(t).rank);
    t = a->second;
  }
}

template <class T, class M>
std::string GraphReader<T, M>::logical_str(std::string const& t) const {
  return dims_str(logical_dims(layout_of(t), shape_of(t)));
}

// Output \p out of node \p n: the same stored tensor as \p in, read through \p l.
template <class T, class M>
void GraphReader<T, M>::view(::onnx::NodeProto const& n, std::string const& in, Layout l) {
  alias(n, in);
  layouts_[n.output(0)] = std::move(l);
}

// Emits \p layer reading \p in into a fresh tensor whose logical axes are \p l.
template <class T, class M>
template <class L>
std::string GraphReader<T, M>::emit_moved(::onnx::NodeProto const& n, L layer,
                                          std::string const& in, Layout l, char const* tag) {
  std::string const out = n.output(0) + "#" + tag + std::to_string(nodes_.size());
  emit(n, std::move(layer), in, out);
  layouts_[out] = std::move(l);
  return out;
}

// Stores \p x as materialize() says (a Transpose, then a Reshape, each
// only when needed); later readers of \p x read the result.
template <class T, class M>
void GraphReader<T, M>::arrange(::onnx::NodeProto const& n, std::string const& x) {
  Layout const l = layout_of(x);
  Shape const s = shape_of(x);
  Materialized const m = materialize(l, s);
  if (m.shape.rank > Shape::max_rank)
    fail(n, "its input '" + x + "' (logical shape " + logical_str(x) + ") would need " +
                std::to_string(m.shape.rank) + " axes per sample; Telar keeps at most " +
                std::to_string(Shape::max_rank));
  std::string t = resolve(x);
  if (!identity_perm(m.perm)) {
    Layout moved = l; // atom perm[d] is stored at d now
    for (auto& g : moved.groups)
      for (int& a : g)
        if (a != batch_atom)
          a = int(std::find(m.perm.begin(), m.perm.end(), a) - m.perm.begin());
    t = emit_moved(n, Rearrange<T, M>::transpose(s, m.perm), t, moved, "T");
  }
  if (shape_of(t) != m.shape && m.shape.rank == 1) // [batch, C, H, W] read as [batch, C*H*W]
    t = emit_moved(n, Flatten<T, M>{}, t, m.layout, "R");
  else if (shape_of(t) != m.shape)
    t = emit_moved(n, Rearrange<T, M>::reshape(shape_of(t), m.shape), t, m.layout, "R");
  if (t == resolve(x))
    return;
  alias_[x] = t;
  layouts_.erase(x);
}

// \p x stored as [batch, its logical axes...] (what layers other than the
// shape-only ones read), or a refusal naming where the batch is.
template <class T, class M>
void GraphReader<T, M>::plain(::onnx::NodeProto const& n, std::string const& x,
                              std::string const& reader) {
  if (layout_of(x) == plain_layout(shape_of(x).rank))
    return;
  arrange(n, x);
  Layout const l = layout_of(x);
  if (l != plain_layout(shape_of(x).rank))
    fail(n, "tensor '" + x + "' has the logical shape " + logical_str(x) +
                " with the batch not alone at axis 0; " + (reader.empty() ? n.op_type() : reader) +
                " needs [batch, ...] (only Transpose, Reshape, Slice, MatMul, Softmax, "
                "ReduceMean and element-wise nodes read a moved batch)");
}

// \p x's last logical axis in place as its last stored axis (Dense,
// LayerNorm), arranging it if not.
template <class T, class M>
void GraphReader<T, M>::last_axis_in_place(::onnx::NodeProto const& n, std::string const& x) {
  auto in_place = [&] {
    Layout const l = layout_of(x);
    return single_atom(l, l.groups.size() - 1) == shape_of(x).rank - 1;
  };
  if (in_place())
    return;
  arrange(n, x);
  if (!in_place())
    fail(n, "its input '" + x + "' (logical shape " + logical_str(x) +
                ") has the batch in its last axis");
}

// The stored axis of logical axis \p axis of \p x, arranging \p x if it
// spans several; -1 when it holds the batch.
template <class T, class M>
int GraphReader<T, M>::stored_axis(::onnx::NodeProto const& n, std::string const& x,
                                   std::size_t axis) {
  if (single_atom(layout_of(x), axis) < 0)
    arrange(n, x);
  return single_atom(layout_of(x), axis);
}

// Logical axis \p a of \p x (ONNX's negative axes allowed).
template <class T, class M>
std::size_t GraphReader<T, M>::logical_axis(::onnx::NodeProto const& n, std::string const& x,
                                            std::int64_t a) {
  std::int64_t const r = std::int64_t(layout_of(x).groups.size());
  if (a < -r || a >= r)
    fail(n, "axis " + std::to_string(a) + " is outside [" + std::to_string(-r) + ", " +
                std::to_string(r) + ") for the logical shape " + logical_str(x));
  return std::size_t(a < 0 ? a + r : a);
}

template <class T, class M>
void GraphReader<T, M>::transpose(::onnx::NodeProto const& n) {
  Layout const l = layout_of(n.input(0));
  std::size_t const r = l.groups.size();
  std::vector<std::int64_t> def(r);
  for (std::size_t d = 0; d < r; ++d)
    def[d] = std::int64_t(r - 1 - d);
  auto const perm = ints_attr(n, "perm", def);
  std::vector<bool> seen(r, false);
  Layout out;
  for (auto p : perm) {
    if (perm.size() != r || p < 0 || p >= std::int64_t(r) || seen[std::size_t(p)])
      fail(n, "attribute perm is not a permutation of the " + std::to_string(r) +
                  " axes of its input (logical shape " + logical_str(n.input(0)) + ")");
    seen[std::size_t(p)] = true;
    out.groups.push_back(l.groups[std::size_t(p)]);
  }
  view(n, n.input(0), out);
}

// The input of an Unsqueeze or Squeeze of a tensor (one of shape values was
// folded before it reaches here).
template <class T, class M>
std::string GraphReader<T, M>::view_input(::onnx::NodeProto const& n) {
  std::string const x = n.input(0);
  if (!shapes_.count(resolve(x)))
    fail(n, "only a " + n.op_type() +
                " of a tensor computed from the input, or of shape arithmetic (folded), is "
                "supported");
  return x;
}

// Unsqueeze of a tensor: a view with new logical axes of extent 1 (no atom).
template <class T, class M>
void GraphReader<T, M>::unsqueeze(::onnx::NodeProto const& n) {
  std::string const x = view_input(n);
  auto const axes = opset_ >= 13 ? constant_ints(n, 1, "axes") : ints_attr(n, "axes", {});
  Layout l = layout_of(x);
  std::int64_t const r = std::int64_t(l.groups.size() + axes.size());
  std::set<std::int64_t> at;
  for (auto a : axes) {
    if (a < -r || a >= r || !at.insert(a < 0 ? a + r : a).second)
      fail(n, "its axes must be distinct and in [" + std::to_string(-r) + ", " + std::to_string(r) +
                  ") for the logical shape " + logical_str(x));
  }
  for (auto a : at) // increasing: each index is of the result
    l.groups.insert(l.groups.begin() + a, std::vector<int>{});
  view(n, x, l);
}

// \p l without its logical axis \p axis (of extent 1): the axis's stored
// atoms (extent 1) join the nearest axis without the batch, so that the
// stored tensor is unchanged.
template <class T, class M>
Layout GraphReader<T, M>::drop_axis(::onnx::NodeProto const& n, std::string const& x, Layout l,
                                    std::size_t axis) {
  std::vector<int> const atoms = l.groups[axis];
  l.groups.erase(l.groups.begin() + std::ptrdiff_t(axis));
  if (atoms.empty())
    return l;
  auto no_batch = [&](std::size_t g) {
    auto const& a = l.groups[g];
    return std::find(a.begin(), a.end(), batch_atom) == a.end();
  };
  for (std::size_t k = 0; k < l.groups.size(); ++k) { // nearest first, the earlier one on ties
    for (std::size_t g : {axis - 1 - k, axis + k})
      if (g < l.groups.size() && no_batch(g)) {
        auto& dst = l.groups[g];
        dst.insert(g < axis ? dst.end() : dst.begin(), atoms.begin(), atoms.end());
        return l;
      }
  }
  fail(n, "removes an axis of the logical shape " + logical_str(x) +
              ", leaving only the batch (Telar keeps a sample axis)");
}

// Squeeze of a tensor: its axes of extent 1 dropped (a view).
template <class T, class M>
void GraphReader<T, M>::squeeze(::onnx::NodeProto const& n) {
  std::string const x = view_input(n);
  Layout l = layout_of(x);
  auto const dims = logical_dims(l, shape_of(x));
  std::vector<std::int64_t> axes;
  if (opset_ >= 13 ? n.input_size() > 1 && !n.input(1).empty() : find_attr(n, "axes") != nullptr)
    axes = opset_ >= 13 ? constant_ints(n, 1, "axes") : ints_attr(n, "axes", {});
  else
    for (std::size_t d = 0; d < dims.size(); ++d)
      if (dims[d] == Sym{1, 0})
        axes.push_back(std::int64_t(d));
  std::set<std::size_t> at;
  for (auto a : axes) {
    std::size_t const d = logical_axis(n, x, a);
    if (dims[d] != Sym{1, 0})
      fail(n, "squeezes axis " + std::to_string(a) + " of the logical shape " + logical_str(x) +
                  ", whose extent is not 1");
    at.insert(d);
  }
  for (auto it = at.rbegin(); it != at.rend(); ++it) // from the last: earlier indices hold
    l = drop_axis(n, x, l, *it);
  view(n, x, l);
}

// Gather of one index (a constant scalar) along a logical axis of a tensor
// that is not the batch (PyTorch 2 picks q, k and v of a packed projection
// so): a telar::Rearrange::slice of that index, the axis dropped.
template <class T, class M>
void GraphReader<T, M>::gather_axis(::onnx::NodeProto const& n) {
  std::string const x = n.input(0);
  auto const* c = index_.constant(n.input(1));
  if (!c || c->dims_size() != 0 ||
      (c->data_type() != ::onnx::TensorProto::INT64 &&
       c->data_type() != ::onnx::TensorProto::INT32))
    fail(n, "a Gather of a tensor is supported only by one constant integer index (a scalar); "
            "else a Gather of a constant table by the graph's integer input (an embedding)");
  std::int64_t i = 0;
  if (c->data_type() == ::onnx::TensorProto::INT64) {
    i = ints_of(*c).at(0);
  } else if (c->int32_data_size() == 1) {
    i = c->int32_data(0);
  } else {
    std::int32_t v = 0;
    if (c->raw_data().size() != sizeof v)
      fail(n, "its index '" + n.input(1) + "' holds no int32 value");
    std::memcpy(&v, c->raw_data().data(), sizeof v);
    i = v;
  }
  std::size_t const a = logical_axis(n, x, int_attr(n, "axis", 0));
  int const d = stored_axis(n, x, a);
  if (d < 0)
    fail(n, "gathers along axis " + std::to_string(int_attr(n, "axis", 0)) +
                " of the logical shape " + logical_str(x) + ", which holds the batch");
  std::int64_t const len = std::int64_t(shape_of(x)[d]);
  if (i < -len || i >= len)
    fail(n, "index " + std::to_string(i) + " is outside [" + std::to_string(-len) + ", " +
                std::to_string(len) + ") of axis " + std::to_string(int_attr(n, "axis", 0)) +
                " of the logical shape " + logical_str(x));
  i = i < 0 ? i + len : i;
  Layout const l = drop_axis(n, x, layout_of(x), a);
  emit(n, Rearrange<T, M>::slice(shape_of(x), d, std::size_t(i), std::size_t(i) + 1), x);
  if (l != plain_layout(shapes_.at(n.output(0)).rank))
    layouts_[n.output(0)] = l;
  else
    layouts_.erase(n.output(0));
}

// The target shape with ONNX's 0 (copy the input's extent) and -1 (infer).
template <class T, class M>
std::vector<Sym> GraphReader<T, M>::reshape_target(::onnx::NodeProto const& n) {
  auto t = folded_input(n, 1, "shape");
  auto const in = logical_dims(layout_of(n.input(0)), shape_of(n.input(0)));
  Sym total{1, 0}, known{1, 0};
  for (Sym e : in)
    total = total * e;
  int infer = -1;
  for (std::size_t d = 0; d < t.size(); ++d) {
    if (t[d] == Sym{0, 0} && int_attr(n, "allowzero", 0) == 0 && d < in.size())
      t[d] = in[d];
    if (t[d] == Sym{-1, 0} && infer < 0)
      infer = int(d);
    else
      known = known * t[d];
  }
  if (infer >= 0) {
    auto const e = divide(total, known);
    if (!e)
      fail(n, "cannot infer the -1 of shape " + dims_str(t) + " for the logical shape " +
                  dims_str(in));
    t[std::size_t(infer)] = *e;
  }
  return t;
}

// A view when the new axes group the stored ones; a stored axis that must
// split is split first (a Rearrange).
template <class T, class M>
void GraphReader<T, M>::reshape(::onnx::NodeProto const& n) {
  auto const target = reshape_target(n);
  std::string x = n.input(0);
  for (int k = 0; k <= Shape::max_rank; ++k) {
    Regroup const r = regroup(layout_of(x), shape_of(x), target);
    if (r.layout)
      return view(n, x, *r.layout);
    if (r.split_axis < 0 || shape_of(x).rank >= Shape::max_rank)
      break;
    auto const [s, l] = split_axis(layout_of(x), shape_of(x), r.split_axis, r.split_outer);
    x = emit_moved(n, Rearrange<T, M>::reshape(shape_of(x), s), resolve(x), l, "S");
  }
  fail(n, "cannot reshape the logical shape " + logical_str(n.input(0)) + " to " +
              dims_str(target) +
              ": it would split or reorder the batch, or need more than 4 axes per sample");
}

template <class T, class M>
void GraphReader<T, M>::slice(::onnx::NodeProto const& n) {
  std::string const x = n.input(0);
  if (opset_ < 10)
    fail(n, "Slice before opset 10 (attributes) is not supported");
  auto const b = constant_ints(n, 1, "starts"), e = constant_ints(n, 2, "ends");
  std::vector<std::int64_t> axes(b.size());
  for (std::size_t k = 0; k < axes.size(); ++k) // ONNX's default: the first len(starts) axes
    axes[k] = std::int64_t(k);
  if (n.input_size() > 3 && !n.input(3).empty())
    axes = constant_ints(n, 3, "axes");
  if (n.input_size() > 4 && !n.input(4).empty() &&
      constant_ints(n, 4, "steps") != std::vector<std::int64_t>(b.size(), 1))
    fail(n, "its steps (input 4) are not supported: only step 1 on each axis");
  if (b.empty() || e.size() != b.size() || axes.size() != b.size())
    fail(n, "its starts, ends and axes must have one entry per sliced axis (got " +
                std::to_string(b.size()) + ", " + std::to_string(e.size()) + " and " +
                std::to_string(axes.size()) + ")");
  std::string in = x; // one Rearrange::slice per axis, chained
  for (std::size_t k = 0; k < axes.size(); ++k) {
    std::string const out =
        k + 1 == axes.size() ? n.output(0) : n.output(0) + "#" + std::to_string(k);
    emit(n, slice_of(n, in, axes[k], b[k], e[k]), in, out);
    in = out;
  }
}

// [start, end) of one logical axis of \p x (clamped as ONNX clamps) as a
// telar::Rearrange::slice of its stored axis; the batch is refused.
template <class T, class M>
Rearrange<T, M> GraphReader<T, M>::slice_of(::onnx::NodeProto const& n, std::string const& x,
                                            std::int64_t axis, std::int64_t b, std::int64_t e) {
  std::size_t const a = logical_axis(n, x, axis);
  int const d = stored_axis(n, x, a);
  if (d < 0)
    fail(n, "slices axis " + std::to_string(axis) + " of the logical shape " + logical_str(x) +
                ", which holds the batch");
  std::int64_t const len = std::int64_t(shape_of(x)[d]);
  auto clamp = [&](std::int64_t v) {
    return std::size_t(std::min(len, std::max<std::int64_t>(0, v < 0 ? v + len : v)));
  };
  std::size_t const lo = clamp(b), hi = clamp(e);
  if (lo >= hi)
    fail(n, "the slice [" + std::to_string(b) + ", " + std::to_string(e) + ") of axis " +
                std::to_string(axis) + " is empty");
  return Rearrange<T, M>::slice(shape_of(x), d, lo, hi);
}

// Split into slices of one axis (not the batch): the sizes from input 1
// (opset 13+) or the `split` attribute, else equal parts (opset 18's
// num_outputs: the last one smaller when the extent does not divide). An
// output nothing reads is left out (a view: no parameter misses a gradient).
template <class T, class M>
void GraphReader<T, M>::split(::onnx::NodeProto const& n) {
  std::string const x = n.input(0);
  std::int64_t const axis = int_attr(n, "axis", 0);
  int const d = stored_axis(n, x, logical_axis(n, x, axis));
  if (d < 0)
    fail(n, "splits axis " + std::to_string(axis) + " of the logical shape " + logical_str(x) +
                ", which holds the batch");
  std::int64_t const len = std::int64_t(shape_of(x)[d]), parts = n.output_size();
  std::vector<std::int64_t> sizes = ints_attr(n, "split", {});
  if (n.input_size() > 1 && !n.input(1).empty())
    sizes = constant_ints(n, 1, "split");
  if (sizes.empty()) {
    std::int64_t const each = (len + parts - 1) / parts;
    for (std::int64_t k = 0; k < parts; ++k)
      sizes.push_back(std::min(each, len - std::min(len, k * each)));
  }
  std::int64_t total = 0;
  for (auto const v : sizes)
    total += v;
  if (std::int64_t(sizes.size()) != parts || total != len)
    fail(n, "its " + std::to_string(sizes.size()) + " split sizes (sum " + std::to_string(total) +
                ") do not cut axis " + std::to_string(axis) + " (extent " + std::to_string(len) +
                ") into its " + std::to_string(parts) + " outputs");
  std::int64_t start = 0;
  for (int k = 0; k < n.output_size(); start += sizes[std::size_t(k)], ++k) {
    std::string const& out = n.output(k);
    if (!out.empty() && (!index_.readers(out).empty() || out == plan_.output_name))
      emit(n, slice_of(n, x, axis, start, start + sizes[std::size_t(k)]), x, out);
  }
}

} // namespace telar::onnx::detail
