#pragma once
/*! \file
 *  \brief telar::SlabGraph: a directed acyclic graph of layers over slabs of
 *  samples split along their first spatial axis over a spatial group (a
 *  3-D U-Net with its concatenated skips), run forward and backward.
 *
 *  Nodes are spatial wrappers (telar::SpatialConv, telar::SpatialPool,
 *  telar::SpatialUpsample, telar::SpatialLocal) or channel concatenations
 *  of two earlier nodes. Every activation is split by the same rule
 *  (telar::split_extent), so a concatenation is local: both operands hold the
 *  same rows. A node read by several others (a skip) gets the sum of their
 *  gradients. See docs/spatial.md.
 *  \code
 *  using G = telar::SlabGraph<float, telar::DefaultMemorySpace, Conv, BN, Relu, Pool, Up>;
 *  G g(sp);
 *  int const a = g.add(Conv(sp, telar::Conv3D<float>(1, 8, 3, 1, 1)), G::input);
 *  int const b = g.add(Pool(sp, telar::MaxPool<3, float>(2)), a);
 *  int const c = g.add(Up(sp, telar::ConvTranspose3D<float>(8, 8, 2, 2)), b);
 *  g.concat(c, a);            // the skip
 *  g.build({1, 64, 64, 64});  // the whole sample; this rank holds g.input_slab() of its depth
 *  \endcode
 */
#include <telar/comm/communicator.hpp>
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/parallel/detail/spatial.hpp>
#include <telar/parallel/detail/step_hooks.hpp>
#include <telar/parallel/spatial_decomposition.hpp>
#include <telar/profile/trace.hpp>

#include <Kokkos_Core.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace telar {

/*! \brief While it lives, a telar::SlabGraph and the spatial wrappers built
 *  on this thread build for rank \p rank of a group of \p size, not for
 *  their communicator's: their shapes, slabs and activation_bytes() are
 *  that rank's, a memory plan for another sp without its ranks. Such a
 *  graph is for planning only: it must not run. Scopes nest.
 *  \code
 *  { telar::SpatialPlanAs as(4, 1); g.build(shape); bytes = g.activation_bytes(1); }
 *  \endcode */
class SpatialPlanAs {
public:
  /*! \brief Plans as rank \p rank of \p size. \param size group size
   *  \param rank rank in it */
  SpatialPlanAs(int size, int rank) : saved_(detail::planned_position()) {
    detail::planned_position() = {size, rank};
  }
  SpatialPlanAs(SpatialPlanAs const&) = delete;
  SpatialPlanAs& operator=(SpatialPlanAs const&) = delete;
  ~SpatialPlanAs() { detail::planned_position() = saved_; }

private:
  detail::GroupPosition saved_;
};

namespace detail {
template <class L>
using set_training_t = decltype(std::declval<L&>().set_training(true));
template <class L>
using set_trace_t = decltype(std::declval<L&>().set_trace(nullptr));
template <class L>
using set_partial_t = decltype(std::declval<L&>().set_partial_gradients(true));
template <class L>
using input_halo_t = decltype(std::declval<L const&>().input_halo());

// dst[:, at : at + src cols] = src (add: +=), per sample: a channel block
// of a channel-first slab is a contiguous run of its row.
template <class Exec, class T, class M>
void place_columns(Exec const& exec, ConstMatrix<T, M> src, Matrix<T, M> dst, std::size_t at,
                   bool add) {
  std::size_t const k = src.extent(1);
  Kokkos::parallel_for(
      "telar::SlabGraph::place",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {src.extent(0), k}),
      KOKKOS_LAMBDA(std::size_t s, std::size_t j) {
        dst(s, at + j) = add ? dst(s, at + j) + src(s, j) : src(s, j);
      });
}

// The reverse: dst (add: +=) = src[:, at : at + dst cols].
template <class Exec, class T, class M>
void take_columns(Exec const& exec, ConstMatrix<T, M> src, Matrix<T, M> dst, std::size_t at,
                  bool add) {
  Kokkos::parallel_for(
      "telar::SlabGraph::take",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {dst.extent(0), dst.extent(1)}),
      KOKKOS_LAMBDA(std::size_t s, std::size_t j) {
        dst(s, j) = add ? dst(s, j) + src(s, at + j) : src(s, at + j);
      });
}
} // namespace detail

