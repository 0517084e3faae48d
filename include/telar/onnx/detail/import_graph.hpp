#pragma once
// The graph walk of telar::onnx::import_model: from the graph input to its
// output, one node (or one recognised pattern) at a time, each mapped onto a
// built-in layer; and the starting values each layer loads after initialize.
#include <telar/core/dynamic_sequential.hpp>
#include <telar/core/shape.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/dropout.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/onnx/detail/proto.hpp>
#include <telar/onnx/error.hpp>
#include <telar/onnx/model.hpp>
#include <telar/parallel/detail/stage_runner.hpp>
#include <telar/parallel/tensor_parallel.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace telar::onnx::detail {

inline constexpr int min_opset = 9, max_opset = 18;

inline char const* supported_ops() {
  return "Gemm, MatMul (+ Add of a bias), Relu, Gelu (or the Div/Erf/Add/Mul pattern), Sigmoid, "
         "Tanh, Conv, MaxPool, AveragePool, GlobalAveragePool, Flatten, Reshape to [batch, "
         "features], Pad of zeros, Identity, Dropout, Softmax/LogSoftmax over the last axis as "
         "the last node";
}

template <class T, class M>
struct ChainPlan {
  std::vector<Layer<T, M>> layers;
  Shape input_shape;
  std::string input_name, output_name, output_activation;
  std::vector<ParameterBinding> bindings;
  std::map<std::string, std::vector<T>> start;
};

template <class T, class M>
class ChainReader {
public:
  ChainReader(::onnx::ModelProto const& m, std::string path)
      : m_(m), g_(m.graph()), index_(m.graph()), path_(std::move(path)) {}

