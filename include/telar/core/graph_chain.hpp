#pragma once
/*! \file
 *  \brief telar::GraphChain: a telar::DynamicGraph trained as a chain of its
 *  nodes in execution order, so pipeline stages can split inside the graph.
 */
#include <telar/core/detail/counter_rng.hpp>
#include <telar/core/detail/graph_unit.hpp>
#include <telar/core/detail/layer_walk.hpp>
#include <telar/core/dynamic_graph.hpp>
#include <telar/core/dynamic_sequential.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/sequential.hpp>
#include <telar/core/shape.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace telar {

/*! \brief A telar::DynamicGraph as the Trainer's model: one unit per node,
 *  in the graph's execution order, so the Trainer can cut pipeline stages
 *  (and balance them by the nodes' cost estimates) inside the graph.
 *
 *  Between consecutive units flows the graph's \e live \e set at that cut:
 *  every tensor produced before it and read after it (the graph input
 *  before the first node, the output after the last), packed side by side
 *  in one [samples, sum of sizes] batch. A pipeline boundary therefore
 *  sends every tensor that crosses it, a U-Net's skips included, as the one
 *  activation it sends for any model, and the memory plan and the
 *  pipeline's slots count the whole live set. Only the units next to a
 *  stage boundary (set_stage_boundaries; the Trainer calls it) copy the
 *  tensors passing it: inside a stage each node reads its inputs where they
 *  were written.
 *
 *  Parameters, buffers and checkpoint tensors keep the names the same graph
 *  has as the only layer of a telar::Sequential ("layer0.<node>.<name>"),
 *  and the same starting values, at any pipeline degree, so a checkpoint
 *  moves between pp=1 and pp=2 and between the two models.
 *  \code
 *  telar::DynamicGraph<Layer> g("x");
 *  // ... g.add(...), g.add_concat(...), g.set_output("y");
 *  telar::Trainer<telar::GraphChain<Layer>, Strategy, telar::SGD<float>> trainer(
 *      comm, telar::GraphChain<Layer>(std::move(g)), telar::SGD<float>(0.1f),
 *      options, telar::Shape{3, 32, 32});
 *  \endcode
 *  \tparam Variant the graph's layer variant
 */
template <class Variant>
class GraphChain : public detail::ItemWalk<GraphChain<Variant>> {
  using Graph = DynamicGraph<Variant>;
  using Unit = detail::GraphUnit<Variant>;
  friend detail::ItemWalk<GraphChain>;

public:
  /*! \brief Scalar type of the whole model. */
  using value_type = typename Graph::value_type;
  /*! \brief Memory space of the whole model. */
  using memory_space = typename Graph::memory_space;
  /*! \brief Execution space that runs the model's kernels by default. */
  using execution_space = typename memory_space::execution_space;
  /*! \brief Per-micro-batch saved state of every unit. */
  using saved_tuple = detail::GraphSlot<Variant>;

