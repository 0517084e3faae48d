#pragma once
// The graph walk of telar::onnx::import_model: every node (or recognised
// pattern) mapped onto a built-in layer or a join, chains kept as chains and
// the rest placed in DynamicGraph layers. Shape arithmetic is folded
// (fold.hpp), tensors whose batch moved are tracked (layout.hpp); what the
// model does with the plan is in start_values.hpp.
#include <telar/core/dynamic_graph.hpp>
#include <telar/core/dynamic_sequential.hpp>
#include <telar/core/shape.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/batch_norm.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/conv_transpose.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/dropout.hpp>
#include <telar/layers/embedding.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/layers/masked_fill.hpp>
#include <telar/layers/normalization.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/layers/rearrange.hpp>
#include <telar/layers/softmax.hpp>
#include <telar/layers/upsample.hpp>
#include <telar/onnx/detail/fold.hpp>
#include <telar/onnx/detail/layout.hpp>
#include <telar/onnx/detail/proto.hpp>
#include <telar/onnx/detail/start_values.hpp>
#include <telar/onnx/error.hpp>
#include <telar/onnx/model.hpp>
#include <telar/parallel/detail/stage_runner.hpp>
#include <telar/parallel/tensor_parallel.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace telar::onnx::detail {

inline constexpr int min_opset = 9, max_opset = 18;

inline char const* supported_ops() {
  return "Gemm, MatMul (+ Add of a bias), Relu, Gelu (or the Div/Erf/Add/Mul pattern), Sigmoid, "
         "Tanh, Clip, LeakyRelu, Elu, HardSigmoid, HardSwish, SiLU (Sigmoid and Mul of one "
         "tensor), Conv (2-D, 3-D, grouped), ConvTranspose, BatchNormalization, MaxPool and "
         "AveragePool (2-D, 3-D), GlobalAveragePool, GlobalMaxPool, Resize and Upsample "
         "(nearest by integer factors, linear), Flatten, Add, Mul "
         "and Concat of tensors, Pad of zeros, Identity, Dropout, Softmax over an axis after the "
         "batch, Softmax/LogSoftmax over the last axis as the last node, Transpose, Reshape, "
         "Slice (static shapes; the batch may move), MatMul of two tensors (batched), Mul/Div "
         "by a constant scalar, ReduceMean, LayerNormalization's ReduceMean/Sub/Pow/Sqrt/Div "
         "form, Gather of a constant table by integer token ids (an embedding), Add of a "
         "constant [seq, hidden] (a learned positional embedding), Where with a constant mask "
         "and a constant scalar (masked_fill), and shape arithmetic (Shape, Gather, "
         "Unsqueeze, Concat, Cast, ...) folded";
}

// One node of the file once mapped, before it is placed in the model: a
// layer or a join, the tensors it reads and writes, and where its
// parameters come from (names local to the layer).
template <class T, class M>
struct IrNode {
  enum Kind { layer, add, concat, mul, matmul };
  Kind kind = layer;
  std::string name, label; // name in a DynamicGraph; the ONNX node for messages
  std::optional<NodeLayer<T, M>> op;
  std::vector<std::string> inputs;
  std::string output;
  std::vector<ParameterBinding> bindings;
};

// The parts of a LayerNormalization decomposition the layer needs.
struct NormMatch {
  std::string x;                 // the normalised tensor
  ::onnx::NodeProto const* mul;  // by the weight (input 1)
  ::onnx::NodeProto const* bias; // plus the bias (input 1): the last node
  float eps;
};

template <class T, class M>
struct GraphPlan {
  std::vector<Layer<T, M>> layers;
  Shape input_shape;
  std::string input_name, output_name, output_activation;
  std::vector<ParameterBinding> bindings;
  std::map<std::string, std::vector<T>> start;
};

// Maps every node (or recognised pattern) onto a layer or a join in file
// order (ONNX files are topologically sorted), then places them: a layer
// that alone reads the only tensor alive is a layer of the chain; every run
// of other nodes (branches, skips and their joins) becomes one DynamicGraph.
template <class T, class M>
class GraphReader {
public:
  GraphReader(::onnx::ModelProto const& m, std::string path)
      : m_(m), g_(m.graph()), index_(m.graph()), path_(std::move(path)) {}

  GraphPlan<T, M> read() {
    check_opset();
    find_ends();
    shapes_[plan_.input_name] = plan_.input_shape;
    for (auto const& [t, rs] : index_.consumers)
      if (rs.size() == 2)
        gelu_pattern(t, rs);
    for (auto const& n : g_.node())
      silu_pattern(n);
    for (auto const& n : g_.node())
      layer_norm_pattern(n);
    for (auto const& n : g_.node())
      visit(n);
    output_in_place();
    std::string const out = resolve(plan_.output_name);
    if (!shapes_.count(out))
      fail("the graph output '" + plan_.output_name + "' is not computed from the input '" +
           plan_.input_name + "'");
    check_reach(out);
    place(out);
    if (plan_.layers.empty()) // e.g. one Identity, Dropout or Softmax node
      fail("the graph maps to no layer (nothing Telar could train): its nodes are only "
           "Identity, inactive Dropout or a final Softmax");
    return std::move(plan_);
  }

private:
  using Ir = IrNode<T, M>;

  [[noreturn]] void fail(std::string const& what) const {
    throw OnnxError("telar::onnx::import_model: '" + path_ + "': " + what);
  }
  [[noreturn]] void fail(::onnx::NodeProto const& n, std::string const& what) const {
    fail(node_label(n) + ": " + what);
  }

  void check_opset() {
    for (auto const& o : m_.opset_import())
      if (o.domain().empty() || o.domain() == "ai.onnx") {
        opset_ = o.version();
        if (o.version() < min_opset || o.version() > max_opset)
          fail("opset " + std::to_string(o.version()) +
               " of the default domain is not supported (" + std::to_string(min_opset) + " to " +
               std::to_string(max_opset) +
               "; export with e.g. torch.onnx.export(..., opset_version=13))");
      }
  }

  // An axis attribute of a tensor of rank \p rank (batch included) made
  // non-negative, as ONNX allows -rank <= axis < rank.
  std::int64_t axis_of(::onnx::NodeProto const& n, std::int64_t def, std::size_t rank) const {
    std::int64_t const a = int_attr(n, "axis", def), r = std::int64_t(rank);
    if (a < -r || a >= r)
      fail(n, "axis " + std::to_string(a) + " is outside [" + std::to_string(-r) + ", " +
                  std::to_string(r) + ") for an input of rank " + std::to_string(r));
    return a < 0 ? a + r : a;
  }