  ChainPlan<T, M> read() {
    check_opset();
    find_ends();
    std::string cur = plan_.input_name;
    shape_ = plan_.input_shape;
    while (cur != plan_.output_name)
      cur = step(cur);
    check_all_used();
    if (plan_.layers.empty()) // e.g. one Identity, Dropout or Softmax node
      fail("the graph maps to no layer (nothing Telar could train): its nodes are only "
           "Identity, inactive Dropout or a final Softmax");
    return std::move(plan_);
  }

private:
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
    if (tt.elem_type() != ::onnx::TensorProto::FLOAT)
      fail("input '" + in.name() + "' has data type " + data_type_name(tt.elem_type()) +
           "; Telar imports float32 (FLOAT) models (export the model in float32)");
    int const rank = tt.shape().dim_size();
    if (rank < 2 || rank > 4)
      fail("input '" + in.name() + "' has rank " + std::to_string(rank) +
           "; Telar takes [batch, features], [batch, C, L] or [batch, C, H, W]");
    std::vector<std::size_t> dims;
    for (int d = 1; d < rank; ++d) {
      auto const& dim = tt.shape().dim(d);
      if (!dim.has_dim_value() || dim.dim_value() <= 0)
        fail("dimension " + std::to_string(d) + " of input '" + in.name() + "' is dynamic ('" +
             dim.dim_param() + "'); only the batch dimension (0) may be");
      dims.push_back(std::size_t(dim.dim_value()));
    }
    plan_.input_shape = dims.size() == 1   ? Shape{dims[0]}
                        : dims.size() == 2 ? Shape{dims[0], dims[1]}
                                           : Shape{dims[0], dims[1], dims[2]};
  }

  // The one node reading `cur` (several readers: a GELU pattern or a refusal).
  std::string step(std::string const& cur) {
    auto const& rs = index_.readers(cur);
    if (rs.empty())
      fail("tensor '" + cur + "' is not used by any node and is not the graph output '" +
           plan_.output_name + "'");
    if (rs.size() == 2) {
      std::string out;
      if (gelu_pattern(cur, rs, out))
        return out;
      for (int i = 0; i < 2; ++i)
        if (is_residual_add(*rs[i], cur))
          return residual(cur, *rs[i], *rs[1 - i]);
    }
    if (rs.size() != 1) {
      std::string who;
      for (auto const* n : rs)
        who += (who.empty() ? "" : ", ") + node_label(*n);
      bool const residual = std::any_of(rs.begin(), rs.end(), [&](auto const* n) {
        return n->op_type() == "Add" && !index_.is_constant(n->input(0)) &&
               !index_.is_constant(n->input(1));
      });
      fail("the graph is not a chain: tensor '" + cur + "' feeds " + who +
           (residual ? " (a residual Add of a branch onto its input; residual connections are not "
                       "supported yet)"
                     : "") +
           "; Telar imports chains where each activation feeds the next node only");
    }
    auto const& n = *rs[0];
    used_.insert(&n);
    if (!n.domain().empty() && n.domain() != "ai.onnx")
      fail(n,
           "operator domain '" + n.domain() + "' is not supported; supported: " + supported_ops());
    if (n.input(0) != cur)
      fail(n, "the activation '" + cur + "' must be the first input");
    return map_node(n);
  }

  bool is_residual_add(::onnx::NodeProto const& n, std::string const& cur) const {
    return n.op_type() == "Add" && n.input_size() == 2 && !index_.is_constant(n.input(0)) &&
           !index_.is_constant(n.input(1)) && (n.input(0) == cur) != (n.input(1) == cur);
  }

  // cur -> branch (from `first`) -> Add(branch, cur): a DynamicResidual whose
  // body is the branch, its parameters named "<k>.<name>" by body layer.
  std::string residual(std::string const& cur, ::onnx::NodeProto const& add,
                       ::onnx::NodeProto const& first) {
    std::string const end = add.input(0) == cur ? add.input(1) : add.input(0);
    auto outer = std::move(plan_.layers);
    plan_.layers.clear();
    std::size_t const first_binding = plan_.bindings.size();
    Shape const in = shape_;
    used_.insert(&first);
    if (first.input(0) != cur)
      fail(first, "the activation '" + cur + "' must be the first input");
    std::string t = map_node(first);
    while (t != end)
      t = step(t);
    if (shape_ != in)
      fail(add, "the residual branch maps " + in.str() + " to " + shape_.str() +
                    "; only identity shortcuts (same shape) are supported");
    using Branch = BranchLayer<T, M>;
    DynamicSequential<Branch> body;
    for (auto& l : plan_.layers)
      std::visit(
          [&](auto& layer) {
            using L = std::decay_t<decltype(layer)>;
            if constexpr (telar::detail::variant_index<L, Branch>::found)
              body.push_back(std::move(layer));
            else
              fail(add, std::string("a ") + L::name() +
                            " inside a residual branch is not supported (nested residual "
                            "connections or tensor-parallel layers)");
          },
          l);
    if (body.layer_count() == 0)
      fail(add, "adds an activation to itself; a residual branch needs at least one layer");
    for (std::size_t b = first_binding; b < plan_.bindings.size(); ++b) {
      auto& binding = plan_.bindings[b];
      binding.param = std::to_string(binding.layer) + "." + binding.param;
      binding.layer = outer.size();
    }
    plan_.layers = std::move(outer);
    plan_.layers.push_back(DynamicResidual<Branch>(std::move(body)));
    used_.insert(&add);
    return add.output(0);
  }

  std::string map_node(::onnx::NodeProto const& n) {
    std::string const& op = n.op_type();
    if (op == "Gemm")
      return gemm(n);
    if (op == "MatMul")
      return matmul(n);
    if (op == "Relu")
      return add(n, ReLU<T, M>{});
    if (op == "Sigmoid")
      return add(n, Sigmoid<T, M>{});
    if (op == "Tanh")
      return add(n, Tanh<T, M>{});
    if (op == "Gelu") {
      if (string_attr(n, "approximate", "none") != "none")
        fail(n, "only the exact (erf) GELU is supported");
      return add(n, GELU<T, M>{});
    }
    if (op == "Flatten") {
      if (axis_of(n, 1, shape_.rank + 1) != 1)
        fail(n, "axis " + std::to_string(int_attr(n, "axis", 1)) +
                    " is not supported (only the axis after the batch: 1, or -" +
                    std::to_string(shape_.rank) + ")");
      return add(n, Flatten<T, M>{});
    }
    if (op == "Reshape")
      return reshape(n);
    if (op == "Conv")
      return conv(n);
    if (op == "MaxPool" || op == "AveragePool")
      return pool(n);
    if (op == "GlobalAveragePool")
      return add(n, GlobalAvgPool<T, M>{});
    if (op == "Identity")
      return n.output(0);
    if (op == "Dropout")
      return dropout(n);
    if (op == "Pad")
      return pad(n);
    if (op == "Softmax" || op == "LogSoftmax") {
      if (n.output(0) != plan_.output_name)
        fail(n, op + " is supported only as the graph's last node (the loss's input)");
      // Before opset 13 the default axis is 1 and the input is flattened from
      // it; either way the loss's softmax is over the last axis only.
      std::size_t const rank = shape_.rank + 1;
      if (axis_of(n, opset_ < 13 ? 1 : -1, rank) != std::int64_t(rank) - 1)
        fail(n, "axis " + std::to_string(int_attr(n, "axis", opset_ < 13 ? 1 : -1)) +
                    " of an output of rank " + std::to_string(rank) +
                    " is not supported (the loss applies softmax over the last axis, " +
                    std::to_string(rank - 1) + " or -1)");
      plan_.output_activation = op;
      return n.output(0);
    }
    if (op == "BatchNormalization")
      fail(n, "BatchNormalization is not supported: torch.onnx.export in eval mode (the default "
              "TrainingMode.EVAL) folds a BatchNorm that follows a Conv into the Conv; fold this "
              "one into the layer before it yourself, or remove it");
    if (op == "Add")
      fail(n, "an Add that is not the bias of a MatMul is not supported (residual connections "
              "are not supported yet)");
    fail(n, "operator " + op + " is not supported; supported: " + supported_ops());
  }

  // Opset 12+: ratio and training_mode are inputs 1 and 2 (constants);
  // earlier: a ratio attribute, and the node is inactive in inference. An
  // active dropout trains as telar::Dropout; an inactive one is the identity.
  std::string dropout(::onnx::NodeProto const& n) {
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
      return n.output(0);
    if (!(ratio >= 0.f && ratio < 1.f))
      fail(n, "its ratio must be a constant in [0, 1)");
    return add(n, Dropout<T, M>(double(ratio)));
  }

  template <class L>
  std::string add(::onnx::NodeProto const& n, L layer) {
    try {
      shape_ = layer.output_shape(shape_);
    } catch (ShapeError const& e) {
      fail(n, std::string("cannot take input ") + shape_.str() + ": " + e.what());
    }
    plan_.layers.push_back(std::move(layer));
    return n.output(0);
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

  void bind(std::string const& param, ::onnx::TensorProto const& t, bool transpose,
            std::size_t rows, std::size_t cols) {
    ParameterBinding b;
    b.layer = plan_.layers.size();
    b.param = param;
    b.initializer = t.name();
    b.transpose = transpose;
    b.rows = rows;
    b.cols = cols;
    auto const v = floats_of(t);
    std::vector<T> s(v.size());
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < cols; ++j)
        s[i * cols + j] = T(transpose ? v[j * rows + i] : v[i * cols + j]);
    plan_.start[t.name()] = std::move(s);
    plan_.bindings.push_back(std::move(b));
  }

  void need_flat(::onnx::NodeProto const& n) {
    if (shape_.rank != 1)
      fail(n, "needs flat samples [batch, features], got per-sample shape " + shape_.str() +
                  " (add a Flatten before it)");
  }

  std::string gemm(::onnx::NodeProto const& n) {
    need_flat(n);
    if (float_attr(n, "alpha", 1.f) != 1.f || float_attr(n, "beta", 1.f) != 1.f ||
        int_attr(n, "transA", 0) != 0)
      fail(n, "only alpha = 1, beta = 1, transA = 0 are supported (PyTorch's nn.Linear)");
    bool const tb = int_attr(n, "transB", 0) != 0;
    auto const& w = initializer(n, 1, "weight");
    if (w.dims_size() != 2)
      fail(n, "its weight must be a matrix");
    std::size_t const out = std::size_t(tb ? w.dims(0) : w.dims(1));
    std::size_t const in = std::size_t(tb ? w.dims(1) : w.dims(0));
    if (in != shape_[0])
      fail(n, "weight '" + w.name() + "' takes " + std::to_string(in) +
                  " features, the input has " + std::to_string(shape_[0]));
    bool const bias = n.input_size() > 2 && !n.input(2).empty();
    bind("weight", w, !tb, out, in);
    if (bias) {
      auto const& b = initializer(n, 2, "bias");
      std::size_t size = 1;
      for (auto d : b.dims())
        size *= std::size_t(d);
      if (size != out)
        fail(n, "bias '" + b.name() + "' must hold one value per output (" + std::to_string(out) +
                    ")");
      bind("bias", b, false, out, 1);
    }
    return add(n, Dense<T, M>(in, out, bias));
  }

  // MatMul by a constant [in, out], with the Add of a constant [out] after it.
  std::string matmul(::onnx::NodeProto const& n) {
    auto const& w = initializer(n, 1, "weight");
    if (w.dims_size() != 2)
      fail(n, "its second input must be a constant matrix [in, out]");
    std::size_t const in = std::size_t(w.dims(0)), out = std::size_t(w.dims(1));
    if (shape_.back() != in)
      fail(n, "weight '" + w.name() + "' takes " + std::to_string(in) + " features, the input " +
                  shape_.str() + " has " + std::to_string(shape_.back()));
    bind("weight", w, true, out, in);
    std::string result = n.output(0);
    auto const& rs = index_.readers(result);
    bool bias = false;
    if (rs.size() == 1 && rs[0]->op_type() == "Add") {
      auto const& a = *rs[0];
      int const other = a.input(0) == result ? 1 : 0;
      auto const* b = index_.constant(a.input(other));
      if (b && b->data_type() == ::onnx::TensorProto::FLOAT && b->dims_size() == 1 &&
          std::size_t(b->dims(0)) == out) {
        bind("bias", *b, false, out, 1);
        used_.insert(&a);
        bias = true;
        result = a.output(0);
      }
    }
    add(n, Dense<T, M>(in, out, bias));
    return result;
  }

  std::string reshape(::onnx::NodeProto const& n) {
    auto const* s = n.input_size() > 1 ? index_.constant(n.input(1)) : nullptr;
    if (!s)
      fail(n, "its shape must be a constant");
    auto const v = ints_of(*s);
    bool const ok = v.size() == 2 && (v[0] == 0 || v[0] == -1) &&
                    (v[1] == -1 || std::size_t(v[1]) == shape_.size()) &&
                    !(v[0] == -1 && v[1] == -1);
    if (!ok)
      fail(n, "only a reshape to [batch, features] (a flatten) is supported");
    return add(n, Flatten<T, M>{});
  }

  std::string pad(::onnx::NodeProto const& n) {
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
    return n.output(0);
  }

  // [t, l, b, r] with t == b and l == r, or fail.
  std::array<std::size_t, 2> symmetric_pads(::onnx::NodeProto const& n) {
    if (string_attr(n, "auto_pad", "NOTSET") != "NOTSET")
      fail(n, "auto_pad is not supported (give explicit pads)");
    auto const p = ints_attr(n, "pads", {0, 0, 0, 0});
    if (p.size() != 4 || p[0] != p[2] || p[1] != p[3] || p[0] < 0 || p[1] < 0)
      fail(n, "only symmetric pads are supported");
    return {std::size_t(p[0]), std::size_t(p[1])};
  }
  std::array<std::size_t, 2> pair_attr(::onnx::NodeProto const& n, char const* name,
                                       std::int64_t def) {
    auto const v = ints_attr(n, name, {def, def});
    if (v.size() != 2 || v[0] < 1 || v[1] < 1)
      fail(n, std::string(name) + " must have two positive entries (2-D only)");
    return {std::size_t(v[0]), std::size_t(v[1])};
  }

  std::string conv(::onnx::NodeProto const& n) {
    if (int_attr(n, "group", 1) != 1)
      fail(n, "grouped convolutions (group " + std::to_string(int_attr(n, "group", 1)) +
                  ") are not supported");
    auto const& w = initializer(n, 1, "weight");
    if (w.dims_size() != 4)
      fail(n, "only 2-D convolutions (weight [out, in, kh, kw]) are supported");
    if (shape_.rank != 3 || shape_[0] != std::size_t(w.dims(1)))
      fail(n, "weight '" + w.name() + "' takes " + std::to_string(w.dims(1)) +
                  " channels; the input is " + shape_.str());
    std::size_t const out = std::size_t(w.dims(0)), in = std::size_t(w.dims(1));
    std::array<std::size_t, 2> const k{std::size_t(w.dims(2)), std::size_t(w.dims(3))};
    auto const stride = pair_attr(n, "strides", 1), dil = pair_attr(n, "dilations", 1);
    auto const pads = symmetric_pads(n);
    bool const bias = n.input_size() > 2 && !n.input(2).empty();
    bind("weight", w, false, out, in * k[0] * k[1]);
    if (bias)
      bind("bias", initializer(n, 2, "bias"), false, out, 1);
    return add(n, Conv2D<T, M>(in, out, k, stride, pads, bias, dil));
  }

  std::string pool(::onnx::NodeProto const& n) {
    bool const max = n.op_type() == "MaxPool";
    auto const k = pair_attr(n, "kernel_shape", 1), s = pair_attr(n, "strides", 1);
    auto const p = symmetric_pads(n);
    if (k[0] != k[1] || s[0] != s[1] || p[0] != p[1])
      fail(n, "only square windows with equal strides and pads are supported");
    if (int_attr(n, "ceil_mode", 0) != 0)
      fail(n, "ceil_mode = 1 is not supported");
    if (max && (pair_attr(n, "dilations", 1) != std::array<std::size_t, 2>{1, 1} ||
                int_attr(n, "storage_order", 0) != 0))
      fail(n, "dilations and storage_order are not supported");
    if (!max && p[0] > 0 && int_attr(n, "count_include_pad", 0) == 0)
      fail(n, "padding with count_include_pad = 0 is not supported (Telar counts padding)");
    if (max)
      return add(n, MaxPool2D<T, M>(k[0], s[0], p[0]));
    return add(n, AvgPool2D<T, M>(k[0], s[0], p[0]));
  }

  // PyTorch's exact GELU: 0.5 * (x * (1 + erf(x / sqrt 2))).
  bool gelu_pattern(std::string const& x, std::vector<::onnx::NodeProto const*> const& rs,
                    std::string& out) {
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
      return false;
    auto const* erf = single(div->output(0), "Erf");
    auto const* one = erf ? single(erf->output(0), "Add") : nullptr;
    if (!one || index_.scalar(other(*one, erf->output(0))) != 1.f)
      return false;
    if (index_.readers(one->output(0)).size() != 1 || index_.readers(one->output(0))[0] != mul ||
        other(*mul, one->output(0)) != x)
      return false;
    auto const* half = single(mul->output(0), "Mul");
    if (!half || index_.scalar(other(*half, mul->output(0))) != 0.5f)
      return false;
    for (auto const* n : {div, erf, one, mul, half})
      used_.insert(n);
    shape_ = GELU<T, M>{}.output_shape(shape_);
    plan_.layers.push_back(GELU<T, M>{});
    out = half->output(0);
    return true;
  }

  void check_all_used() const {
    for (auto const& n : g_.node())
      if (n.op_type() != "Constant" && !used_.count(&n) && !index_.aliases.count(&n))
        fail(n, "is not on the chain from input '" + plan_.input_name + "' to output '" +
                    plan_.output_name + "'; Telar imports chains");
  }

  ::onnx::ModelProto const& m_;
  ::onnx::GraphProto const& g_;
  GraphIndex index_;
  std::string path_;
  std::int64_t opset_ = 13; // of the default domain
  ChainPlan<T, M> plan_;
  Shape shape_;
  std::set<::onnx::NodeProto const*> used_;
};