/*! \brief A graph of slab layers with concatenated skips, trained on slabs.
 *
 *  Nodes are added in topological order (a node reads earlier nodes only);
 *  the last node is the output, and every other node must be read by some
 *  node (build refuses a dead end, naming it). Parameter gradients
 *  accumulate (as a layer's do) and are the whole sample's on every rank of
 *  the group (the wrappers sum them; set_partial_gradients leaves each
 *  rank's part for an update that sums them).
 *  \tparam T value type \tparam M memory space
 *  \tparam Layers the distinct wrapper types the graph holds */
template <class T, class M, class... Layers>
class SlabGraph : public detail::LayerTypes<T, M> {
  template <class L>
  struct Unit {
    L layer;
    typename L::saved_type saved{};
  };
  struct Concat {
    static constexpr char const* name() { return "Concat"; }
  };
  using Op = std::variant<std::monostate, Concat, Unit<Layers>...>;
  struct Node {
    Op op;
    std::vector<int> from;      // the nodes it reads
    Shape whole{}, slab{};      // output shapes: the sample's and this rank's
    Matrix<T, M> y, g, scratch; // output, its gradient, a reader's partial gradient
    int readers = 0;
    bool written = false; // g holds a reader's gradient already (the next one adds)
  };

public:
  /*! \brief The id of the graph's input (the sample's slab). */
  static constexpr int input = 0;

  /*! \brief A graph over the spatial group \p sp (kept by reference: it must
   *  outlive the graph and be the group the wrappers were made with). */
  explicit SlabGraph(Communicator const& sp) : sp_(&sp) { nodes_.emplace_back(); }

  /*! \brief Appends wrapper \p l reading node \p from. \return its id */
  template <class L>
  int add(L l, int from) {
    check_from(from, L::name());
    Node n;
    n.op.template emplace<Unit<L>>(Unit<L>{std::move(l)});
    n.from = {from};
    return push(std::move(n));
  }
  /*! \brief Appends the channel concatenation [a, b] of two nodes. \return its id */
  int concat(int a, int b) {
    check_from(a, "Concat");
    check_from(b, "Concat");
    Node n;
    n.op = Concat{};
    n.from = {a, b};
    return push(std::move(n));
  }

  /*! \brief Builds every node for the whole input shape \p in [C, D, H, W]
   *  (or [C, H, W]): each wrapper computes this rank's slab.
   *  \throws ShapeError naming the node and its input shape for a dead end,
   *  a concatenation of different spatial extents, or what a wrapper refuses
   *  (the same text on every rank) */
  void build(Shape const& in) {
    nodes_[0].whole = in;
    nodes_[0].slab = in;
    nodes_[0].slab.dims[1] =
        split_extent(in[1], detail::group_size(*sp_), detail::group_rank(*sp_)).size();
    for (std::size_t i = 1; i < nodes_.size(); ++i) {
      if (i + 1 < nodes_.size() && nodes_[i].readers == 0)
        throw ShapeError("telar::SlabGraph: node " + std::to_string(i) + " (" + name(int(i)) +
                         ") is read by no node (only the last node is the output)");
      try {
        build_node(nodes_[i]);
      } catch (ShapeError const& e) { // the same on every rank: say where in the graph
        throw ShapeError("telar::SlabGraph: node " + std::to_string(i) + " (" + name(int(i)) +
                         ", input " + nodes_[std::size_t(nodes_[i].from[0])].whole.str() +
                         "): " + e.what());
      }
    }
  }