  /*! \brief An empty graph (assign one before training). */
  GraphChain() : GraphChain(Graph()) {}
  /*! \brief \param graph the network (checked when built) */
  explicit GraphChain(Graph graph) : graph_(std::make_unique<Graph>(std::move(graph))) {}
  /*! \brief A deep copy (the units point into their own graph). \param o the source */
  GraphChain(GraphChain const& o)
      : graph_(std::make_unique<Graph>(*o.graph_)), units_(o.units_), shapes_(o.shapes_),
        bounds_(o.bounds_) {
    reseat();
  }
  /*! \brief A deep copy. \param o the source \return *this */
  GraphChain& operator=(GraphChain const& o) {
    if (this != &o) {
      graph_ = std::make_unique<Graph>(*o.graph_);
      units_ = o.units_;
      shapes_ = o.shapes_;
      bounds_ = o.bounds_;
      reseat();
    }
    return *this;
  }
  /*! \brief Moves (units keep pointing at the same graph). */
  GraphChain(GraphChain&&) noexcept = default;
  /*! \brief Moves. \return *this */
  GraphChain& operator=(GraphChain&&) noexcept = default;
  ~GraphChain() = default;

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "GraphChain"; }
  /*! \brief The graph. */
  Graph& graph() { return *graph_; }
  /*! \brief The graph. */
  Graph const& graph() const { return *graph_; }

  /*! \brief Number of units: the graph's nodes. */
  std::size_t layer_count() const { return graph_->node_count(); }
  /*! \brief Node names in execution order (unit k runs node k of it). */
  std::vector<std::string> layer_names() const { return graph_->execution_order(); }
  /*! \brief Names of the tensors in the live set before unit \p cut (at a
   *  pipeline boundary between units cut - 1 and cut: what crosses it), in
   *  the order they are packed. Valid after build(). \param cut 0 to layer_count() */
  std::vector<std::string> live_tensors(std::size_t cut) const {
    std::vector<std::string> names;
    for (std::size_t t : live_set(cut).tensors)
      names.push_back(graph_->topo_.tensor_name(t));
    return names;
  }

  /*! \brief Every unit is layer 0 to checkpoints and parameter names (as the
   *  graph in a telar::Sequential is). \return "layer0." */
  std::string layer_prefix(std::size_t) const { return "layer0."; }

  /*! \brief Shapes of the live sets at every cut: the input's shape, the
   *  only live tensor's shape, or the packed size; the output's last.
   *  \param in per-sample input shape \throws ShapeError or Error as the graph does */
  std::vector<Shape> shapes(Shape const& in) const { return cut_shapes(graph_->shapes(in)); }
  /*! \brief Elements per sample of every live set. \param in per-sample input shape */
  std::vector<std::size_t> feature_sizes(Shape const& in) const {
    return detail::feature_sizes(shapes(in));
  }
  /*! \brief Builds the graph for \p in and makes the units.
   *  \param in per-sample input shape \return the live sets' shapes */
  std::vector<Shape> build(Shape const& in) {
    if (graph_->recomputes()) // the units run the nodes one by one, keeping every tensor
      throw Error("telar::GraphChain: DynamicGraph::recompute is for a graph trained as one "
                  "layer (of a Sequential); a GraphChain keeps every tensor its units pass");
    graph_->build(in);
    auto const& order = graph_->topology().order();
    units_.clear();
    for (std::size_t k = 0; k < order.size(); ++k)
      units_.emplace_back(graph_.get(), order[k], k, live_at(k, graph_->shapes_),
                          live_at(k + 1, graph_->shapes_));
    mark_edges();
    shapes_ = cut_shapes(graph_->shapes_);
    return shapes_;
  }
  /*! \brief The cuts where pipeline stages start and end (every virtual
   *  stage's first unit, and layer_count()): only the units next to them
   *  copy the live set; inside a stage each node reads its inputs where they
   *  were written. Until called, every cut is treated as a boundary.
   *  \param bounds ascending unit positions, as RunLayout::stage_bounds */
  void set_stage_boundaries(std::vector<std::size_t> bounds) {
    bounds_ = std::move(bounds);
    mark_edges();
  }
  /*! \brief Shapes from the last build() (empty before). */
  std::vector<Shape> const& built_shapes() const { return shapes_; }
  /*! \brief The graph's output shape. \param in input shape */
  Shape output_shape(Shape const& in) const { return graph_->output_shape(in); }
  /*! \brief The graph's cost estimate. \param samples rows \param in input shape */
  double flops(std::size_t samples, Shape const& in) const { return graph_->flops(samples, in); }
  /*! \brief Parameter values of every node. */
  std::size_t parameter_count() const { return graph_->parameter_count(); }
  /*! \brief Buffer values of every node. */
  std::size_t buffer_count() const { return graph_->buffer_count(); }

  /*! \brief Draws the parameters of the nodes of units [first, last), each
   *  from the stream it has in a telar::Sequential holding the graph, then
   *  runs the graph's initializer hook on them.
   *  \param seed model seed \param first first unit \param last one past the last unit */
  void initialize(std::uint64_t seed, std::size_t first = 0, std::size_t last = std::size_t(-1)) {
    std::uint64_t const graph_seed = detail::mix_seed(seed, 0);
    auto const& order = graph_->topology().order();
    for (std::size_t k = first; k < last && k < order.size(); ++k) {
      std::size_t const i = order[k];
      auto& layer = graph_->layers_[i];
      if (!layer)
        continue;
      std::visit([&](auto& l) { detail::initialize_layer(l, detail::mix_seed(graph_seed, i)); },
                 *layer);
      if (graph_->init_)
        graph_->init_(graph_->topo_.nodes()[i].name, *layer);
    }
  }

  /*! \brief Visits the graph's parameters as "<node>.<name>".
   *  \param f callable as f(char const*, View&, View&) */
  template <class F>
  void parameters(F&& f) {
    graph_->parameters(f);
  }
  /*! \brief Visits the graph's buffers as "<node>.<name>".
   *  \param f callable as f(char const*, View&) */
  template <class F>
  void buffers(F&& f) {
    graph_->buffers(f);
  }
  /*! \brief Passes a data-parallel context to every node that takes one.
   *  \param ctx a telar::DataParallelContext */
  template <class Context>
  void set_data_parallel(Context const& ctx) {
    graph_->set_data_parallel(ctx);
  }

