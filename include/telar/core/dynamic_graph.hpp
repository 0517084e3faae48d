#pragma once
/*! \file
 *  \brief telar::DynamicGraph: a network known only at run time as a directed
 *  acyclic graph of named layers and joins over named tensors, itself a
 *  layer, so it trains as one unit of a telar::Sequential or
 *  telar::DynamicSequential under every strategy. */
#include <telar/core/detail/counter_rng.hpp>
#include <telar/core/detail/graph_joins.hpp>
#include <telar/core/detail/graph_topology.hpp>
#include <telar/core/detail/join.hpp>
#include <telar/core/detail/layer_walk.hpp>
#include <telar/core/dynamic_sequential.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/recompute.hpp>
#include <telar/core/residual.hpp>
#include <telar/core/sequential.hpp>
#include <telar/core/shape.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace telar {

namespace detail {

// Every alternative of a layer variant is checked as a Sequential's layers are.
template <class V>
struct check_variant_layers;
template <class... Ls>
struct check_variant_layers<std::variant<Ls...>> {
  static constexpr bool value = (check_layer<Ls>() && ...);
};

} // namespace detail

template <class Variant>
class GraphChain;
namespace detail {
template <class Variant>
class GraphUnit;
} // namespace detail

/*! \brief A directed acyclic graph of layers chosen at run time (each one of
 *  the alternatives of \p Variant) and joins, over named tensors.
 *
 *  The graph reads one input tensor and writes one output tensor. A tensor
 *  may feed several nodes (its gradient is the sum over them). Join nodes
 *  take several tensors: Add (sum, equal shapes), Concat (along the first
 *  per-sample dimension, the channels), Mul, Sub and Div (element-wise, or
 *  per channel: [C] or [C, 1, 1] against [C, H, W], or per sample: [1])
 *  and MatMul (batched: [P..., M, K] x [P..., K, N] per sample). The graph
 *  is checked when it is first used (validate(), output_shape(), build()):
 *  a cycle, a tensor read but never produced, a tensor produced twice, a
 *  node whose result reaches nothing and joins of mismatched shapes are
 *  each a telar::Error naming the nodes and tensors.
 *
 *  A graph is a layer: put it in a telar::Sequential (or DynamicSequential)
 *  to train it; pipeline stages then split at its boundary. To cut stages
 *  inside it (between its nodes, every tensor crossing a cut sent along),
 *  train it as a telar::GraphChain (graph_chain.hpp). Its parameters
 *  are named "<node>.<name>", as PyTorch names a module's attributes.
 *  \code
 *  using Layer = std::variant<telar::Dense<float>, telar::ReLU<float>>;
 *  telar::DynamicGraph<Layer> g("x");                    // the input tensor
 *  g.add("fc1", telar::Dense<float>(16, 16), "x", "h1");
 *  g.add("act", telar::ReLU<float>{}, "h1", "h2");
 *  g.add("fc2", telar::Dense<float>(16, 16), "x", "h3");  // x feeds two nodes
 *  g.add_add("sum", {"h2", "h3"}, "y");
 *  g.set_output("y");
 *  telar::Sequential<telar::DynamicGraph<Layer>, telar::Dense<float>> model(
 *      std::move(g), telar::Dense<float>(16, 10));
 *  \endcode
 *  \tparam Variant a std::variant of layer types sharing value_type and memory_space
 */
