#pragma once
// The graph walk of telar::onnx::import_model and import_graph: every node
// (or recognised pattern) mapped onto a built-in layer or a join, then
// chains kept as chains and the rest placed in DynamicGraph layers (or,
// for import_graph, everything in one graph). Shape arithmetic is folded
// (fold.hpp, import_fold.hpp), tensors whose batch moved are tracked
// (layout.hpp); what the model does with the plan is in start_values.hpp.
// GraphReader's members for each operator family are defined in
// import_elementwise.hpp, import_conv.hpp, import_shape.hpp,
// import_fold.hpp, import_attention.hpp and import_place.hpp (included at
// the end of this file).
#include <telar/core/dynamic_graph.hpp>
#include <telar/core/dynamic_sequential.hpp>
#include <telar/core/shape.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/batch_norm.hpp>
#include <telar/layers/bias.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/conv_transpose.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/dropout.hpp>
#include <telar/layers/embedding.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/layers/masked_fill.hpp>
#include <telar/layers/multiplier.hpp>
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

// Opsets 7 and 8 differ from 9 in the supported operators only by Upsample's
// scales attribute and BatchNormalization's spatial; 19 to 21 by
// AveragePool's dilations and Gelu (20), read as such.
inline constexpr int min_opset = 7, max_opset = 21;

inline char const* supported_ops() {
  return "Gemm, MatMul (+ Add of a bias), Relu, Gelu (or the Div/Erf/Add/Mul pattern), Sigmoid, "
         "Tanh, Clip, LeakyRelu, Elu, HardSigmoid, HardSwish, SiLU (Sigmoid and Mul of one "
         "tensor), Exp, Sqrt, Erf, Pow by a constant scalar, Conv (1-D, 2-D, 3-D, grouped), "
         "ConvTranspose, BatchNormalization, MaxPool and AveragePool (2-D, 3-D), "
         "GlobalAveragePool, GlobalMaxPool, Resize and Upsample (nearest by integer factors, "
         "linear), Flatten, Add, Mul, Sub, Div (per channel or per sample broadcast) and Concat of"
         " tensors, Add/Sub of a constant broadcast over each sample (a trained Bias), Pad of "
         "zeros, Identity, Dropout, Softmax over an axis after the batch, Softmax/LogSoftmax over "
         "the last axis as the last node, Transpose, Reshape, Slice and Split (static shapes, step"
         " 1, any axes but the batch; the batch may move), Unsqueeze, Squeeze, Gather of one "
         "constant index along an axis but the batch, MatMul of two tensors (batched), Mul/Div by "
         "a constant scalar (a Scale) or by a constant broadcast over each sample (a trained "
         "Multiplier), ReduceMean, LayerNormalization (over trailing axes of a sample), and its "
         "ReduceMean/Sub/Pow/Sqrt/Div form, Gather of a constant table by integer token ids (an "
         "embedding), Add of a constant [seq, hidden] (a learned positional embedding), Where with"
         " a constant mask and a constant scalar (masked_fill), Equal of constants and Cast to "
         "bool (folded), and shape arithmetic (Shape, Gather, Unsqueeze, Concat, Cast, Mod, ...; "
         "float32 Sqrt, Div, ... of shape values) folded";
}

// One node of the file once mapped, before it is placed in the model: a
// layer or a join, the tensors it reads and writes, and where its
// parameters come from (names local to the layer).
template <class T, class M>
struct IrNode {
  enum Kind { layer, add, concat, mul, matmul, sub, div };
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
  // \p who: the function messages name (import_model, import_graph).
  GraphReader(::onnx::ModelProto const& m, std::string path, std::string who)
      : m_(m), g_(m.graph()), index_(m.graph()), path_(std::move(path)), who_(std::move(who)) {}

  // \p one_graph: every node in one DynamicGraph (the plan's only layer),
  // for telar::GraphChain; else chains and runs as place() says.
  GraphPlan<T, M> read(bool one_graph = false) {
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
    if (one_graph)
      place_all(out);
    else
      place(out);
    if (plan_.layers.empty()) // e.g. one Identity, Dropout or Softmax node
      fail("the graph maps to no layer (nothing Telar could train): its nodes are only "
           "Identity, inactive Dropout or a final Softmax");
    return std::move(plan_);
  }

private:
  using Ir = IrNode<T, M>;