// Dense, element-wise, Dense runs become Megatron pairs (the activation acts
// on the column-parallel shard, as in telar::ColumnParallel's docs).
template <class Layers>
void make_tensor_parallel_pairs(Layers& layers) {
  auto dense = [&](std::size_t k) { return k < layers.size() && layers[k].index() == 0; };
  auto elementwise = [&](std::size_t k) { // ReLU, GELU, Sigmoid, Tanh in telar::onnx::Layer
    return k < layers.size() && layers[k].index() >= 3 && layers[k].index() <= 6;
  };
  for (std::size_t k = 0; k + 2 < layers.size(); ++k)
    if (dense(k) && elementwise(k + 1) && dense(k + 2)) {
      using D = std::variant_alternative_t<0, std::decay_t<decltype(layers[k])>>;
      using T = typename D::value_type;
      using M = typename D::memory_space;
      auto const& a = std::get<0>(layers[k]);
      auto const& b = std::get<0>(layers[k + 2]);
      layers[k] = ColumnParallel<Dense<T, M>>(a.in_features(), a.out_features(), a.has_bias());
      layers[k + 2] = RowParallel<Dense<T, M>>(b.in_features(), b.out_features(), b.has_bias());
      k += 2;
    }
}

// The block of a full [rows, cols] parameter a layer holds: first row and
// column, extents, and whether other tensor-parallel ranks hold the same values.
struct Block {
  std::size_t row0 = 0, col0 = 0, rows = 0, cols = 0;
  bool replicated = false;
};
template <class L> // a layer outside a tensor-parallel pair: every tp rank has it all
Block block_of(L const&, std::string const&, std::size_t rows, std::size_t cols) {
  return {0, 0, rows, cols, true};
}
template <class T, class M>
Block block_of(ColumnParallel<Dense<T, M>> const& l, std::string const&, std::size_t,
               std::size_t cols) {
  return {l.shard_begin(), 0, l.shard_size(), cols, false};
}
template <class T, class M>
Block block_of(RowParallel<Dense<T, M>> const& l, std::string const& param, std::size_t rows,
               std::size_t cols) {
  if (param == "bias")
    return {0, 0, rows, cols, true};
  return {0, l.shard_begin(), rows, l.shard_size(), false};
}