  void find_ends() {
    std::vector<::onnx::ValueInfoProto const*> inputs;
    for (auto const& in : g_.input())
      if (!index_.is_constant(in.name()))
        inputs.push_back(&in);
    if (inputs.size() != 1 || g_.output_size() != 1)
      fail("the graph has " + std::to_string(inputs.size()) + " inputs and " +
           std::to_string(g_.output_size()) +
           " outputs; Telar imports graphs with one input and one output");
    auto const& in = *inputs[0];
    plan_.input_name = in.name();
    plan_.output_name = g_.output(0).name();
    auto const& tt = in.type().tensor_type();
    if (token_ids(in.name(), tt.elem_type()))
      ids_input_ = true;
    else if (tt.elem_type() != ::onnx::TensorProto::FLOAT)
      fail("input '" + in.name() + "' has data type " + data_type_name(tt.elem_type()) +
           "; Telar imports float32 (FLOAT) models (export the model in float32)");
    int const rank = tt.shape().dim_size();
    if (rank < 2 || rank > 5)
      fail("input '" + in.name() + "' has rank " + std::to_string(rank) +
           "; Telar takes [batch, features], [batch, C, L], [batch, C, H, W] or "
           "[batch, C, D, H, W]");
    Shape s;
    s.rank = rank - 1;
    for (int d = 1; d < rank; ++d) {
      auto const& dim = tt.shape().dim(d);
      if (!dim.has_dim_value() || dim.dim_value() <= 0)
        fail("dimension " + std::to_string(d) + " of input '" + in.name() + "' is dynamic ('" +
             dim.dim_param() + "'); only the batch dimension (0) may be");
      s.dims[std::size_t(d - 1)] = std::size_t(dim.dim_value());
    }
    plan_.input_shape = s;
  }

  // An integer input that only Gathers from constant tables read (and Shape):
  // token ids, which travel as T values into telar::Embedding.
  bool token_ids(std::string const& in, int type) const {
    if (type != ::onnx::TensorProto::INT64 && type != ::onnx::TensorProto::INT32)
      return false;
    auto const& rs = index_.readers(in);
    return !rs.empty() && std::all_of(rs.begin(), rs.end(), [&](auto const* r) {
      return r->op_type() == "Shape" || (r->op_type() == "Gather" && r->input_size() == 2 &&
                                         r->input(1) == in && index_.is_constant(r->input(0)));
    });
  }

  std::string resolve(std::string t) const {
    for (auto it = alias_.find(t); it != alias_.end(); it = alias_.find(t))
      t = it->second;
    return t;
  }
  Shape const& shape_of(std::string const& t) const { return shapes_.at(resolve(t)); }
  void alias(::onnx::NodeProto const& n, std::string const& in) {
    alias_[n.output(0)] = resolve(in);
  }

  void visit(::onnx::NodeProto const& n) {
    if (n.op_type() == "Constant" || index_.aliases.count(&n) || skip_.count(&n))
      return;
    if (!n.domain().empty() && n.domain() != "ai.onnx")
      fail(n,
           "operator domain '" + n.domain() + "' is not supported; supported: " + supported_ops());
    if (auto const g = gelu_.find(&n); g != gelu_.end())
      return emit(n, GELU<T, M>{}, g->second);
    if (auto const g = silu_.find(&n); g != silu_.end())
      return emit(n, SiLU<T, M>{}, g->second);
    if (auto const g = norm_.find(&n); g != norm_.end())
      return layer_norm(n, g->second);
    if (fold(n))
      return;
    for (auto const& in : n.input())
      if (!in.empty() && !index_.is_constant(in) && !folded_.count(in) &&
          !shapes_.count(resolve(in)))
        fail(n, "reads tensor '" + in + "', which is not computed from the graph input '" +
                    plan_.input_name + "' by the nodes before it" + cycle_through(n, in) +
                    " (Telar imports acyclic graphs in topological order with one input)");
    map_node(n);
  }

  // ": a cycle, 'a' (Relu) -> 'b' (Sigmoid) -> 'a' (Relu)" when the node
  // producing `t` depends on `n` itself (a breadth-first walk back through
  // producers, recording where each node was reached from); else "".
  std::string cycle_through(::onnx::NodeProto const& n, std::string const& t) const {
    std::map<std::string, ::onnx::NodeProto const*> producer;
    for (auto const& m : g_.node())
      for (auto const& out : m.output())
        producer[out] = &m;
    std::map<::onnx::NodeProto const*, ::onnx::NodeProto const*> next; // toward n
    std::vector<::onnx::NodeProto const*> todo;
    if (auto it = producer.find(t); it != producer.end())
      next[it->second] = &n, todo.push_back(it->second);
    for (std::size_t k = 0; k < todo.size() && !next.count(&n); ++k)
      for (auto const& in : todo[k]->input())
        if (auto it = producer.find(in); it != producer.end() && !next.count(it->second))
          next[it->second] = todo[k], todo.push_back(it->second);
    if (!next.count(&n))
      return {};
    std::string path = node_label(n); // n, then what reads n's result, ..., back to n
    for (auto const* m = next.at(&n); m != &n; m = next.at(m))
      path += " -> " + node_label(*m);
    return ": a cycle, " + path + " -> " + node_label(n);
  }

  void map_node(::onnx::NodeProto const& n) {
    std::string const& op = n.op_type();
    std::string const x = n.input_size() > 0 ? n.input(0) : std::string();
    if (!layout_aware(op) && !x.empty() && shapes_.count(resolve(x)))
      plain(n, x); // Conv, pools, Flatten, ... read [batch, C, ...] in place
    if (op == "Transpose")
      return transpose(n);
    if (op == "Slice")
      return slice(n);
    if (op == "ReduceMean")
      return reduce_mean(n);
    if (op == "Gemm")
      return gemm(n);
    if (op == "MatMul")
      return matmul(n);
    if (op == "Relu")
      return emit(n, ReLU<T, M>{}, x);
    if (op == "Sigmoid")
      return emit(n, Sigmoid<T, M>{}, x);
    if (op == "Tanh")
      return emit(n, Tanh<T, M>{}, x);
    if (op == "Gelu") {
      if (string_attr(n, "approximate", "none") != "none")
        fail(n, "attribute approximate = '" + string_attr(n, "approximate", "") +
                    "' is not supported: only the exact (erf) GELU");
      return emit(n, GELU<T, M>{}, x);
    }
    if (op == "Flatten") {
      if (axis_of(n, 1, shape_of(x).rank + 1) != 1)
        fail(n, "axis " + std::to_string(int_attr(n, "axis", 1)) +
                    " is not supported (only the axis after the batch: 1, or -" +
                    std::to_string(shape_of(x).rank) + ")");
      return emit(n, Flatten<T, M>{}, x);
    }
    if (op == "Reshape")
      return reshape(n);
    if (op == "Conv")
      return conv(n);
    if (op == "ConvTranspose")
      return conv_transpose(n);
    if (op == "BatchNormalization")
      return batch_norm(n);
    if (op == "MaxPool" || op == "AveragePool")
      return pool(n);
    if (op == "GlobalAveragePool")
      return emit(n, GlobalAvgPool<T, M>{}, x);
    if (op == "Identity")
      return alias(n, x);
    if (op == "Dropout")
      return dropout(n);
    if (op == "Pad")
      return pad(n);
    if (op == "Add" || op == "Mul" || op == "Concat" || op == "Sub" || op == "Div")
      return join(n);
    if (op == "Softmax" || op == "LogSoftmax")
      return softmax(n);
    if (op == "Clip")
      return clip(n);
    if (op == "LeakyRelu")
      return emit(n, LeakyReLU<T, M>(T(float_attr(n, "alpha", 0.01f))), x);
    if (op == "Elu")
      return emit(n, ELU<T, M>(T(float_attr(n, "alpha", 1.f))), x);
    if (op == "HardSigmoid") // ONNX's defaults (PyTorch exports alpha 1/6)
      return emit(
          n, HardSigmoid<T, M>(T(float_attr(n, "alpha", 0.2f)), T(float_attr(n, "beta", 0.5f))), x);
    if (op == "HardSwish")
      return emit(n, HardSwish<T, M>{}, x);
    if (op == "GlobalMaxPool")
      return emit(n, GlobalMaxPool<T, M>{}, x);
    if (op == "Resize" || op == "Upsample")
      return resize(n);
    if (op == "Gather")
      return gather(n);
    if (op == "Where")
      return where(n);
    std::string const shape = shapes_.count(resolve(x)) ? " (its input '" + x + "' is " +
                                                              shape_of(x).str() + " per sample)"
                                                        : std::string();
    fail(n, "operator " + op + " is not supported" + shape + "; supported: " + supported_ops());
  }