  /*! \brief Number of nodes, the input included. */
  int size() const { return int(nodes_.size()); }
  /*! \brief Node \p i's layer or operation name. */
  std::string name(int i) const {
    return std::visit(
        [](auto const& op) -> std::string {
          using O = std::decay_t<decltype(op)>;
          if constexpr (std::is_same_v<O, std::monostate>)
            return "input";
          else if constexpr (std::is_same_v<O, Concat>)
            return O::name();
          else
            return decltype(op.layer)::name();
        },
        nodes_[std::size_t(i)].op);
  }
  /*! \brief Node \p i's output shape for the whole sample. */
  Shape whole_shape(int i) const { return nodes_[std::size_t(i)].whole; }
  /*! \brief Node \p i's output shape on this rank (its slab). */
  Shape slab_shape(int i) const { return nodes_[std::size_t(i)].slab; }
  /*! \brief Ranks of the spatial group (a telar::SpatialPlanAs's while one lives). */
  int spatial_size() const { return detail::group_size(*sp_); }
  /*! \brief This rank's position in the spatial group. */
  int spatial_rank() const { return detail::group_rank(*sp_); }
  /*! \brief The rows of the input's first spatial axis this rank holds. */
  Slab input_slab() const {
    return split_extent(nodes_[0].whole[1], detail::group_size(*sp_), detail::group_rank(*sp_));
  }
  /*! \brief The rows of the output's first spatial axis this rank holds. */
  Slab output_slab() const {
    return split_extent(nodes_.back().whole[1], detail::group_size(*sp_), detail::group_rank(*sp_));
  }

  /*! \brief Bytes of activations this rank allocates to train on \p
   *  samples per rank (a memory plan): every node's output and its
   *  gradient, the scratch of nodes read by two layers (skips), and each
   *  wrapper's saved state (halo-extended inputs) and workspace. Not the
   *  input slab, its labels or the loss gradient (the caller's). */
  std::size_t activation_bytes(std::size_t samples) const {
    std::size_t bytes = 0;
    for (std::size_t i = 1; i < nodes_.size(); ++i) {
      Node const& node = nodes_[i];
      std::size_t const copies = 2 + (node.readers > 1 ? 1 : 0); // y, g (and scratch)
      bytes += copies * detail::view_bytes<T>(samples * node.slab.size());
      std::visit(
          [&](auto const& op) {
            using O = std::decay_t<decltype(op)>;
            if constexpr (!std::is_same_v<O, std::monostate> && !std::is_same_v<O, Concat>)
              bytes += op.layer.saved_bytes(samples) + op.layer.workspace_bytes(samples);
          },
          node.op);
    }
    return bytes;
  }

  /*! \brief Draws every node's parameters: node i from seed + i (the same
   *  seed on every rank gives every rank the same weights). */
  void initialize(std::uint64_t seed) {
    for_units([&](auto& u, std::size_t i) { u.layer.initialize(seed + i); });
  }
  /*! \brief Draws node \p node's parameters alone, as initialize(seed)
   *  draws them (ZeRO-3 draws one node at a time; nothing for the input
   *  or a concatenation). */
  void initialize(std::uint64_t seed, std::size_t node) {
    for_units([&](auto& u, std::size_t i) {
      if (i == node)
        u.layer.initialize(seed + i);
    });
  }
  /*! \brief Visits every parameter as f(name, value, gradient). */
  template <class F>
  void parameters(F&& f) {
    for_units([&](auto& u, std::size_t i) {
      u.layer.parameters([&](char const* name, auto& v, auto& g) {
        std::string const full = layer_prefix(i) + name;
        f(full.c_str(), v, g);
      });
    });
  }
  /*! \brief Calls f(i, wrapper, from) for every layer node i in order (not
   *  the concatenations), `from` the node it reads (telar::predict_slab_step
   *  reads the graph through it). */
  template <class F>
  void for_each_node(F&& f) const {
    for (std::size_t i = 1; i < nodes_.size(); ++i)
      std::visit(
          [&](auto const& op) {
            using O = std::decay_t<decltype(op)>;
            if constexpr (!std::is_same_v<O, std::monostate> && !std::is_same_v<O, Concat>)
              f(int(i), op.layer, nodes_[i].from[0]);
          },
          nodes_[i].op);
  }
  /*! \brief Node slots, the input's included: layer indices run over [0,
   *  layer_count()) as a model's do (telar::ParameterStore binds the
   *  graph's parameters as a telar::Sequential's, node i as layer i). */
  std::size_t layer_count() const { return nodes_.size(); }
  /*! \brief Calls f(i, wrapper) for every layer node i (std::size_t), as a
   *  telar::Sequential's for_each_layer does. */
  template <class F>
  void for_each_layer(F&& f) {
    for_units([&](auto& u, std::size_t i) { f(i, u.layer); });
  }
  /*! \brief The prefix of node \p i's parameter names ("node3."), as
   *  parameters() names them. */
  std::string layer_prefix(std::size_t i) const { return "node" + std::to_string(i) + "."; }