// Copies this layer's block of a full host tensor into its value view.
template <class V, class T>
void load_block(V const& v, std::vector<T> const& full, std::size_t cols, Block const& b) {
  auto h = Kokkos::create_mirror_view(v);
  if constexpr (V::rank == 1) {
    for (std::size_t i = 0; i < h.extent(0); ++i)
      h(i) = full[b.row0 + i];
  } else {
    for (std::size_t i = 0; i < h.extent(0); ++i)
      for (std::size_t j = 0; j < h.extent(1); ++j)
        h(i, j) = full[(b.row0 + i) * cols + b.col0 + j];
  }
  Kokkos::deep_copy(v, h);
}

// DynamicSequential's initializer hook: after a layer draws its values,
// overwrite them with the file's (this rank's block of them).
template <class T, class M>
struct StartValues {
  std::vector<ParameterBinding> bindings;
  std::shared_ptr<std::map<std::string, std::vector<T>>> start;

  template <class Variant>
  void operator()(std::size_t k, Variant& layer) const {
    std::visit(
        [&](auto& l) {
          using L = std::decay_t<decltype(l)>;
          if constexpr (layer_traits<L>::has_parameters)
            l.parameters([&](char const* name, auto& value, auto&) {
              for (auto const& b : bindings)
                if (b.layer == k && b.param == name)
                  load_block(value, start->at(b.initializer), b.cols,
                             block_of(l, name, b.rows, b.cols));
            });
        },
        layer);
  }
};

template <class Model, class X>
auto run_forward(Model& model, X const& x) {
  using T = typename Model::value_type;
  using MS = typename Model::memory_space;
  std::vector<std::size_t> const features = model.feature_sizes(model.built_shapes().at(0));
  telar::detail::StageRunner<Model> runner(&model, 0, model.layer_count(), features);
  int const slot = runner.acquire(x.extent(0));
  typename Model::execution_space exec;
  runner.forward(exec, slot, ConstMatrix<T, MS>(x));
  exec.fence();
  Matrix<T, MS> y("telar::onnx::predict", x.extent(0), features.back());
  Kokkos::deep_copy(y, runner.output(slot));
  return y;
}

} // namespace telar::onnx::detail