  // Layer node reading \p in, writing \p out (the node's output by default).
  template <class L>
  void emit(::onnx::NodeProto const& n, L layer, std::string const& in, std::string out = {}) {
    if (out.empty())
      out = n.output(0);
    Shape const& s = shape_of(in);
    try {
      shapes_[out] = layer.output_shape(s);
    } catch (ShapeError const& e) {
      fail(n, "cannot take input '" + in + "' " + s.str() + ": " + e.what());
    }
    if (shapes_[out].rank == s.rank && layout_of(in) != plain_layout(s.rank))
      layouts_[out] = layout_of(in); // element-wise, or along the last stored axis
    Ir node;
    node.op.emplace(std::move(layer));
    node.inputs = {resolve(in)};
    push(n, std::move(node), out);
  }
  void push(::onnx::NodeProto const& n, Ir node, std::string const& out) {
    std::string name = n.name().empty() ? n.output(0) : n.name();
    for (int k = 2; names_.count(name); ++k)
      name = (n.name().empty() ? n.output(0) : n.name()) + "#" + std::to_string(k);
    names_.insert(name);
    node.name = name;
    node.label = node_label(n);
    node.output = out;
    node.bindings = std::move(pending_);
    pending_.clear();
    nodes_.push_back(std::move(node));
  }

  // Add, Mul of two tensors and Concat along the channels: joins of the graph.
  void join(::onnx::NodeProto const& n) {
    std::string const& op = n.op_type();
    if (scale(n))
      return;
    if (op == "Add" && positional(n))
      return;
    if (op == "Sub" || op == "Div")
      fail(n, op + " of two tensors is not supported (only inside LayerNormalization's "
                   "ReduceMean/Sub/Pow/Sqrt/Div form; by a constant scalar as a Scale)");
    for (auto const& in : n.input())
      if (index_.is_constant(in))
        fail(n, op + " of the constant '" + in +
                    "' and a tensor is not supported: Telar has no per-channel affine layer to "
                    "fold it into (only a MatMul's bias Add is folded, into Dense); " +
                    op + " is supported between tensors (a join)");
    if (op == "Concat" && n.input_size() == 1) {    // DenseNet's first layer: torch.cat([x])
      axis_of(n, 1, shape_of(n.input(0)).rank + 1); // still a valid axis
      return alias(n, n.input(0));
    }
    if (n.input_size() < 2)
      fail(n, op + " needs two inputs or more");
    Layout const l = op == "Add" ? same_layouts(n) : Layout{};
    if (op != "Add")
      for (auto const& t : n.input())
        plain(n, t);
    std::vector<Shape> in;
    for (auto const& t : n.input())
      in.push_back(shape_of(t));
    Shape out = in[0];
    Ir node;
    if (op == "Add") {
      if (l != plain_layout(out.rank))
        layouts_[n.output(0)] = l;
      node.kind = Ir::add;
      if (in[1] != in[0])
        fail(n, "adds " + in[0].str() + " and " + in[1].str() +
                    "; only tensors of equal shapes are added (no broadcasting)");
    } else if (op == "Mul") {
      node.kind = Ir::mul;
      auto const per_channel = [](Shape const& a, Shape const& b) { // a [C, 1, ...] against b
        if (a.rank != b.rank || a[0] != b[0])
          return false;
        for (int d = 1; d < a.rank; ++d)
          if (a[std::size_t(d)] != 1)
            return false;
        return true;
      };
      if (in[1] != in[0] && !per_channel(in[1], in[0]) && !per_channel(in[0], in[1]))
        fail(n, "multiplies " + in[0].str() + " and " + in[1].str() +
                    "; only equal shapes, or one value per channel ([C, 1, 1] against "
                    "[C, H, W]), are supported");
      out = per_channel(in[0], in[1]) ? in[1] : in[0];
    } else {
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
    }
    for (auto const& t : n.input())
      node.inputs.push_back(resolve(t));
    shapes_[n.output(0)] = out;
    push(n, std::move(node), n.output(0));
  }