template <class Variant>
class DynamicGraph : public detail::LayerWalk<DynamicGraph<Variant>>,
                     public detail::TensorParallelNames<DynamicGraph<Variant>> {
  // The pipeline's view (graph_chain.hpp) runs the nodes one at a time.
  friend class GraphChain<Variant>;
  friend class detail::GraphUnit<Variant>;
  friend class detail::LayerWalk<DynamicGraph>;
  friend class detail::TensorParallelNames<DynamicGraph>;
  template <class>
  friend class DynamicGraph; // the converting constructor reads another variant's graph
  static_assert(detail::check_variant_layers<Variant>::value);
  using First = std::variant_alternative_t<0, Variant>;
  using Op = detail::GraphOp;

public:
  /*! \brief The layer variant. */
  using layer_variant = Variant;
  /*! \brief Scalar type. */
  using value_type = typename layer_traits<First>::value_type;
  /*! \brief Memory space of parameters and activations. */
  using memory_space = typename layer_traits<First>::memory_space;
  /*! \brief backward_weight reuses the inner gradients of backward_input:
   *  run together, the input part goes first. */
  static constexpr bool backward_input_first = true;
  /*! \brief Called after node \p name's initialize(seed) (e.g. to load its
   *  starting values from a file): f(name, layer). */
  using initializer = std::function<void(std::string const&, Variant&)>;

  /*! \brief What one micro-batch keeps: every node's saved state, every
   *  inner tensor and its gradient, and one scratch buffer for gradients of
   *  tensors read by several nodes. */
  struct saved_type {
    mutable detail::DynamicSaved<Variant> inner;                //!< node i's state at i
    ConstMatrix<value_type, memory_space> input;                //!< the graph input (a view)
    std::vector<Matrix<value_type, memory_space>> act;          //!< act[t]: inner tensor t
    mutable std::vector<Matrix<value_type, memory_space>> grad; //!< grad[t]: dL/d act[t]
    mutable Matrix<value_type, memory_space> scratch; //!< one contribution before it is added
    mutable bool grads_ready = false;    //!< backward_input ran since the last backward_weight
    std::uint64_t token = 0;             //!< which forward this is (recompute(): whose values)
    std::vector<std::uint64_t> counters; //!< recomputed nodes' random counters at forward
  };

  /*! \brief An empty graph. \param input name of the input tensor */
  explicit DynamicGraph(std::string input = "input") { topo_.set_input(std::move(input)); }
  /*! \brief Graph \p g (nodes, tensors, recomputed range, shapes) over
   *  another layer variant, each layer node's layer \p convert(layer): what
   *  telar::Precision's rebind makes of a graph. No initializer hook: \p g's
   *  takes its own variant (the rebind converts it too).
   *  \param g the graph \param convert maps a V2 const& to a Variant */
  template <class V2, class Convert>
  DynamicGraph(DynamicGraph<V2> const& g, Convert&& convert)
      : topo_(g.topo_), shapes_(g.shapes_), recomputed_(g.recomputed_) {
    for (auto const& l : g.layers_)
      layers_.push_back(l ? std::optional<Variant>(convert(*l)) : std::nullopt);
  }

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "DynamicGraph"; }

  /*! \brief Adds a layer node. \param node its name (unique) \param layer any
   *  alternative of Variant \param input the tensor it reads \param output the
   *  tensor it writes \return the node's index \throws Error on a repeated name */
  std::size_t add(std::string node, Variant layer, std::string input, std::string output) {
    topo_.add(std::move(node), Op::layer, {std::move(input)}, std::move(output));
    layers_.emplace_back(std::move(layer));
    return layers_.size() - 1;
  }
  /*! \brief Adds output = the sum of \p inputs: equal shapes, or of two
   *  inputs one broadcast as add_mul (one value per channel or per sample;
   *  its gradient the sum of the output's over the positions it reaches).
   *  \param node its name \param inputs two tensors or more \param output the tensor it writes
   *  \return the node's index */
  std::size_t add_add(std::string node, std::vector<std::string> inputs, std::string output) {
    return add_join(std::move(node), Op::add, std::move(inputs), std::move(output));
  }
  /*! \brief Adds output = \p inputs concatenated along the first per-sample
   *  dimension (channels; features for rank 1). \param node its name
   *  \param inputs two tensors or more \param output the tensor it writes
   *  \return the node's index */
  std::size_t add_concat(std::string node, std::vector<std::string> inputs, std::string output) {
    return add_join(std::move(node), Op::concat, std::move(inputs), std::move(output));
  }
  /*! \brief Adds output = the element-wise product of two tensors, one of
   *  which may hold one value per channel ([C] or [C, 1, 1] against
   *  [C, ...], as a squeeze-and-excitation gate). \param node its name
   *  \param inputs two tensors \param output the tensor it writes \return the node's index */
  std::size_t add_mul(std::string node, std::vector<std::string> inputs, std::string output) {
    return add_join(std::move(node), Op::mul, std::move(inputs), std::move(output));
  }
  /*! \brief Adds output = inputs[0] - inputs[1], broadcast as add_mul.
   *  \param node its name \param inputs two tensors \param output the tensor
   *  it writes \return the node's index */
  std::size_t add_sub(std::string node, std::vector<std::string> inputs, std::string output) {
    return add_join(std::move(node), Op::sub, std::move(inputs), std::move(output));
  }
  /*! \brief Adds output = inputs[0] / inputs[1], broadcast as add_mul (no
   *  check for zeros: IEEE division). \param node its name \param inputs two
   *  tensors \param output the tensor it writes \return the node's index */
  std::size_t add_div(std::string node, std::vector<std::string> inputs, std::string output) {
    return add_join(std::move(node), Op::div, std::move(inputs), std::move(output));
  }
  /*! \brief Adds output = the batched matrix product of two tensors,
   *  [P..., M, K] x [P..., K, N] -> [P..., M, N] per sample (attention's
   *  Q K^T and weights x V). \param node its name \param inputs two tensors
   *  \param output the tensor it writes \return the node's index */
  std::size_t add_matmul(std::string node, std::vector<std::string> inputs, std::string output) {
    return add_join(std::move(node), Op::matmul, std::move(inputs), std::move(output));
  }
  /*! \brief Names the graph's output tensor. \param output a node's output tensor */
  void set_output(std::string output) { topo_.set_output(std::move(output)); }
  /*! \brief Name of the input tensor. */
  std::string const& input_name() const { return topo_.input(); }
  /*! \brief Name of the output tensor. */
  std::string const& output_name() const { return topo_.output(); }
  /*! \brief Number of nodes, layers and joins. */
  std::size_t node_count() const { return layers_.size(); }
  /*! \brief Names of the nodes, in the order they were added. */
  std::vector<std::string> node_names() const {
    std::vector<std::string> names;
    for (auto const& n : topo_.nodes())
      names.push_back(n.name);
    return names;
  }
  /*! \brief The layer of node \p node. \param node a layer node's name
   *  \throws Error if there is no such layer node */
  Variant& layer(std::string const& node) { return *layers_[layer_index(node)]; }
  /*! \brief The layer of node \p node. \param node a layer node's name */
  Variant const& layer(std::string const& node) const { return *layers_[layer_index(node)]; }
  /*! \brief Names of the nodes in the order they run (a topological order,
   *  fixed once: ready nodes in the order they were added).
   *  \throws Error if the graph is not valid */
  std::vector<std::string> execution_order() const {
    std::vector<std::string> names;
    for (std::size_t i : topology().order())
      names.push_back(topo_.nodes()[i].name);
    return names;
  }
  /*! \brief Checks the structure (see the class description); shapes are
   *  checked by output_shape() and build(). \throws Error naming the fault */
  void validate() const { topology(); }

  /*! \brief Recomputes nodes \p first to \p last (a range of
   *  execution_order()) in backward rather than keeping their outputs: the
   *  outputs go to buffers shared by every micro-batch (workspace_bytes()),
   *  and before a micro-batch's backward those nodes run forward again from
   *  the tensors kept, their random counters as at its forward (dropout
   *  masks repeat; BatchNorm updates its running statistics once).
   *  saved_bytes() drops each such tensor (its gradient stays). For a graph
   *  trained as one layer (telar::GraphChain refuses it).
   *  \param first first node \param last last node (it may be \p first)
   *  \throws Error if the two do not name such a range */
  void recompute(std::string const& first, std::string const& last) {
    auto const& order = topology().order();
    auto const at = [&](std::string const& name) {
      return std::find_if(order.begin(), order.end(),
                          [&](std::size_t i) { return topo_.nodes()[i].name == name; });
    };
    auto const a = at(first), b = at(last);
    if (a == order.end() || b == order.end() || b < a) {
      std::string names;
      for (std::string const& n : execution_order())
        names += (names.empty() ? "'" : ", '") + n + "'";
      throw Error("telar::DynamicGraph::recompute: '" + first + "' to '" + last +
                  "' is not a range of the execution order (" + names + ")");
    }
    recomputed_.assign(layers_.size(), false);
    for (auto it = a; it != b + 1; ++it)
      recomputed_[*it] = true;
  }
  /*! \brief Whether some nodes are recomputed (recompute()). */
  bool recomputes() const {
    return std::find(recomputed_.begin(), recomputed_.end(), true) != recomputed_.end();
  }

  /*! \brief Runs \p f(name, layer) after each node's initialize (starting
   *  values). \param f the hook */
  void set_initializer(initializer f) { init_ = std::move(f); }
  /*! \brief The initializer hook (empty if none). */
  initializer const& initializer_hook() const { return init_; }

  /*! \brief Calls f(node index, layer) for each layer node, in the order they
   *  were added, with the concrete layer type (joins are skipped).
   *  \param f the visitor */
  template <class F>
  void for_each_layer(F&& f) {
    for (std::size_t i = 0; i < layers_.size(); ++i)
      if (layers_[i])
        std::visit([&](auto& l) { f(i, l); }, *layers_[i]);
  }
  /*! \brief Const overload. \param f the visitor */
  template <class F>
  void for_each_layer(F&& f) const {
    for (std::size_t i = 0; i < layers_.size(); ++i)
      if (layers_[i])
        std::visit([&](auto const& l) { f(i, l); }, *layers_[i]);
  }

  /*! \brief Per-sample shape of every tensor, by name, for input \p in.
   *  \param in the input shape \throws ShapeError naming the first node that
   *  cannot take its inputs, Error if the graph is not valid */
  std::vector<std::pair<std::string, Shape>> tensor_shapes(Shape const& in) const {
    auto const s = shapes(in);
    std::vector<std::pair<std::string, Shape>> named;
    for (std::size_t t = 0; t < s.size(); ++t)
      named.emplace_back(topo_.tensor_name(t), s[t]);
    return named;
  }
  /*! \brief The output tensor's shape (the Layer concept). \param in input shape */
  Shape output_shape(Shape const& in) const { return shapes(in)[topology().output_id()]; }
  /*! \brief Checks the graph for input \p in and tells every layer with a
   *  build() hook its input shape. \param in per-sample input shape */
  void build(Shape const& in) {
    shapes_ = shapes(in);
    detail::build_layers(*this, layer_inputs(shapes_));
  }

  /*! \brief Cost estimate: the layers' plus one operation per element a join
   *  writes. \param samples rows \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    auto const s = shapes(in);
    double total = 0;
    for (auto const& n : topo_.nodes())
      if (n.op != Op::layer)
        total += double(samples) * double(s[n.out_id].size());
    return detail::layers_flops(*this, samples, layer_inputs(s), total);
  }
  /*! \brief Bytes one micro-batch keeps: every inner tensor (neither the
   *  input nor the output) and its gradient, the scratch buffer, and every
   *  layer node's own saved state. \param samples rows \param in input shape */
  std::size_t saved_bytes(std::size_t samples, Shape const& in) const {
    auto const s = shapes(in);
    auto const matrix = [&](std::size_t cols) {
      return detail::view_bytes<value_type>(samples * cols); // each buffer as allocated
    };
    std::size_t bytes = matrix(scratch_width(s));
    for (std::size_t t = 1; t < s.size(); ++t)
      if (t != topo_.output_id())
        bytes += (dropped(t) ? 1 : 2) * matrix(s[t].size());
    return bytes + detail::layers_saved_bytes(*this, samples, layer_inputs(s));
  }

  /*! \brief Bytes shared by every micro-batch: every layer node's own
   *  workspace (a convolution's im2col columns) and the outputs of the
   *  recomputed nodes (recompute(); none without). \param samples rows
   *  \param in input shape */
  std::size_t workspace_bytes(std::size_t samples, Shape const& in) const {
    auto const s = shapes(in);
    std::size_t bytes = 0;
    for (std::size_t t = 1; t < s.size(); ++t)
      bytes += recomputed(t) ? detail::view_bytes<value_type>(samples * s[t].size()) : 0;
    return bytes + detail::layers_workspace_bytes(*this, samples, layer_inputs(s));
  }

  /*! \brief Draws every layer node's parameters, node i from its own stream
   *  (detail::mix_seed(seed, i)), then calls the initializer hook if set.
   *  \param seed stream seed */
  void initialize(std::uint64_t seed) {
    for_each_layer(
        [&](std::size_t i, auto& l) { detail::initialize_layer(l, detail::mix_seed(seed, i)); });
    for (std::size_t i = 0; i < layers_.size();
         ++i) // after the visit: the hook may replace a layer
      if (init_ && layers_[i])
        init_(topo_.nodes()[i].name, *layers_[i]);
  }
  using detail::TensorParallelNames<DynamicGraph>::set_tensor_parallel;

  /*! \brief Runs the nodes in topological order; every inner tensor stays in
   *  \p saved for backward. \param exec execution space instance
   *  \param x input \param y output \param saved per-micro-batch state */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<value_type, memory_space> x,
               Matrix<value_type, memory_space> y, saved_type& saved) {
    ensure(saved.act, x.extent(0), "telar::DynamicGraph::activation", true);
    saved.input = x;
    saved.grads_ready = false; // gradients of an earlier micro-batch in this slot are stale
    saved.token = ++forwards_;
    saved.counters.clear();
    auto record = [&](auto& l) { saved.counters.push_back(std::uint64_t(l.random_counter())); };
    for_each_recomputed_stochastic(record);
    for (std::size_t i : topo_.order()) {
      std::size_t const t = topo_.nodes()[i].out_id;
      Mat const out = t == topo_.output_id() ? y : dropped(t) ? work(t, x.extent(0)) : saved.act[t];
      run_node(exec, i, out, saved);
    }
    work_.owner = saved.token;
  }
  /*! \brief dL/dx: gradients in reverse topological order, summed over the
   *  readers of each tensor; inner gradients kept for backward_weight.
   *  \param exec execution space instance \param dy gradient of the output
   *  \param dx gradient of the input \param saved state */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                      Matrix<value_type, memory_space> dx, saved_type const& saved) {
    propagate(exec, dy, dx, saved, true);
  }
  /*! \brief dL/dW of every layer node (after backward_input, or on its own
   *  when nothing needs dL/dx). \param exec execution space instance
   *  \param dy gradient of the output \param saved state */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                       saved_type const& saved) {
    rerun_recomputed(exec, saved); // the layers' views of their inputs read the shared buffers
    if (!saved.grads_ready)
      propagate(exec, dy, Matrix<value_type, memory_space>(), saved, false);
    auto const& order = topo_.order();
    for (auto it = order.rbegin(); it != order.rend(); ++it)
      if (layers_[*it])
        std::visit(
            [&](auto& l) {
              using L = std::decay_t<decltype(l)>;
              if constexpr (layer_traits<L>::has_split_backward &&
                            layer_traits<L>::has_backward_weight)
                l.backward_weight(exec, output_grad(saved, *it, dy),
                                  saved.inner.template at<L>(*it));
            },
            *layers_[*it]);
    saved.grads_ready = false;
  }