  /*! \brief Training (batch statistics) or evaluation (running ones) for
   *  the layers that have both. */
  void set_training(bool on) {
    for_units([&](auto& u, std::size_t) {
      if constexpr (detail::is_detected_v<detail::set_training_t, decltype(u.layer.layer)>)
        u.layer.layer.set_training(on);
    });
  }

  /*! \brief Records on \p trace (null: none) each node's forward and
   *  backward as spans "F<i> <layer>" and "B<i> <layer>" (categories
   *  forward and backward, lane 0) and, through the wrappers, their halo
   *  exchanges and gradient sums (category comm; telar::HaloExchange::set_trace).
   *  \param trace the rank's recorder, kept by pointer */
  void set_trace(TraceRecorder* trace) {
    trace_ = trace;
    for_units([&](auto& u, std::size_t) {
      if constexpr (detail::is_detected_v<detail::set_trace_t, decltype(u.layer)>)
        u.layer.set_trace(trace);
    });
  }

  /*! \brief With \p on, backward leaves each rank's part of the parameter
   *  gradients (what its slab contributes) unsummed over the spatial group:
   *  the sum over the group's ranks is the whole sample's gradient. For
   *  an update that sums every part at once (telar::SlabDataParallel sums
   *  them over dp x sp with the data-parallel average). Off by default.
   *  \throws Error naming the node when a wrapper with parameters cannot
   *  leave them partial (it sums them itself) */
  void set_partial_gradients(bool on) {
    for_units([&](auto& u, std::size_t i) {
      if constexpr (detail::is_detected_v<detail::set_partial_t, decltype(u.layer)>) {
        u.layer.set_partial_gradients(on);
      } else {
        bool any = false;
        u.layer.parameters([&](char const*, auto&, auto&) { any = true; });
        if (on && any)
          throw Error("telar::SlabGraph::set_partial_gradients: node " + std::to_string(i) + " (" +
                      name(int(i)) + ") has parameters and no set_partial_gradients");
      }
    });
  }

  /*! \brief Rows beyond this rank's input slab, below and above, that
   *  the one node reading the input receives from its neighbours (0 at the
   *  volume's faces): read them with the slab (telar::VolumeReader, a
   *  SlabRange with these halos) and forward() takes the input so extended,
   *  that exchange skipped. {0, 0} when the input's reader exchanges no
   *  rows, or several nodes read the input. After build(). */
  std::array<std::size_t, 2> input_halo() const {
    std::array<std::size_t, 2> h{0, 0};
    if (nodes_[0].readers != 1)
      return h;
    for_each_node([&](int, auto const& w, int from) {
      if constexpr (detail::is_detected_v<detail::input_halo_t, std::decay_t<decltype(w)>>)
        if (from == input)
          h = w.input_halo();
    });
    return h;
  }
  /*! \brief Columns of an input that holds its halo rows (input_halo()):
   *  [C * (lo + rows + hi) * plane] per sample. */
  std::size_t input_size_with_halo() const {
    Shape const& s = nodes_[0].slab;
    auto const h = input_halo();
    return s.size() / s[1] * (s[1] + h[0] + h[1]);
  }

  /*! \brief Runs the graph on this rank's input slab \p x [n, C * rows *
   *  plane], or on the slab with its halo rows (input_size_with_halo()
   *  columns: read with them, no exchange at the first node); \p hooks
   *  hears before_forward(i) before each layer node i runs (ZeRO-3 gathers
   *  its parameters there) and progress() after the pass. \return the
   *  output slab (valid until the next forward) */
  template <class Exec, class Hooks = detail::NoStepHooks>
  Matrix<T, M> const& forward(Exec const& exec, ConstMatrix<T, M> x, Hooks&& hooks = {}) {
    std::size_t const n = x.extent(0);
    x_ = x;
    x_extended_ = x.extent(1) != nodes_[0].slab.size() && x.extent(1) == input_size_with_halo();
    for (std::size_t i = 1; i < nodes_.size(); ++i) {
      Node& node = nodes_[i];
      fit(node.y, n, node.slab, "telar::SlabGraph::y");
      if (!std::holds_alternative<Concat>(node.op))
        hooks.before_forward(i);
      double const began = trace_ ? trace_->now() : 0;
      std::visit([&](auto& op) { forward_op(exec, op, node); }, node.op);
      traced(exec, "F", i, began);
    }
    hooks.progress();
    return nodes_.back().y;
  }