  // Over the last axis as the last node: the loss's softmax (the model
  // gives logits, Imported::output_activation says which). Anywhere else, a
  // telar::Softmax layer over one axis of the sample.
  void softmax(::onnx::NodeProto const& n) {
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
  void clip(::onnx::NodeProto const& n) {
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

  // Resize (opset 11+: X, roi, scales, sizes; 10: X, scales) and Upsample
  // (X, scales): upsampling by integer factors, nearest or linear.
  void resize(::onnx::NodeProto const& n) {
    bool const up = n.op_type() == "Upsample";
    Shape const& s = shape_of(n.input(0));
    if (s.rank < 2 || s.rank > 4)
      fail(n, "needs an input [C, L], [C, H, W] or [C, D, H, W], got " + s.str());
    std::string const mode = string_attr(n, "mode", "nearest");
    std::string ct = string_attr(n, "coordinate_transformation_mode", "half_pixel");
    std::string nm = string_attr(n, "nearest_mode", "round_prefer_floor");
    if (up || opset_ < 11) { // Upsample and Resize-10: asymmetric, nearest rounds down
      ct = "asymmetric";
      nm = "floor";
    }
    for (char const* a : {"axes", "antialias"})
      if (find_attr(n, a) && !(std::string(a) == "antialias" && int_attr(n, a, 0) == 0))
        fail(n, std::string("attribute ") + a + " is not supported");
    if (string_attr(n, "keep_aspect_ratio_policy", "stretch") != "stretch")
      fail(n, "attribute keep_aspect_ratio_policy = '" +
                  string_attr(n, "keep_aspect_ratio_policy", "") + "' is not supported (stretch)");
    bool const linear = mode == "linear" || mode == "bilinear" || mode == "trilinear";
    if (!linear && mode != "nearest")
      fail(n, "attribute mode = '" + mode + "' is not supported (nearest, linear)");
    bool align = false;
    if (linear) {
      if (ct == "align_corners")
        align = true;
      else if (ct != "half_pixel" && ct != "pytorch_half_pixel")
        fail(n, std::string(up ? "Upsample"
                               : "attribute coordinate_transformation_mode = '" + ct + "'") +
                    (up ? "'s linear mode (asymmetric coordinates)" : "") +
                    " is not supported with linear: half_pixel or pytorch_half_pixel (PyTorch's "
                    "align_corners=False) and align_corners (align_corners=True)");
    } else if (!((ct == "half_pixel" || ct == "pytorch_half_pixel") &&
                 (nm == "round_prefer_floor" || nm == "round_prefer_ceil")) &&
               !(ct == "asymmetric" && nm == "floor"))
      fail(n,
           "attributes coordinate_transformation_mode = '" + ct + "' and nearest_mode = '" + nm +
               "' are not supported with nearest (asymmetric with floor, as PyTorch exports, "
               "or half_pixel with round_prefer_floor/ceil: each output copies input i / factor)");
    int const si = up || opset_ < 11 ? 1 : 2;
    std::size_t const rank = s.rank + 1, sp = s.rank - 1;
    auto const* st =
        n.input_size() > si && !n.input(si).empty() ? index_.constant(n.input(si)) : nullptr;
    if (n.input_size() > si && !n.input(si).empty() && !st)
      fail(n, "its scales '" + n.input(si) + "' must be a constant");
    std::vector<std::size_t> factor(sp), size(sp);
    bool by_size = false;
    if (st && count(*st) > 0) {
      auto const v = floats_of(*st);
      if (v.size() != rank)
        fail(n, "its scales have " + std::to_string(v.size()) + " entries for an input of rank " +
                    std::to_string(rank));
      if (v[0] != 1.f || v[1] != 1.f)
        fail(n, "its scales resize the batch or channel axis (" + std::to_string(v[0]) + ", " +
                    std::to_string(v[1]) + "); only spatial axes are supported");
      for (std::size_t d = 0; d < sp; ++d) {
        if (!(v[d + 2] >= 1.f) || v[d + 2] != std::floor(v[d + 2]))
          fail(n, "its scales: factor " + std::to_string(v[d + 2]) + " of spatial axis " +
                      std::to_string(d) + " is not supported (integer upsampling factors only)");
        factor[d] = std::size_t(v[d + 2]);
      }
    } else {
      auto const* zt = !up && opset_ >= 11 && n.input_size() > 3 && !n.input(3).empty()
                           ? index_.constant(n.input(3))
                           : nullptr;
      if (!zt)
        fail(n, "needs constant scales or sizes");
      auto const v = ints_of(*zt);
      if (v.size() != rank || v[1] != std::int64_t(s[0]))
        fail(n, "its sizes must have " + std::to_string(rank) + " entries and keep the channels (" +
                    std::to_string(s[0]) + ")");
      for (std::size_t d = 0; d < sp; ++d) {
        std::size_t const in = s[d + 1];
        if (v[d + 2] < std::int64_t(in))
          fail(n, "its sizes shrink spatial axis " + std::to_string(d) +
                      " (downsampling is not supported)");
        size[d] = std::size_t(v[d + 2]);
        if (!linear && size[d] % in != 0)
          fail(n, "its sizes: " + std::to_string(size[d]) + " is not a multiple of " +
                      std::to_string(in) + " (nearest: integer factors only)");
        factor[d] = size[d] / in;
      }
      by_size = linear;
    }
    UpsampleMode const um = linear ? UpsampleMode::linear : UpsampleMode::nearest;
    if (by_size)
      return emit(n, Upsample<T, M>::to_size(size, um, align), n.input(0));
    emit(n, Upsample<T, M>(factor, um, align), n.input(0));
  }

  // Opset 12+: ratio and training_mode are inputs 1 and 2 (constants);
  // earlier: a ratio attribute, and the node is inactive in inference. An
  // active dropout trains as telar::Dropout; an inactive one is the identity.
  void dropout(::onnx::NodeProto const& n) {
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

  ::onnx::TensorProto const& initializer(::onnx::NodeProto const& n, int i, char const* what) {
    auto const* t = i < n.input_size() ? index_.constant(n.input(i)) : nullptr;
    if (!t)
      fail(n, std::string("its ") + what + " (input " + std::to_string(i) +
                  ") must be an initializer (a constant)");
    if (t->data_type() != ::onnx::TensorProto::FLOAT)
      fail(n, std::string("its ") + what + " '" + t->name() + "' has data type " +
                  data_type_name(t->data_type()) + "; Telar imports float32 (FLOAT) models");
    return *t;
  }
  static std::size_t count(::onnx::TensorProto const& t) {
    std::size_t size = 1;
    for (auto d : t.dims())
      size *= std::size_t(d);
    return size;
  }

  // Parameter (or buffer) \p param of the next layer from input \p i of
  // \p n, under the name the node reads it by (PyTorch reaches a shared
  // initializer through Identity nodes named after each module's parameter).
  void bind(::onnx::NodeProto const& n, int i, char const* what, std::string const& param,
            bool transpose, std::size_t rows, std::size_t cols, bool buffer = false) {
    auto const& t = initializer(n, i, what);
    std::string const& key = n.input(i);
    if (count(t) != rows * cols)
      fail(n, std::string("its ") + what + " '" + key + "' holds " + std::to_string(count(t)) +
                  " values, expected " + std::to_string(rows * cols));
    if (auto const b = bound_by_.find(key); b != bound_by_.end())
      fail(n, "initializer '" + key + "' is also a parameter of " + b->second +
                  "; shared (tied) parameters are not supported");
    bound_by_[key] = node_label(n);
    ParameterBinding b;
    b.param = param;
    b.initializer = key;
    b.transpose = transpose;
    b.rows = rows;
    b.cols = cols;
    b.buffer = buffer;
    auto const v = floats_of(t);
    std::vector<T> s(v.size());
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c)
        s[r * cols + c] = T(transpose ? v[c * rows + r] : v[r * cols + c]);
    plan_.start[key] = std::move(s);
    pending_.push_back(std::move(b));
  }

  void gemm(::onnx::NodeProto const& n) {
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
      fail(n, "weight '" + w.name() + "' takes " + std::to_string(in) +
                  " features, the input has " + std::to_string(shape_of(n.input(0)).back()));
    bool const bias = n.input_size() > 2 && !n.input(2).empty();
    bind(n, 1, "weight", "weight", !tb, out, in);
    if (bias)
      bind(n, 2, "bias", "bias", false, out, 1);
    emit(n, Dense<T, M>(in, out, bias), n.input(0));
  }

  // MatMul by a constant [in, out], with the Add of a constant [out] after it.
  void matmul(::onnx::NodeProto const& n) {
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

  void pad(::onnx::NodeProto const& n) {
    std::vector<std::int64_t> p = ints_attr(n, "pads", {});
    if (n.input_size() > 1 && !n.input(1).empty()) {
      auto const* t = index_.constant(n.input(1));
      if (!t)
        fail(n, "its pads must be a constant");
      p = ints_of(*t);
    }
    for (auto v : p)
      if (v != 0)
        fail(n, "only a Pad of zero width is supported (put padding in the Conv or pool)");
    alias(n, n.input(0));
  }

  // An ints attribute of \p dims entries, each >= \p least.
  std::vector<std::size_t> extents(::onnx::NodeProto const& n, char const* name, int dims,
                                   std::int64_t def, std::int64_t least = 1) {
    auto const v = ints_attr(n, name, std::vector<std::int64_t>(std::size_t(dims), def));
    bool ok = v.size() == std::size_t(dims);
    for (auto e : v)
      ok = ok && e >= least;
    if (!ok)
      fail(n, std::string("attribute ") + name + " must have " + std::to_string(dims) +
                  " entries >= " + std::to_string(least) + " (one per spatial axis)");
    return std::vector<std::size_t>(v.begin(), v.end());
  }
  // Symmetric padding per spatial axis from pads or auto_pad, or a refusal
  // naming the attribute (Telar's layers pad both sides of an axis equally).
  std::vector<std::size_t> pads(::onnx::NodeProto const& n, Shape const& in,
                                std::vector<std::size_t> const& k,
                                std::vector<std::size_t> const& stride,
                                std::vector<std::size_t> const& dil, bool transposed) {
    int const dims = int(k.size());
    std::string const ap = string_attr(n, "auto_pad", "NOTSET");
    std::vector<std::size_t> p(k.size(), 0);
    if (ap == "VALID")
      return p;
    if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
      if (transposed)
        fail(n, "attribute auto_pad = " + ap + " is not supported on ConvTranspose (give pads)");
      for (int d = 0; d < dims; ++d) {
        std::size_t const x = in[std::size_t(d + 1)], s = stride[std::size_t(d)];
        std::size_t const out = (x + s - 1) / s;
        std::size_t const span = (k[std::size_t(d)] - 1) * dil[std::size_t(d)] + 1;
        std::size_t const total = (out - 1) * s + span > x ? (out - 1) * s + span - x : 0;
        if (total % 2 != 0)
          fail(n, "attribute auto_pad = " + ap + " pads spatial axis " + std::to_string(d) +
                      " by " + std::to_string(total) +
                      " in all, one more on one side: asymmetric padding is not supported "
                      "(Telar's layers pad both sides equally)");
        p[std::size_t(d)] = total / 2;
      }
      return p;
    }
    if (ap != "NOTSET")
      fail(n, "attribute auto_pad = '" + ap +
                  "' is not valid (NOTSET, SAME_UPPER, SAME_LOWER, "
                  "VALID)");
    auto const v = ints_attr(n, "pads", std::vector<std::int64_t>(std::size_t(2 * dims), 0));
    if (v.size() != std::size_t(2 * dims))
      fail(n, "attribute pads must have " + std::to_string(2 * dims) + " entries");
    for (int d = 0; d < dims; ++d) {
      auto const b = v[std::size_t(d)], e = v[std::size_t(d + dims)];
      if (b < 0 || b != e)
        fail(n, "attribute pads: asymmetric padding (" + std::to_string(b) + " before, " +
                    std::to_string(e) + " after spatial axis " + std::to_string(d) +
                    ") is not supported (Telar's layers pad both sides equally)");
      p[std::size_t(d)] = std::size_t(b);
    }
    return p;
  }
  template <std::size_t D>
  static std::array<std::size_t, D> arr(std::vector<std::size_t> const& v) {
    std::array<std::size_t, D> a{};
    std::copy(v.begin(), v.end(), a.begin());
    return a;
  }

  struct ConvAttrs {
    int dims = 2;
    std::size_t groups = 1, volume = 1;
    std::vector<std::size_t> k, stride, dil, pad;
  };
  ConvAttrs conv_attrs(::onnx::NodeProto const& n, ::onnx::TensorProto const& w, bool transposed) {
    ConvAttrs a;
    a.dims = w.dims_size() - 2;
    if (a.dims == 1)
      fail(n, "1-D convolutions (weight '" + w.name() +
                  "' of rank 3) are not supported: Telar has 2-D and 3-D layers (a [C, 1, L] "
                  "input with a 1 x k kernel is the same)");
    if (a.dims != 2 && a.dims != 3)
      fail(n, "its weight '" + w.name() + "' has rank " + std::to_string(w.dims_size()) +
                  "; 2-D and 3-D convolutions are supported");
    std::int64_t const g = int_attr(n, "group", 1);
    if (g < 1)
      fail(n, "attribute group = " + std::to_string(g) + " must be positive");
    a.groups = std::size_t(g);
    for (int d = 0; d < a.dims; ++d)
      a.k.push_back(std::size_t(w.dims(d + 2)));
    for (auto e : a.k)
      a.volume *= e;
    if (find_attr(n, "kernel_shape") && extents(n, "kernel_shape", a.dims, 1) != a.k)
      fail(n, "attribute kernel_shape does not match weight '" + w.name() + "'");
    a.stride = extents(n, "strides", a.dims, 1);
    a.dil = extents(n, "dilations", a.dims, 1);
    Shape const& s = shape_of(n.input(0));
    if (s.rank != a.dims + 1)
      fail(n, "a " + std::to_string(a.dims) + "-D convolution needs inputs [C, " +
                  (a.dims == 2 ? "H, W" : "D, H, W") + "], got " + s.str());
    a.pad = pads(n, s, a.k, a.stride, a.dil, transposed);
    return a;
  }

  void conv(::onnx::NodeProto const& n) {
    auto const& w = initializer(n, 1, "weight");
    ConvAttrs const a = conv_attrs(n, w, false);
    std::size_t const out = std::size_t(w.dims(0)), in = std::size_t(w.dims(1)) * a.groups;
    if (shape_of(n.input(0))[0] != in)
      fail(n, "weight '" + w.name() + "' takes " + std::to_string(in) + " channels (group " +
                  std::to_string(a.groups) + "); the input is " + shape_of(n.input(0)).str());
    bool const bias = n.input_size() > 2 && !n.input(2).empty();
    bind(n, 1, "weight", "weight", false, out, in / a.groups * a.volume);
    if (bias)
      bind(n, 2, "bias", "bias", false, out, 1);
    if (a.dims == 2)
      return emit(n,
                  Conv2D<T, M>(in, out, arr<2>(a.k), arr<2>(a.stride), arr<2>(a.pad), bias,
                               arr<2>(a.dil), a.groups),
                  n.input(0));
    emit(n,
         Conv3D<T, M>(in, out, arr<3>(a.k), arr<3>(a.stride), arr<3>(a.pad), bias, arr<3>(a.dil),
                      a.groups),
         n.input(0));
  }

  void conv_transpose(::onnx::NodeProto const& n) {
    auto const& w = initializer(n, 1, "weight");
    ConvAttrs const a = conv_attrs(n, w, true);
    if (find_attr(n, "output_shape"))
      fail(n, "attribute output_shape is not supported (give pads and output_padding, as "
              "PyTorch exports)");
    auto const opad = extents(n, "output_padding", a.dims, 0, 0);
    std::size_t const in = std::size_t(w.dims(0)), out = std::size_t(w.dims(1)) * a.groups;
    if (shape_of(n.input(0))[0] != in)
      fail(n, "weight '" + w.name() + "' takes " + std::to_string(in) + " channels; the input is " +
                  shape_of(n.input(0)).str());
    bool const bias = n.input_size() > 2 && !n.input(2).empty();
    bind(n, 1, "weight", "weight", false, in, out / a.groups * a.volume);
    if (bias)
      bind(n, 2, "bias", "bias", false, out, 1);
    if (a.dims == 2)
      return emit(n,
                  ConvTranspose2D<T, M>(in, out, arr<2>(a.k), arr<2>(a.stride), arr<2>(a.pad),
                                        arr<2>(opad), bias, arr<2>(a.dil), a.groups),
                  n.input(0));
    emit(n,
         ConvTranspose3D<T, M>(in, out, arr<3>(a.k), arr<3>(a.stride), arr<3>(a.pad), arr<3>(opad),
                               bias, arr<3>(a.dil), a.groups),
         n.input(0));
  }

  // Scale and bias are parameters; the running mean and variance buffers,
  // trained as PyTorch does (batch statistics in training mode).
  void batch_norm(::onnx::NodeProto const& n) {
    if (n.input_size() != 5)
      fail(n, "needs 5 inputs (X, scale, B, input_mean, input_var)");
    for (int o = 1; o < n.output_size(); ++o)
      if (!n.output(o).empty() && !index_.readers(n.output(o)).empty())
        fail(n, "its output '" + n.output(o) +
                    "' (running statistics) is read by another node; Telar keeps them in the "
                    "layer (export with training=TrainingMode.EVAL or PRESERVE)");
    Shape const& s = shape_of(n.input(0));
    std::size_t const c = s[0];
    double const eps = double(float_attr(n, "epsilon", 1e-5f));
    double const momentum = 1.0 - double(float_attr(n, "momentum", 0.9f)); // ONNX: of the old
    bind(n, 1, "scale", "weight", false, c, 1);
    bind(n, 2, "bias", "bias", false, c, 1);
    bind(n, 3, "running mean", "running_mean", false, c, 1, true);
    bind(n, 4, "running variance", "running_var", false, c, 1, true);
    emit(n, BatchNorm<T, M, SyncStats>(c, eps, momentum), n.input(0));
  }

  void pool(::onnx::NodeProto const& n) {
    bool const max = n.op_type() == "MaxPool";
    int const dims = int(ints_attr(n, "kernel_shape", {}).size());
    if (dims != 2 && dims != 3)
      fail(n, "attribute kernel_shape has " + std::to_string(dims) +
                  " entries: 2-D and 3-D pooling are supported");
    Shape const& in = shape_of(n.input(0));
    std::vector<std::size_t> const ones(std::size_t(dims), 1);
    auto const k = extents(n, "kernel_shape", dims, 1), s = extents(n, "strides", dims, 1);
    auto const p = pads(n, in, k, s, ones, false);
    auto same = [](std::vector<std::size_t> const& v) {
      return std::all_of(v.begin(), v.end(), [&](std::size_t e) { return e == v[0]; });
    };
    if (!same(k) || !same(s) || !same(p))
      fail(n, "attributes kernel_shape, strides and pads must be equal along every axis "
              "(Telar's pools are square or cubic)");
    if (2 * p[0] > k[0])
      fail(n, "attribute pads: " + std::to_string(p[0]) + " is more than half the window " +
                  std::to_string(k[0]) + " (as PyTorch, Telar's pools pad at most kernel / 2)");
    if (max && extents(n, "dilations", dims, 1) != ones)
      fail(n, "attribute dilations is not supported (only 1)");
    if (max && int_attr(n, "storage_order", 0) != 0)
      fail(n, "attribute storage_order = 1 is not supported");
    if (n.output_size() > 1 && !n.output(1).empty())
      fail(n, "its second output (Indices) is not supported");
    bool const ceil = int_attr(n, "ceil_mode", 0) != 0;
    if (ceil) // PyTorch drops a last window that starts in the right padding; ONNX keeps it
      for (int d = 0; d < dims; ++d) {
        std::size_t const x = in[std::size_t(d + 1)];
        if (x + 2 * p[0] < k[0])
          break; // output_shape refuses it
        std::size_t const o = (x + 2 * p[0] - k[0] + s[0] - 1) / s[0] + 1;
        if ((o - 1) * s[0] >= x + p[0])
          fail(n, "attribute ceil_mode = 1 with a last window that starts in the padding is "
                  "not supported (PyTorch drops that window, ONNX keeps it)");
      }
    bool const count_pad = int_attr(n, "count_include_pad", 0) != 0;
    if (dims == 2) {
      if (max)
        return emit(n, MaxPool2D<T, M>(k[0], s[0], p[0], ceil), n.input(0));
      return emit(n, AvgPool2D<T, M>(k[0], s[0], p[0], ceil, count_pad), n.input(0));
    }
    if (max)
      return emit(n, MaxPool3D<T, M>(k[0], s[0], p[0], ceil), n.input(0));
    emit(n, AvgPool3D<T, M>(k[0], s[0], p[0], ceil, count_pad), n.input(0));
  }

  // --- Tensors whose batch axis moved (see layout.hpp) and shape arithmetic.

  static bool layout_aware(std::string const& op) {
    static std::set<std::string> const ops{
        "Relu",    "Sigmoid",     "Tanh",      "Gelu",      "Clip",     "LeakyRelu",
        "Elu",     "HardSigmoid", "HardSwish", "Dropout",   "Identity", "Transpose",
        "Reshape", "MatMul",      "Gemm",      "Add",       "Sub",      "Mul",
        "Div",     "Softmax",     "Slice",     "ReduceMean"};
    return ops.count(op) > 0;
  }
  // The logical axes of tensor \p t: the first name along its alias chain
  // that has a layout, else [batch, stored axes...].
  Layout layout_of(std::string t) const {
    for (;;) {
      if (auto const l = layouts_.find(t); l != layouts_.end())
        return l->second;
      auto const a = alias_.find(t);
      if (a == alias_.end())
        return plain_layout(shapes_.at(t).rank);
      t = a->second;
    }
  }
  std::string logical_str(std::string const& t) const {
    return dims_str(logical_dims(layout_of(t), shape_of(t)));
  }
  // Output \p out of node \p n: the same stored tensor as \p in, read through \p l.
  void view(::onnx::NodeProto const& n, std::string const& in, Layout l) {
    alias(n, in);
    layouts_[n.output(0)] = std::move(l);
  }
  // Emits \p layer reading \p in into a fresh tensor whose logical axes are \p l.
  template <class L>
  std::string emit_moved(::onnx::NodeProto const& n, L layer, std::string const& in, Layout l,
                         char const* tag) {
    std::string const out = n.output(0) + "#" + tag + std::to_string(nodes_.size());
    emit(n, std::move(layer), in, out);
    layouts_[out] = std::move(l);
    return out;
  }
  // Stores \p x as materialize() says (a Transpose, then a Reshape, each
  // only when needed); later readers of \p x read the result.
  void arrange(::onnx::NodeProto const& n, std::string const& x) {
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
  void plain(::onnx::NodeProto const& n, std::string const& x, std::string const& reader = {}) {
    if (layout_of(x) == plain_layout(shape_of(x).rank))
      return;
    arrange(n, x);
    Layout const l = layout_of(x);
    if (l != plain_layout(shape_of(x).rank))
      fail(n, "tensor '" + x + "' has the logical shape " + logical_str(x) +
                  " with the batch not alone at axis 0; " +
                  (reader.empty() ? n.op_type() : reader) +
                  " needs [batch, ...] (only Transpose, Reshape, Slice, MatMul, Softmax, "
                  "ReduceMean and element-wise nodes read a moved batch)");
  }
  // \p x's last logical axis in place as its last stored axis (Dense,
  // LayerNorm), arranging it if not.
  void last_axis_in_place(::onnx::NodeProto const& n, std::string const& x) {
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
  int stored_axis(::onnx::NodeProto const& n, std::string const& x, std::size_t axis) {
    if (single_atom(layout_of(x), axis) < 0)
      arrange(n, x);
    return single_atom(layout_of(x), axis);
  }
  // Logical axis \p a of \p x (ONNX's negative axes allowed).
  std::size_t logical_axis(::onnx::NodeProto const& n, std::string const& x, std::int64_t a) {
    std::int64_t const r = std::int64_t(layout_of(x).groups.size());
    if (a < -r || a >= r)
      fail(n, "axis " + std::to_string(a) + " is outside [" + std::to_string(-r) + ", " +
                  std::to_string(r) + ") for the logical shape " + logical_str(x));
    return std::size_t(a < 0 ? a + r : a);
  }

  // Folds \p n when it is shape arithmetic: a Shape of a tensor, or a node
  // whose inputs are all integer constants or folded. False otherwise.
  bool fold(::onnx::NodeProto const& n) {
    if (n.op_type() == "Shape") {
      if (!shapes_.count(resolve(n.input(0))) || find_attr(n, "start") || find_attr(n, "end"))
        fail(n, "only a Shape (no start, end) of a tensor computed from the input folds");
      folded_[n.output(0)].v = logical_dims(layout_of(n.input(0)), shape_of(n.input(0)));
      return true;
    }
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
  // A folded value or an int64 constant.
  std::optional<Folded> folded(std::string const& t) const {
    if (auto const f = folded_.find(t); f != folded_.end())
      return f->second;
    auto const* c = index_.constant(t);
    if (!c || c->data_type() != ::onnx::TensorProto::INT64)
      return std::nullopt;
    return folded_ints(ints_of(*c), c->dims_size() == 0);
  }
  std::vector<Sym> folded_input(::onnx::NodeProto const& n, int i, char const* what) {
    auto const f = i < n.input_size() ? folded(n.input(i)) : std::nullopt;
    if (!f)
      fail(n, std::string("its ") + what + " (input " + std::to_string(i) +
                  ") must be a constant, or computed from shapes and constants");
    return f->v;
  }
  std::vector<std::int64_t> constant_ints(::onnx::NodeProto const& n, int i, char const* what) {
    try {
      return constants_of(Folded{false, folded_input(n, i, what)}, what);
    } catch (std::string const& why) {
      fail(n, why);
    }
  }

  void transpose(::onnx::NodeProto const& n) {
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

  // The target shape with ONNX's 0 (copy the input's extent) and -1 (infer).
  std::vector<Sym> reshape_target(::onnx::NodeProto const& n) {
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
  void reshape(::onnx::NodeProto const& n) {
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

  void slice(::onnx::NodeProto const& n) {
    std::string const x = n.input(0);
    if (opset_ < 10)
      fail(n, "Slice before opset 10 (attributes) is not supported");
    auto const b = constant_ints(n, 1, "starts"), e = constant_ints(n, 2, "ends");
    auto const axes = n.input_size() > 3 && !n.input(3).empty() ? constant_ints(n, 3, "axes")
                                                                : std::vector<std::int64_t>{0};
    bool const unit = n.input_size() <= 4 || n.input(4).empty() ||
                      constant_ints(n, 4, "steps") == std::vector<std::int64_t>{1};
    if (b.size() != 1 || e.size() != 1 || axes.size() != 1 || !unit)
      fail(n, "only a Slice of one axis with step 1 is supported");
    std::size_t const a = logical_axis(n, x, axes[0]);
    int const d = stored_axis(n, x, a);
    if (d < 0)
      fail(n, "slices axis " + std::to_string(axes[0]) + " of the logical shape " + logical_str(x) +
                  ", which holds the batch");
    std::int64_t const len = std::int64_t(shape_of(x)[d]);
    auto clamp = [&](std::int64_t v) {
      return std::size_t(std::min(len, std::max<std::int64_t>(0, v < 0 ? v + len : v)));
    };
    std::size_t const lo = clamp(b[0]), hi = clamp(e[0]);
    if (lo >= hi)
      fail(n, "the slice [" + std::to_string(b[0]) + ", " + std::to_string(e[0]) + ") of axis " +
                  std::to_string(axes[0]) + " is empty");
    emit(n, Rearrange<T, M>::slice(shape_of(x), d, lo, hi), x);
  }

  // Softmax over a logical axis of a tensor whose batch moved: over the
  // stored axis it is (never the loss's softmax: the output is [batch, ...]).
  void moved_softmax(::onnx::NodeProto const& n, std::int64_t def) {
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
  void batched_matmul(::onnx::NodeProto const& n) {
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
  Layout same_layouts(::onnx::NodeProto const& n) {
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
  void gather(::onnx::NodeProto const& n) {
    auto const* w = index_.constant(n.input(0));
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
  bool positional(::onnx::NodeProto const& n) {
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

  // Where(condition, a, b) with a constant boolean condition, one branch a
  // constant scalar and the other a tensor: masked_fill by a constant mask
  // (a causal mask), telar::MaskedFill. The mask covers the sample's last
  // axes and repeats over the others.
  void where(::onnx::NodeProto const& n) {
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
      std::string dims;
      for (auto e : c->dims())
        dims += (dims.empty() ? "" : ", ") + std::to_string(e);
      fail(n, "its condition '" + n.input(0) + "' [" + dims +
                  "] does not match the last axes of the tensor '" + x + "' " + s.str() +
                  " per sample (a mask over the batch is not supported)");
    }
    std::vector<bool> mask = bools_of(*c);
    if (t == 1) // the tensor where the condition holds: fill where it does not
      mask.flip();
    emit(n, MaskedFill<T, M>(s, mask, T(v)), x);
  }

  // Mul or Div of a tensor by a constant scalar: telar::Scale.
  bool scale(::onnx::NodeProto const& n) {
    std::string const& op = n.op_type();
    if ((op != "Mul" && op != "Div") || n.input_size() != 2)
      return false;
    int const c = index_.is_constant(n.input(1)) ? 1 : op == "Mul" ? 0 : -1;
    if (c < 0 || !index_.is_constant(n.input(c)) || index_.is_constant(n.input(1 - c)))
      return false;
    float const v = index_.scalar(n.input(c));
    if (std::isnan(v) || (op == "Div" && v == 0.f))
      fail(n, op + " by the constant '" + n.input(c) +
                  "' is supported only for one nonzero float32 value (a Scale)");
    emit(n, Scale<T, M>(op == "Div" ? T(1) / T(v) : T(v)), n.input(1 - c));
    return true;
  }

  // ReduceMean over axes that are not the batch: the kept axes to the
  // front, then GlobalAvgPool over [kept, reduced] (Rearranges as needed).
  void reduce_mean(::onnx::NodeProto const& n) {
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
      t = emit_moved(n, Rearrange<T, M>::reshape(shape_of(t), Shape{kept, over}), t,
                     plain_layout(2), "R");
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
  void layer_norm_pattern(::onnx::NodeProto const& r1) {
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
  void layer_norm(::onnx::NodeProto const& n, NormMatch const& m) {
    last_axis_in_place(n, m.x);
    std::size_t const d = shape_of(m.x).back();
    bind(*m.mul, 1, "weight", "weight", false, d, 1);
    bind(*m.bias, 1, "bias", "bias", false, d, 1);
    emit(n, LayerNorm<T, M>(d, double(m.eps)), m.x);
  }
  // The graph output stored as [batch, ...].
  void output_in_place() {
    for (auto const& n : g_.node())
      if (n.output_size() > 0 && n.output(0) == plan_.output_name &&
          shapes_.count(resolve(n.output(0))))
        plain(n, n.output(0), "the graph output");
  }

  // SiLU as PyTorch 1.13 exports nn.SiLU: Sigmoid(x) read only by a Mul by x.
  void silu_pattern(::onnx::NodeProto const& n) {
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
  void gelu_pattern(std::string const& x, std::vector<::onnx::NodeProto const*> const& rs) {
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

  // Every node must lead to the output (its parameters would get no gradient).
  void check_reach(std::string const& out) const {
    std::set<std::string> needed{out};
    for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it) {
      if (!needed.count(it->output))
        fail(it->label + ": its result '" + it->output + "' does not reach the graph output '" +
             plan_.output_name + "'");
      needed.insert(it->inputs.begin(), it->inputs.end());
    }
  }

  // A layer that alone reads the only live tensor joins the chain; every run
  // of other nodes becomes one DynamicGraph from the live tensor before it
  // to the one after it.
  void place(std::string const& out) {
    std::map<std::string, std::size_t> left; // readers not yet placed
    for (auto const& nd : nodes_)
      for (auto const& in : nd.inputs)
        ++left[in];
    std::set<std::string> live{plan_.input_name};
    std::vector<std::size_t> run;
    std::string run_in;
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      Ir& nd = nodes_[i];
      bool const chain = nd.kind == Ir::layer && live.size() == 1 &&
                         *live.begin() == nd.inputs[0] && left[nd.inputs[0]] == 1;
      if (chain) {
        flush(run, run_in, nd.inputs[0]);
        place_layer(nd, "", std::move(*nd.op));
      } else {
        if (run.empty())
          run_in = *live.begin();
        run.push_back(i);
      }
      for (auto const& in : nd.inputs)
        if (--left[in] == 0)
          live.erase(in);
      if (left[nd.output] > 0 || nd.output == out)
        live.insert(nd.output);
    }
    flush(run, run_in, out);
  }
  template <class L>
  void place_layer(Ir& nd, std::string const& prefix, L&& layer) {
    for (auto b : nd.bindings) {
      b.layer = plan_.layers.size();
      b.param = prefix + b.param;
      plan_.bindings.push_back(std::move(b));
    }
    std::visit([&](auto& l) { plan_.layers.push_back(std::move(l)); }, layer);
  }
  void flush(std::vector<std::size_t>& run, std::string const& in, std::string const& out) {
    if (run.empty())
      return;
    DynamicGraph<NodeLayer<T, M>> g(in);
    for (std::size_t i : run) {
      Ir& nd = nodes_[i];
      if (nd.kind == Ir::layer)
        g.add(nd.name, std::move(*nd.op), nd.inputs[0], nd.output);
      else if (nd.kind == Ir::add)
        g.add_add(nd.name, nd.inputs, nd.output);
      else if (nd.kind == Ir::concat)
        g.add_concat(nd.name, nd.inputs, nd.output);
      else if (nd.kind == Ir::matmul)
        g.add_matmul(nd.name, nd.inputs, nd.output);
      else
        g.add_mul(nd.name, nd.inputs, nd.output);
      for (auto b : nd.bindings) {
        b.layer = plan_.layers.size();
        b.param = nd.name + "." + b.param;
        plan_.bindings.push_back(std::move(b));
      }
    }
    g.set_output(out);
    plan_.layers.push_back(std::move(g));
    run.clear();
  }

  ::onnx::ModelProto const& m_;
  ::onnx::GraphProto const& g_;
  GraphIndex index_;
  std::string path_;
  std::int64_t opset_ = 13; // of the default domain
  GraphPlan<T, M> plan_;
  std::map<std::string, Shape> shapes_;                  // per-sample shape by (resolved) tensor
  bool ids_input_ = false;                               // the input is token ids (find_ends)
  std::map<std::string, std::string> alias_;             // outputs of nodes that map to nothing
  std::set<::onnx::NodeProto const*> skip_;              // inner nodes of a recognised pattern
  std::map<::onnx::NodeProto const*, std::string> gelu_; // last node of a GELU -> its input
  std::map<::onnx::NodeProto const*, std::string> silu_; // the Mul of a SiLU -> its input
  std::map<std::string, std::string> bound_by_;          // initializer -> the node using it
  std::map<std::string, Layout> layouts_; // logical axes of a tensor whose batch moved (by name)
  std::map<std::string, Folded> folded_;  // integer tensors of shape arithmetic
  std::map<::onnx::NodeProto const*, NormMatch> norm_; // last Add of a LayerNorm -> its parts
  std::set<std::string> names_;
  std::vector<ParameterBinding> pending_; // of the node being mapped
  std::vector<Ir> nodes_;
};

} // namespace telar::onnx::detail