  [[noreturn]] void fail(std::string const& what) const {
    throw OnnxError(who_ + ": '" + path_ + "': " + what);
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
    if (op == "Unsqueeze")
      return unsqueeze(n);
    if (op == "Squeeze")
      return squeeze(n);
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
    if (op == "Exp" || op == "Sqrt" || op == "Erf" || op == "Pow")
      return math_function(n);
    if (op == "Split")
      return split(n);
    if (op == "LayerNormalization")
      return layer_normalization(n);
    if (op == "Equal")
      fail(n, "Equal is supported only of two constants (a mask computed at import, for a "
              "Where); here an input is computed from the graph input");
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
    ParameterBinding b{0, param, key, transpose, rows, cols, buffer};
    auto const v = floats_of(t);
    std::vector<T> s(v.size());
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c)
        s[r * cols + c] = T(transpose ? v[c * rows + r] : v[r * cols + c]);
    plan_.start[key] = std::move(s);
    pending_.push_back(std::move(b));
  }

  struct ConvAttrs {
    int dims = 2;
    std::size_t groups = 1, volume = 1;
    std::vector<std::size_t> k, stride, dil, pad;
  };

  // Defined per operator family, in the files named.
  // import_elementwise.hpp: joins, Softmax, Clip, Dropout, Scale, Where; SiLU, GELU
  void join(::onnx::NodeProto const& n);
  void softmax(::onnx::NodeProto const& n);
  void clip(::onnx::NodeProto const& n);
  void dropout(::onnx::NodeProto const& n);
  void where(::onnx::NodeProto const& n);
  void math_function(::onnx::NodeProto const& n);
  bool scale(::onnx::NodeProto const& n);
  bool multiplier(::onnx::NodeProto const& n, int c, bool trained);
  bool bias(::onnx::NodeProto const& n);
  Shape bias_table(::onnx::NodeProto const& n, int c, Shape const& s);
  template <class Make>
  void table_layer(::onnx::NodeProto const& n, int c, char const* param, bool trained,
                   Make const& make);
  Shape elementwise_shape(::onnx::NodeProto const& n, std::vector<Shape> const& in) const;
  void silu_pattern(::onnx::NodeProto const& n);
  void gelu_pattern(std::string const& x, std::vector<::onnx::NodeProto const*> const& rs);

  // import_conv.hpp: convolutions, pooling, padding, BatchNormalization, Resize
  void resize(::onnx::NodeProto const& n);
  void pad(::onnx::NodeProto const& n);
  std::vector<std::size_t> extents(::onnx::NodeProto const& n, char const* name, int dims,
                                   std::int64_t def, std::int64_t least = 1);
  std::vector<std::size_t> pads(::onnx::NodeProto const& n, Shape const& in,
                                std::vector<std::size_t> const& k,
                                std::vector<std::size_t> const& stride,
                                std::vector<std::size_t> const& dil, bool transposed);
  template <std::size_t D>
  static std::array<std::size_t, D> arr(std::vector<std::size_t> const& v);
  ConvAttrs conv_attrs(::onnx::NodeProto const& n, ::onnx::TensorProto const& w, bool transposed);
  void conv(::onnx::NodeProto const& n);
  void conv_transpose(::onnx::NodeProto const& n);
  void batch_norm(::onnx::NodeProto const& n);
  void pool(::onnx::NodeProto const& n);

  // import_fold.hpp: shape arithmetic, float32 shape values and masks folded into literals
  bool fold(::onnx::NodeProto const& n);
  bool fold_float(::onnx::NodeProto const& n);
  bool fold_mask(::onnx::NodeProto const& n);
  ::onnx::TensorProto& computed_literal(std::string const& name, int type);
  std::optional<Folded> folded(std::string const& t) const;
  std::vector<Sym> folded_input(::onnx::NodeProto const& n, int i, char const* what);
  std::vector<std::int64_t> constant_ints(::onnx::NodeProto const& n, int i, char const* what);

  // import_shape.hpp: moved batches (views, Rearranges), Transpose, Reshape, Slice, Split
  static bool layout_aware(std::string const& op);
  Layout layout_of(std::string t) const;
  std::string logical_str(std::string const& t) const;
  void view(::onnx::NodeProto const& n, std::string const& in, Layout l);
  template <class L>
  std::string emit_moved(::onnx::NodeProto const& n, L layer, std::string const& in, Layout l,
                         char const* tag);
  void arrange(::onnx::NodeProto const& n, std::string const& x);
  void plain(::onnx::NodeProto const& n, std::string const& x, std::string const& reader = {});
  void last_axis_in_place(::onnx::NodeProto const& n, std::string const& x);
  int stored_axis(::onnx::NodeProto const& n, std::string const& x, std::size_t axis);
  std::size_t logical_axis(::onnx::NodeProto const& n, std::string const& x, std::int64_t a);
  std::string view_input(::onnx::NodeProto const& n);
  void unsqueeze(::onnx::NodeProto const& n);
  void squeeze(::onnx::NodeProto const& n);
  Layout drop_axis(::onnx::NodeProto const& n, std::string const& x, Layout l, std::size_t axis);
  void gather_axis(::onnx::NodeProto const& n);
  void transpose(::onnx::NodeProto const& n);
  std::vector<Sym> reshape_target(::onnx::NodeProto const& n);
  void reshape(::onnx::NodeProto const& n);
  void slice(::onnx::NodeProto const& n);
  void split(::onnx::NodeProto const& n);
  Rearrange<T, M> slice_of(::onnx::NodeProto const& n, std::string const& x, std::int64_t axis,
                           std::int64_t b, std::int64_t e);

  // import_attention.hpp: Gemm, MatMul, embeddings, ReduceMean, the LayerNorm pattern
  // embeddings,...
  void gemm(::onnx::NodeProto const& n);
  void matmul(::onnx::NodeProto const& n);
  void moved_softmax(::onnx::NodeProto const& n, std::int64_t def);
  void batched_matmul(::onnx::NodeProto const& n);
  Layout same_layouts(::onnx::NodeProto const& n);
  void gather(::onnx::NodeProto const& n);
  bool positional(::onnx::NodeProto const& n);
  void reduce_mean(::onnx::NodeProto const& n);
  void layer_norm_pattern(::onnx::NodeProto const& r1);
  void layer_norm(::onnx::NodeProto const& n, NormMatch const& m);
  void layer_normalization(::onnx::NodeProto const& n);

  // import_place.hpp: placing the mapped nodes: chains and DynamicGraph runs
  void output_in_place();
  void check_reach(std::string const& out) const;
  void place(std::string const& out);
  void place_all(std::string const& out);
  template <class L>
  void place_layer(Ir& nd, std::string const& prefix, L&& layer);
  void flush(std::vector<std::size_t>& run, std::string const& in, std::string const& out);

  ::onnx::ModelProto const& m_;
  ::onnx::GraphProto const& g_;
  GraphIndex index_;
  std::string path_;
  std::string who_;         // telar::onnx::import_model or import_graph, for messages
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
  // float32 values of shape arithmetic, boolean masks of Equal
  std::map<std::string, ::onnx::TensorProto> computed_;
  std::map<::onnx::NodeProto const*, NormMatch> norm_; // last Add of a LayerNorm -> its parts
  std::set<std::string> names_;
  std::vector<ParameterBinding> pending_; // of the node being mapped
  std::vector<Ir> nodes_;
};

} // namespace telar::onnx::detail

// GraphReader's members per operator family.
#include <telar/onnx/detail/import_attention.hpp>
#include <telar/onnx/detail/import_conv.hpp>
#include <telar/onnx/detail/import_elementwise.hpp>
#include <telar/onnx/detail/import_fold.hpp>
#include <telar/onnx/detail/import_place.hpp>
#include <telar/onnx/detail/import_shape.hpp>