private:
  std::vector<Unit>& walked() { return units_; } // the units, for_each_layer's items
  std::vector<Unit> const& walked() const { return units_; }
  void reseat() {
    for (auto& u : units_)
      u.reseat(graph_.get());
  }
  void mark_edges() {
    auto const edge = [&](std::size_t c) {
      return bounds_.empty() || std::find(bounds_.begin(), bounds_.end(), c) != bounds_.end();
    };
    for (std::size_t k = 0; k < units_.size(); ++k)
      units_[k].set_edges(edge(k), edge(k + 1));
  }
  detail::GraphLiveSet const& live_set(std::size_t cut) const {
    if (units_.empty())
      throw Error("telar::GraphChain: live_tensors before build(input shape)");
    return cut < units_.size() ? units_[cut].input_set() : units_.back().output_set();
  }
  // The tensors live at cut c (before the node at position c of the order):
  // made before it (the input: always) and read at or after it; the output
  // lives at the end.
  std::vector<Shape> cut_shapes(std::vector<Shape> const& tensor_shapes) const {
    std::vector<Shape> out;
    for (std::size_t c = 0; c <= graph_->topology().order().size(); ++c) {
      auto const cut = live_at(c, tensor_shapes);
      out.push_back(cut.tensors.size() == 1 ? tensor_shapes[cut.tensors[0]] : Shape(cut.width));
    }
    return out;
  }
  detail::GraphLiveSet live_at(std::size_t c, std::vector<Shape> const& shapes) const {
    auto const& topo = graph_->topo_;
    auto const& order = topo.order();
    std::vector<std::size_t> born(topo.tensor_count(), 0), last_use(topo.tensor_count(), 0);
    std::vector<bool> used(topo.tensor_count(), false);
    for (std::size_t k = 0; k < order.size(); ++k) {
      auto const& n = topo.nodes()[order[k]];
      born[n.out_id] = k + 1;
      for (std::size_t t : n.in_ids)
        last_use[t] = k, used[t] = true;
    }
    last_use[topo.output_id()] = order.size();
    used[topo.output_id()] = true;
    detail::GraphLiveSet s;
    for (std::size_t t = 0; t < topo.tensor_count(); ++t)
      if (used[t] && born[t] <= c && c <= last_use[t]) {
        s.tensors.push_back(t);
        s.offsets.push_back(s.width);
        s.width += shapes[t].size();
      }
    return s;
  }

  std::unique_ptr<Graph> graph_;
  std::vector<Unit> units_;
  std::vector<Shape> shapes_;
  std::vector<std::size_t> bounds_; // stage boundaries (empty: every cut)
};

/*! \brief telar::GraphChain trains as a telar::Sequential does.
 *  \tparam V the layer variant */
template <class V>
inline constexpr bool is_sequential_v<GraphChain<V>> = true;

namespace detail {
/*! \brief A node unit's for_each_layer reaches its layer (dropout switches
 *  and random counters find it). \tparam V the layer variant */
template <class V>
inline constexpr bool has_layer_walk_v<GraphUnit<V>> = true;
} // namespace detail

} // namespace telar