  /*! \brief Back-propagates \p dy (the output slab's gradient) through the
   *  last forward; parameter gradients accumulate. The input's gradient is
   *  not computed. \p hooks hears of every layer node i, in reverse order:
   *  before_backward(i) before it runs, gradient_ready(i) once its weight
   *  gradient is complete (summed over the group); progress() after the
   *  pass (telar::SlabDataParallel's buckets, ZeRO-2 groups and ZeRO-3
   *  gathers listen, as to the pipeline executor's hooks). */
  template <class Exec, class Hooks = detail::NoStepHooks>
  void backward(Exec const& exec, ConstMatrix<T, M> dy, Hooks&& hooks = {}) {
    for (auto& node : nodes_)
      node.written = false;
    Node& last = nodes_.back();
    fit(last.g, dy.extent(0), last.slab, "telar::SlabGraph::g");
    Kokkos::deep_copy(exec, last.g, dy);
    for (std::size_t i = nodes_.size() - 1; i >= 1; --i) {
      Node& node = nodes_[i];
      bool const layer = !std::holds_alternative<Concat>(node.op);
      if (layer)
        hooks.before_backward(i);
      double const began = trace_ ? trace_->now() : 0;
      std::visit([&](auto& op) { backward_op(exec, op, node); }, node.op);
      traced(exec, "B", i, began);
      if (layer)
        hooks.gradient_ready(i);
    }
    hooks.progress();
    exec.fence();
  }

private:
  // Node i's span from `began` to now, when tracing ("F3 Conv3D").
  template <class Exec>
  void traced(Exec const& exec, char const* pass, std::size_t i, double began) {
    if (!trace_)
      return;
    exec.fence(); // the span ends when the node's kernels do
    trace_->add(pass + std::to_string(i) + " " + name(int(i)),
                pass[0] == 'F' ? "forward" : "backward", began, trace_->now());
  }
  void check_from(int from, char const* what) const {
    if (from < 0 || from >= int(nodes_.size()))
      throw ShapeError(std::string("telar::SlabGraph: ") + what + " reads node " +
                       std::to_string(from) + ", but nodes 0 to " +
                       std::to_string(nodes_.size() - 1) + " exist");
  }
  int push(Node n) {
    for (int f : n.from)
      ++nodes_[std::size_t(f)].readers;
    nodes_.push_back(std::move(n));
    return int(nodes_.size()) - 1;
  }
  // Calls f(unit, node index) for every layer node.
  template <class F>
  void for_units(F&& f) {
    for (std::size_t i = 1; i < nodes_.size(); ++i)
      std::visit(
          [&](auto& op) {
            using O = std::decay_t<decltype(op)>;
            if constexpr (!std::is_same_v<O, std::monostate> && !std::is_same_v<O, Concat>)
              f(op, i);
          },
          nodes_[i].op);
  }

  void build_node(Node& node) {
    if (std::holds_alternative<Concat>(node.op)) {
      Shape a = nodes_[std::size_t(node.from[0])].whole,
            b = nodes_[std::size_t(node.from[1])].whole;
      Shape sa = a, sb = b;
      sa.dims[0] = sb.dims[0] = 0;
      if (!(sa == sb))
        throw ShapeError("node " + std::to_string(node.from[0]) + " " + a.str() + " and node " +
                         std::to_string(node.from[1]) + " " + b.str() +
                         " have different spatial extents");
      a.dims[0] += b[0];
      node.whole = a;
      node.slab = nodes_[std::size_t(node.from[0])].slab;
      node.slab.dims[0] = a[0];
      return;
    }
    std::visit(
        [&](auto& op) {
          using O = std::decay_t<decltype(op)>;
          if constexpr (!std::is_same_v<O, std::monostate> && !std::is_same_v<O, Concat>) {
            op.layer.build(nodes_[std::size_t(node.from[0])].whole);
            node.whole = op.layer.whole_output_shape();
            node.slab = op.layer.output_shape();
          }
        },
        node.op);
  }