private:
  using Mat = Matrix<value_type, memory_space>;
  using CMat = ConstMatrix<value_type, memory_space>;

  std::size_t add_join(std::string node, Op op, std::vector<std::string> inputs,
                       std::string output) {
    topo_.add(std::move(node), op, std::move(inputs), std::move(output));
    layers_.emplace_back();
    return layers_.size() - 1;
  }
  detail::GraphTopology const& topology() const {
    topo_.finalize();
    return topo_;
  }
  std::size_t input_of(std::size_t i) const { return topo_.nodes()[i].in_ids[0]; }
  // By node index: a layer node's input shape (joins: none), as the layer
  // walks index shapes.
  std::vector<Shape> layer_inputs(std::vector<Shape> const& s) const {
    std::vector<Shape> in(layers_.size());
    for (std::size_t i = 0; i < layers_.size(); ++i)
      if (layers_[i])
        in[i] = s[input_of(i)];
    return in;
  }
  // "<node>." as parameters and buffers are named (detail::LayerWalk).
  auto name_prefix() const {
    return [this](std::size_t i) { return topo_.nodes()[i].name + "."; };
  }
  std::size_t layer_index(std::string const& node) const {
    for (std::size_t i = 0; i < layers_.size(); ++i)
      if (topo_.nodes()[i].name == node && layers_[i])
        return i;
    throw Error("telar::DynamicGraph: no layer node '" + node + "'");
  }

  // Shapes by tensor id.
  std::vector<Shape> shapes(Shape const& in) const {
    auto const& topo = topology();
    std::vector<Shape> s(topo.tensor_count());
    s[0] = in;
    for (std::size_t i : topo.order()) {
      auto const& n = topo.nodes()[i];
      std::vector<Shape> ins;
      for (std::size_t t : n.in_ids)
        ins.push_back(s[t]);
      s[n.out_id] = n.op == Op::layer ? layer_shape(n, *layers_[i], ins[0])
                                      : detail::graph_join_shape(n, ins);
    }
    return s;
  }
  Shape layer_shape(detail::GraphNode const& n, Variant const& layer, Shape const& in) const {
    return std::visit(
        [&](auto const& l) {
          return detail::checked_output_shape(l, in, [&] {
            return "telar::DynamicGraph: node '" + n.name + "' (" + layer_name(l) +
                   ") cannot take input '" + n.inputs[0] + "' " + in.str();
          });
        },
        layer);
  }
  // Columns of the scratch buffer: the widest tensor read by several nodes,
  // or the input when a layer reads it (a fused layer's unused dx).
  std::size_t scratch_width(std::vector<Shape> const& s) const {
    std::size_t w = 0;
    for (std::size_t t = 0; t < s.size(); ++t)
      if (topo_.consumers(t) > 1)
        w = std::max(w, s[t].size());
    for (auto const& n : topo_.nodes())
      if (n.op == Op::layer && n.in_ids[0] == 0)
        w = std::max(w, s[0].size());
    return w;
  }

  // Calls f(layer, rest) for the layer node whose name, followed by '.',
  // starts \p name (the longest such: node names may hold dots).
  template <class F>
  void with_parameter_layer(std::string const& name, F&& f) const {
    std::size_t best = layers_.size(), len = 0;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      std::string const& node = topo_.nodes()[i].name;
      if (layers_[i] && node.size() + 1 > len && name.rfind(node + ".", 0) == 0)
        best = i, len = node.size() + 1;
    }
    if (best < layers_.size())
      std::visit([&](auto const& l) { f(l, name.substr(len)); }, *layers_[best]);
  }

  CMat value(saved_type const& saved, std::size_t t) const {
    return t == 0 ? saved.input : dropped(t) ? CMat(work_.bufs[t]) : CMat(saved.act[t]);
  }
  // Whether tensor t is the output of a recomputed node; dropped: one kept in
  // a shared buffer rather than per micro-batch (the graph output is the caller's).
  bool recomputed(std::size_t t) const {
    std::size_t const p = t == 0 ? detail::GraphTopology::none : topo_.producer(t);
    return p != detail::GraphTopology::none && p < recomputed_.size() && recomputed_[p];
  }
  bool dropped(std::size_t t) const { return t != topo_.output_id() && recomputed(t); }
  // Tensor t's shared buffer, [rows, size].
  Mat work(std::size_t t, std::size_t rows) const {
    std::vector<Mat>& bufs = work_.bufs;
    bufs.resize(shapes_.size());
    if (bufs[t].extent(0) != rows || bufs[t].extent(1) != shapes_[t].size())
      bufs[t] = Mat(Kokkos::view_alloc(Kokkos::WithoutInitializing,
                                       std::string("telar::DynamicGraph::recomputed")),
                    rows, shapes_[t].size());
    return bufs[t];
  }
  // Node i's forward into `out`, from the values in `saved`.
  template <class Exec>
  void run_node(Exec const& exec, std::size_t i, Mat const& out, saved_type const& saved) {
    auto const& n = topo_.nodes()[i];
    if (n.op == Op::layer)
      std::visit(
          [&](auto& l) {
            using L = std::decay_t<decltype(l)>;
            l.forward(exec, value(saved, n.in_ids[0]), out, saved.inner.template at<L>(i));
          },
          *layers_[i]);
    else
      join_forward(exec, n, out, inputs_of(n, saved));
  }
  template <class F>
  void for_each_recomputed_stochastic(F& f) {
    for_each_layer([&](std::size_t i, auto& l) {
      if (i < recomputed_.size() && recomputed_[i])
        detail::for_each_stochastic(l, f);
    });
  }
  // Before a micro-batch's backward: the recomputed nodes' outputs again,
  // unless the shared buffers hold this micro-batch's (its forward was the
  // last, or this ran since), with the random counters of its forward.
  template <class Exec>
  void rerun_recomputed(Exec const& exec, saved_type const& saved) {
    if (!recomputes() || work_.owner == saved.token)
      return;
    std::vector<std::uint64_t> now;
    std::size_t k = 0;
    auto rewind = [&](auto& l) {
      now.push_back(std::uint64_t(l.random_counter()));
      l.set_random_counter(saved.counters.at(k++));
    };
    for_each_recomputed_stochastic(rewind);
    for (std::size_t i : topo_.order())
      if (recomputed_[i])
        run_node(exec, i, work(topo_.nodes()[i].out_id, saved.input.extent(0)), saved);
    k = 0;
    auto restore = [&](auto& l) { l.set_random_counter(now[k++]); };
    for_each_recomputed_stochastic(restore);
    work_.owner = saved.token;
  }
  CMat output_grad(saved_type const& saved, std::size_t i, CMat dy) const {
    std::size_t const t = topo_.nodes()[i].out_id;
    return t == topo_.output_id() ? dy : CMat(saved.grad[t]);
  }
  // Inner tensors' buffers (neither the input nor the output), [rows, size].
  // Values skip the dropped tensors (recompute()).
  void ensure(std::vector<Mat>& bufs, std::size_t rows, char const* label,
              bool values = false) const {
    if (shapes_.size() != topo_.tensor_count() || !topo_.ready())
      throw Error("telar::DynamicGraph: run before build(input shape)");
    bufs.resize(shapes_.size());
    for (std::size_t t = 1; t < shapes_.size(); ++t)
      if (t != topo_.output_id() && !(values && dropped(t)) &&
          (bufs[t].extent(0) != rows || bufs[t].extent(1) != shapes_[t].size()))
        bufs[t] = Mat(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), rows,
                      shapes_[t].size());
  }
  // A [rows, width] view of the scratch buffer.
  Mat scratch(saved_type const& saved, std::size_t rows, std::size_t width) const {
    std::size_t const w = scratch_width(shapes_);
    if (saved.scratch.extent(0) != rows || saved.scratch.extent(1) != w)
      saved.scratch = Mat(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::DynamicGraph::second_gradient"),
          rows, w); // part of the saved state: no "::scratch" label, which meters as workspace
    return Mat(saved.scratch.data(), rows, width);
  }

  // The values a node reads, in its input order.
  std::vector<CMat> inputs_of(detail::GraphNode const& n, saved_type const& saved) const {
    std::vector<CMat> ins;
    for (std::size_t t : n.in_ids)
      ins.push_back(value(saved, t));
    return ins;
  }

  // A join's output from its inputs' values (also run by the pipeline's
  // node units, detail::GraphUnit, which hold the values elsewhere).
  template <class Exec>
  void join_forward(Exec const& exec, detail::GraphNode const& n, Mat const& y,
                    std::vector<CMat> const& ins) const {
    auto const in = [&](std::size_t j) { return ins[j]; };
    if (n.op == Op::add && !spread(ins, y.extent(1))) {
      detail::join_pair(exec, y, in(0), in(1), detail::JoinOp::add);
      for (std::size_t j = 2; j < n.in_ids.size(); ++j)
        detail::add_batch(exec, y, in(j));
    } else if (n.op == Op::concat) {
      std::size_t first = 0;
      for (std::size_t j = 0; j < n.in_ids.size(); ++j) {
        Kokkos::deep_copy(exec, detail::graph_columns(y, first, in(j).extent(1)), in(j));
        first += in(j).extent(1);
      }
    } else if (n.op == Op::matmul) {
      detail::graph_matmul(exec, y, in(0), in(1), matmul_dims(n, false, false));
    } else {
      detail::graph_elementwise(exec, y, in(0), in(1), elementwise(n.op));
    }
  }
  // Whether a join reads an input narrower than its output (one value per
  // channel or per sample: graph_elementwise's broadcast).
  static bool spread(std::vector<CMat> const& ins, std::size_t width) {
    for (auto const& x : ins)
      if (x.extent(1) != width)
        return true;
    return false;
  }
  static detail::GraphElementwise elementwise(Op op) {
    return op == Op::add   ? detail::GraphElementwise::add
           : op == Op::sub ? detail::GraphElementwise::sub
           : op == Op::div ? detail::GraphElementwise::div
                           : detail::GraphElementwise::mul;
  }
  // P, M, K, N of a MatMul node from its input shapes; dA = dY B^T and
  // dB = A^T dY reuse the kernel with (M, K, N) renamed.
  detail::MatmulDims matmul_dims(detail::GraphNode const& n, bool ta, bool tb) const {
    Shape const &a = shapes_[n.in_ids[0]], &b = shapes_[n.in_ids[1]];
    std::size_t const M = a[a.rank - 2], K = a[a.rank - 1], N = b[b.rank - 1];
    std::size_t const P = a.size() / (M * K);
    if (!ta && !tb)
      return {P, M, K, N, false, false};
    if (tb)
      return {P, M, N, K, false, true}; // dA [M, K] = dY [M, N] B^T
    return {P, K, M, N, true, false};   // dB [K, N] = A^T dY [M, N]
  }

  // Gradients of every node's inputs, last node first. `started[t]`: tensor
  // t's gradient holds its first contribution; later ones go through the
  // scratch buffer and are added.
  template <class Exec>
  void propagate(Exec const& exec, CMat dy, Mat dx, saved_type const& saved, bool need_dx) {
    rerun_recomputed(exec, saved);
    std::size_t const rows = dy.extent(0);
    ensure(saved.grad, rows, "telar::DynamicGraph::activation_grad");
    std::vector<bool> started(shapes_.size(), false);
    auto const contribute = [&](std::size_t t, auto&& write) {
      if (t == 0 && !need_dx)
        return;
      Mat own = t == 0 ? dx : saved.grad[t];
      if (!started[t]) {
        started[t] = true;
        write(own);
      } else {
        Mat const s = scratch(saved, rows, own.extent(1));
        write(s);
        detail::add_batch(exec, own, s);
      }
    };
    auto const& order = topo_.order();
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      auto const& n = topo_.nodes()[*it];
      CMat const g = output_grad(saved, *it, dy);
      if (n.op == Op::layer)
        layer_input_grad(exec, *it, g, saved, need_dx, contribute);
      else
        join_input_grads(exec, n, g, inputs_of(n, saved), contribute);
    }
    saved.grads_ready = true;
  }

  template <class Exec, class Contribute>
  void layer_input_grad(Exec const& exec, std::size_t i, CMat dy, saved_type const& saved,
                        bool need_dx, Contribute& contribute) {
    std::size_t const t = input_of(i);
    std::visit(
        [&](auto& l) {
          using L = std::decay_t<decltype(l)>;
          auto& inner = saved.inner.template at<L>(i);
          if constexpr (layer_traits<L>::has_split_backward) {
            contribute(t, [&](Mat const& g) { l.backward_input(exec, dy, g, inner); });
          } else if (t == 0 && !need_dx) { // the weight part still has to run
            l.backward(exec, dy, scratch(saved, dy.extent(0), shapes_[0].size()), inner);
          } else {
            contribute(t, [&](Mat const& g) { l.backward(exec, dy, g, inner); });
          }
        },
        *layers_[i]);
  }

  // contribute(j-th input's tensor, write) for each input of a join.
  template <class Exec, class Contribute>
  void join_input_grads(Exec const& exec, detail::GraphNode const& n, CMat dy,
                        std::vector<CMat> const& ins, Contribute& contribute) const {
    std::size_t first = 0;
    for (std::size_t j = 0; j < n.in_ids.size(); ++j) {
      std::size_t const t = n.in_ids[j], width = shapes_[t].size();
      contribute(t, [&](Mat const& g) {
        if (n.op == Op::add && width == dy.extent(1))
          Kokkos::deep_copy(exec, g, dy); // a spread input's gradient sums (below)
        else if (n.op == Op::concat)
          Kokkos::deep_copy(exec, g, detail::graph_columns(dy, first, width));
        else if (n.op == Op::matmul && j == 0)
          detail::graph_matmul(exec, g, dy, ins[1], matmul_dims(n, false, true));
        else if (n.op == Op::matmul)
          detail::graph_matmul(exec, g, ins[0], dy, matmul_dims(n, true, false));
        else
          detail::graph_elementwise_grad(exec, g, dy, ins[0], ins[1], elementwise(n.op), int(j));
      });
      first += width;
    }
  }

  mutable detail::GraphTopology topo_;         // checked and ordered on first use
  std::vector<std::optional<Variant>> layers_; // by node; empty for joins
  std::vector<Shape> shapes_;                  // by tensor, from build()
  initializer init_;
  // The recomputed nodes' outputs by tensor, shared by the micro-batches of
  // this graph but not by its copies (a copy, e.g. calibration's, must not
  // overwrite them between a forward and its backward): a copy starts empty.
  struct Work {
    std::vector<Mat> bufs;
    std::uint64_t owner = 0; // the forward whose values bufs hold (0: none)
    Work() = default;
    Work(Work const&) noexcept {}
    Work& operator=(Work const&) noexcept {
      bufs.clear(), owner = 0;
      return *this;
    }
  };

  std::vector<bool> recomputed_; // by node (recompute()); empty: none
  mutable Work work_;
  std::uint64_t forwards_ = 0; // forwards run: each micro-batch's token
};

namespace detail {
/*! \brief A graph's for_each_layer reaches its nodes' layers (dropout
 *  switches and random counters find them). \tparam V the layer variant */
template <class V>
inline constexpr bool has_layer_walk_v<DynamicGraph<V>> = true;
} // namespace detail

} // namespace telar