  ConstMatrix<T, M> value(int i) const {
    return i == input ? x_ : ConstMatrix<T, M>(nodes_[std::size_t(i)].y);
  }
  static void fit(Matrix<T, M>& m, std::size_t n, Shape const& s, char const* label) {
    if (m.extent(0) != n || m.extent(1) != s.size())
      m = Matrix<T, M>(std::string(label), n, s.size());
  }

  template <class Exec>
  void forward_op(Exec const&, std::monostate&, Node&) {}
  template <class Exec>
  void forward_op(Exec const& exec, Concat&, Node& node) {
    ConstMatrix<T, M> a = value(node.from[0]), b = value(node.from[1]);
    detail::place_columns(exec, a, node.y, 0, false);
    detail::place_columns(exec, b, node.y, a.extent(1), false);
  }
  template <class Exec, class U>
  void forward_op(Exec const& exec, U& u, Node& node) {
    if constexpr (detail::is_detected_v<detail::input_halo_t, decltype(u.layer)>)
      if (node.from[0] == input && x_extended_) { // its halo rows came with the input
        u.layer.forward_extended(exec, x_, node.y, u.saved);
        return;
      }
    u.layer.forward(exec, value(node.from[0]), node.y, u.saved);
  }

  // Where reader gradients for node `to` go: its g when it is the first
  // reader to write, else a scratch that is then added (gather()).
  Matrix<T, M>& target(int to, std::size_t n) {
    Node& t = nodes_[std::size_t(to)];
    fit(t.g, n, t.slab, "telar::SlabGraph::g");
    if (!t.written)
      return t.g;
    fit(t.scratch, n, t.slab, "telar::SlabGraph::scratch");
    return t.scratch;
  }
  template <class Exec>
  void gather(Exec const& exec, int to) {
    Node& t = nodes_[std::size_t(to)];
    if (t.written)
      detail::place_columns(exec, ConstMatrix<T, M>(t.scratch), t.g, 0, true);
    t.written = true;
  }

  template <class Exec>
  void backward_op(Exec const&, std::monostate&, Node&) {}
  template <class Exec>
  void backward_op(Exec const& exec, Concat&, Node& node) {
    std::size_t at = 0;
    for (int f : node.from) {
      std::size_t const cols = nodes_[std::size_t(f)].slab.size();
      if (f != input) {
        Node& t = nodes_[std::size_t(f)];
        fit(t.g, node.g.extent(0), t.slab, "telar::SlabGraph::g");
        detail::take_columns(exec, ConstMatrix<T, M>(node.g), t.g, at, t.written);
        t.written = true;
      }
      at += cols;
    }
  }
  // A layer with both forms (SpatialConv) runs the fused one, which
  // computes its weight gradient while its halo gradients travel.
  template <class Exec, class U>
  void backward_op(Exec const& exec, U& u, Node& node) {
    using L = std::decay_t<decltype(u.layer)>;
    int const f = node.from[0];
    if (f != input) {
      if constexpr (layer_traits<L>::has_fused_backward) {
        u.layer.backward(exec, node.g, target(f, node.g.extent(0)), u.saved);
        gather(exec, f);
        return;
      }
      u.layer.backward_input(exec, node.g, target(f, node.g.extent(0)), u.saved);
      gather(exec, f);
    }
    if constexpr (layer_traits<L>::has_backward_weight)
      u.layer.backward_weight(exec, node.g, u.saved);
  }

  Communicator const* sp_;
  // A deque: appending never relocates a node. A vector grows by copying its
  // nodes when their move may throw (Kokkos 4.6's View move constructor is
  // not noexcept), and a node holds layers that cannot be copied
  // (telar::HaloExchange's pending requests): nvcc (Kokkos 4.6, CUDA 13)
  // refused to compile that copy.
  std::deque<Node> nodes_;
  ConstMatrix<T, M> x_;
  bool x_extended_ = false; // x_ holds the input's halo rows (input_halo())
  TraceRecorder* trace_ = nullptr;
};

} // namespace telar
