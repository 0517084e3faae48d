#pragma once
// One node of a telar::DynamicGraph as a unit of telar::GraphChain: a layer
// whose input and output are the graph's live sets before and after the
// node, packed. A live set holds every tensor produced before a cut and read
// after it (and the graph output at the end), one [samples, width] block
// after another in one [samples, sum of widths] buffer, so a pipeline
// boundary that sends one activation sends them all (a U-Net's skips
// included), and each tensor in it is a contiguous matrix a layer can read.
//
// Only a stage boundary needs the whole set. Inside a stage the units of one
// micro-batch share a table (GraphStore, kept with the slot's saved state,
// GraphSlot) of where each tensor and its gradient sit: a node writes its
// output into its own block of the buffer after it and reads its inputs
// where they were written, so nothing is copied; the unit before a boundary
// copies the tensors passing it into its output buffer, the unit after one
// reads them from its input (and the gradients the other way).
#include <telar/core/detail/graph_joins.hpp>
#include <telar/core/detail/layer_walk.hpp>
#include <telar/core/detail/type_traits.hpp>
#include <telar/core/dynamic_graph.hpp>
#include <telar/core/dynamic_sequential.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/sequential.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace telar::detail {

// Tensors crossing one cut of a topological order, in id order, and where
// each sits in the packed batch.
struct GraphLiveSet {
  std::vector<std::size_t> tensors; // tensor ids, ascending
  std::vector<std::size_t> offsets; // first column of each
  std::size_t width = 0;            // columns of the packed batch

  // Position of tensor t, or tensors.size().
  std::size_t find(std::size_t t) const {
    return std::size_t(std::find(tensors.begin(), tensors.end(), t) - tensors.begin());
  }
  bool holds(std::size_t t) const { return find(t) < tensors.size(); }
};

// Where one micro-batch's tensors and their gradients sit while the units
// of a stage run it: views into the slot's cut buffers, by tensor id. A
// gradient is set by its first contribution (or the boundary it arrives
// across); later contributions are added to it.
template <class Mat, class CMat>
struct GraphStore {
  std::vector<CMat> value;
  std::vector<Mat> grad;
  void reset(std::size_t tensors) {
    value.assign(tensors, CMat());
    grad.assign(tensors, Mat());
  }
};

template <class Variant>
class GraphUnit {
  using Graph = DynamicGraph<Variant>;
  using First = std::variant_alternative_t<0, Variant>;

public:
  using value_type = typename layer_traits<First>::value_type;
  using memory_space = typename layer_traits<First>::memory_space;
  // backward_weight takes the node's output gradient that backward_input found.
  static constexpr bool backward_input_first = true;
  using Mat = Matrix<value_type, memory_space>;
  using CMat = ConstMatrix<value_type, memory_space>;
  using Store = GraphStore<Mat, CMat>;

  // What one micro-batch keeps: the node's state, and the stage's table of
  // tensors (the slot's, GraphSlot; a unit run alone, as calibration runs
  // it, keeps its own and treats both its cuts as boundaries).
  struct saved_type {
    mutable DynamicSaved<Variant> inner; // the node layer's state (entry 0)
    Store* shared = nullptr;             // the slot's table (set by saved_at)
    mutable Store own;                   // the table when run alone
    mutable Mat scratch;                 // one contribution before it is added
    mutable Mat unused_dx;               // dL/d input nobody reads (a fused first node)
    mutable bool grads_ready = false;    // backward_input ran since the last backward_weight
    Store& store() const { return shared ? *shared : own; }
  };

  GraphUnit() = default;
  // Node `node` at position `position` of the order; `in`, `out`: the live
  // sets before and after it.
  GraphUnit(Graph* g, std::size_t node, std::size_t position, GraphLiveSet in, GraphLiveSet out)
      : g_(g), node_(node), first_(position == 0), in_(std::move(in)), out_(std::move(out)) {
    scratch_width_ = 0;
    auto const& ids = node_info().in_ids;
    for (std::size_t j = 0; j < ids.size(); ++j)
      if (ids[j] != 0 && (out_.holds(ids[j]) || std::count(ids.begin(), ids.end(), ids[j]) > 1))
        scratch_width_ = std::max(scratch_width_, width(ids[j]));
  }

  static constexpr char const* name() { return "DynamicGraph node"; }
  void reseat(Graph* g) { g_ = g; }
  std::size_t node() const { return node_; }
  GraphLiveSet const& input_set() const { return in_; }
  GraphLiveSet const& output_set() const { return out_; }
  // Whether a stage starts before this unit / ends after it (GraphChain
  // sets them from the Trainer's stage boundaries; every cut until then).
  void set_edges(bool starts, bool ends) { starts_ = starts, ends_ = ends; }

  Shape output_shape(Shape const&) const { return Shape(out_.width); }

  double flops(std::size_t samples, Shape const&) const {
    auto const& n = node_info();
    if (!layer())
      return double(samples) * double(g_->shapes_[n.out_id].size());
    return std::visit(
        [&](auto const& l) { return layer_flops(l, samples, g_->shapes_[n.in_ids[0]]); }, *layer());
  }
  std::size_t parameter_count() const {
    return layer() ? std::visit([](auto const& l) { return parameter_count_of(l); }, *layer()) : 0;
  }
  std::size_t buffer_count() const {
    return layer() ? std::visit([](auto const& l) { return buffer_count_of(l); }, *layer()) : 0;
  }
  // The layer's state, the scratch for a tensor's second gradient, and the
  // first node's unread dL/dx. Tensors and gradients live in the cut buffers
  // (counted by the plan from the live sets' sizes).
  std::size_t saved_bytes(std::size_t samples, Shape const&) const {
    auto const& n = node_info();
    std::size_t bytes = 0;
    if (layer())
      std::visit(
          [&](auto const& l) { bytes = saved_bytes_of(l, samples, g_->shapes_[n.in_ids[0]]); },
          *layer());
    auto const matrix = [&](std::size_t cols) { return view_bytes<value_type>(samples * cols); };
    if (scratch_width_ > 0)
      bytes += matrix(scratch_width_);
    if (first_ && fused())
      bytes += matrix(in_.width);
    return bytes;
  }
  std::size_t workspace_bytes(std::size_t samples, Shape const&) const {
    auto const& n = node_info();
    if (!layer())
      return 0;
    return std::visit(
        [&](auto const& l) { return workspace_bytes_of(l, samples, g_->shapes_[n.in_ids[0]]); },
        *layer());
  }

  // Parameters and buffers keep the unsplit graph's names, "<node>.<name>".
  template <class F>
  void parameters(F&& f) {
    if (layer())
      std::visit([&](auto& l) { prefixed_parameters(l, node_info().name + ".", f); }, *layer());
  }
  template <class F>
  void buffers(F&& f) {
    if (layer())
      std::visit([&](auto& l) { prefixed_buffers(l, node_info().name + ".", f); }, *layer());
  }
  // The node's layer, for walks that switch dropout and random counters.
  template <class F>
  void for_each_layer(F&& f) {
    if (layer())
      std::visit([&](auto& l) { f(node_, l); }, *layer());
  }
  template <class F>
  void for_each_layer(F&& f) const {
    if (layer())
      std::visit([&](auto const& l) { f(node_, l); }, *layer());
  }

  template <class Exec>
  void forward(Exec const& exec, CMat x, Mat y, saved_type& saved) {
    auto const& n = node_info();
    Store& st = saved.store();
    saved.grads_ready = false;
    if (starts(saved)) { // the stage's input: every live tensor from its block
      st.reset(g_->shapes_.size());
      for (std::size_t t : in_.tensors)
        st.value[t] = block(x, in_, t);
    }
    std::vector<CMat> ins;
    for (std::size_t t : n.in_ids)
      ins.push_back(st.value[t]);
    Mat const out = block(y, out_, n.out_id);
    if (layer())
      std::visit(
          [&](auto& l) {
            using L = std::decay_t<decltype(l)>;
            l.forward(exec, ins[0], out, saved.inner.template at<L>(0));
          },
          *layer());
    else
      g_->join_forward(exec, n, out, ins);
    st.value[n.out_id] = out;
    if (ends(saved)) // what crosses the boundary, beside the node's output
      for (std::size_t t : out_.tensors)
        if (t != n.out_id)
          Kokkos::deep_copy(exec, block(y, out_, t), st.value[t]);
  }

  // The gradients of the node's inputs, each added to its tensor's; at a
  // stage's start, every live tensor's gradient into its block of dx.
  template <class Exec>
  void backward_input(Exec const& exec, CMat dy, Mat dx, saved_type const& saved) {
    Store& st = saved.store();
    std::size_t const rows = dy.extent(0);
    if (ends(saved)) // the tensors passing the boundary: their gradients so far
      for (std::size_t t : out_.tensors)
        if (t != 0 && t != node_info().out_id) {
          st.grad[t] = block(dx, in_, t);
          Kokkos::deep_copy(exec, st.grad[t], block(dy, out_, t));
        }
    auto const contribute = [&](std::size_t t, auto&& write) {
      if (t == 0) // the graph input's gradient is never used
        return;
      if (!st.grad[t].data()) {
        st.grad[t] = block(dx, in_, t);
        write(st.grad[t]);
      } else {
        Mat const s = scratch(saved, rows, width(t));
        write(s);
        add_batch(exec, st.grad[t], s);
      }
    };
    CMat const g = out_grad(dy, saved);
    if (layer())
      input_grad(exec, g, dx, saved, contribute);
    else
      g_->join_input_grads(exec, node_info(), g, inputs(st), contribute);
    if (starts(saved))
      for (std::size_t t : in_.tensors)
        if (t != 0 && st.grad[t].data() != block(dx, in_, t).data())
          Kokkos::deep_copy(exec, block(dx, in_, t), st.grad[t]);
    saved.grads_ready = true;
  }

  template <class Exec>
  void backward_weight(Exec const& exec, CMat dy, saved_type const& saved) {
    // Nothing needed dL/dx (the first node): a fused layer runs whole into
    // a buffer nobody reads.
    if (!saved.grads_ready && fused())
      backward_input(exec, dy, sized(saved.unused_dx, dy.extent(0), in_.width), saved);
    if (layer())
      std::visit(
          [&](auto& l) {
            using L = std::decay_t<decltype(l)>;
            if constexpr (layer_traits<L>::has_split_backward &&
                          layer_traits<L>::has_backward_weight)
              l.backward_weight(exec, out_grad(dy, saved), saved.inner.template at<L>(0));
          },
          *layer());
    saved.grads_ready = false;
  }

  template <class Context>
  void set_data_parallel(Context const& ctx) {
    if (layer())
      std::visit([&](auto& l) { pass_data_parallel(l, ctx); }, *layer());
  }

private:
  GraphNode const& node_info() const { return g_->topo_.nodes()[node_]; }
  std::optional<Variant>& layer() const { return g_->layers_[node_]; }
  std::size_t width(std::size_t t) const { return g_->shapes_[t].size(); }
  bool starts(saved_type const& saved) const { return starts_ || !saved.shared; }
  bool ends(saved_type const& saved) const { return ends_ || !saved.shared; }
  // A layer with only a fused backward (its weight part runs with dL/dx).
  bool fused() const {
    return layer() && std::visit(
                          [](auto const& l) {
                            return !layer_traits<std::decay_t<decltype(l)>>::has_split_backward;
                          },
                          *layer());
  }

  // Tensor t's [rows, width] block of a buffer holding live set `set`.
  template <class M>
  M block(M const& m, GraphLiveSet const& set, std::size_t t) const {
    if (set.tensors.size() == 1)
      return m;
    if (m.extent(1) != set.width || !m.span_is_contiguous())
      throw Error("telar::GraphChain: node '" + node_info().name + "': a packed live set of " +
                  std::to_string(set.width) + " values per sample needs a contiguous [" +
                  std::to_string(m.extent(0)) + ", " + std::to_string(set.width) + "] buffer");
    std::size_t const rows = m.extent(0);
    return M(m.data() + rows * set.offsets[set.find(t)], rows, width(t));
  }
  std::vector<CMat> inputs(Store const& st) const {
    std::vector<CMat> ins;
    for (std::size_t t : node_info().in_ids)
      ins.push_back(st.value[t]);
    return ins;
  }
  // dL/d(the node's output): arrived across the boundary after it, or the
  // sum its readers left in the table.
  CMat out_grad(CMat dy, saved_type const& saved) const {
    std::size_t const t = node_info().out_id;
    if (ends(saved))
      return block(dy, out_, t);
    Mat const g = saved.store().grad[t];
    if (!g.data())
      throw Error("telar::GraphChain: node '" + node_info().name +
                  "': its output's gradient was not computed before its backward");
    return g;
  }

  // A [rows, cols] buffer in `m`, reallocated only when the size changes.
  static Mat sized(Mat& m, std::size_t rows, std::size_t cols) {
    if (m.extent(0) != rows || m.extent(1) != cols)
      m = Mat(Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::GraphChain::buffer"), rows,
              cols);
    return m;
  }
  // A [rows, cols] view of the scratch buffer (as wide as the widest tensor
  // that gets a second gradient, so one allocation serves them all).
  Mat scratch(saved_type const& saved, std::size_t rows, std::size_t cols) const {
    sized(saved.scratch, rows, scratch_width_);
    return Mat(saved.scratch.data(), rows, cols);
  }

  // The layer's dL/dx; a fused layer reading the graph input (whose
  // gradient nobody uses) still runs, into that tensor's block of dx.
  template <class Exec, class Contribute>
  void input_grad(Exec const& exec, CMat g, Mat dx, saved_type const& saved,
                  Contribute& contribute) {
    std::size_t const t = node_info().in_ids[0];
    std::visit(
        [&](auto& l) {
          using L = std::decay_t<decltype(l)>;
          auto& inner = saved.inner.template at<L>(0);
          if constexpr (layer_traits<L>::has_split_backward)
            contribute(t, [&](Mat const& d) { l.backward_input(exec, g, d, inner); });
          else if (t == 0)
            l.backward(exec, g, block(dx, in_, t), inner);
          else
            contribute(t, [&](Mat const& d) { l.backward(exec, g, d, inner); });
        },
        *layer());
  }

  Graph* g_ = nullptr;
  std::size_t node_ = 0;
  bool first_ = false;               // the first node: nothing reads its dL/dx
  bool starts_ = true, ends_ = true; // stage boundaries before / after it
  GraphLiveSet in_, out_;
  std::size_t scratch_width_ = 0;
};

// GraphChain's saved state of one slot (one micro-batch in flight): every
// unit's, and the table they share.
template <class Variant>
struct GraphSlot {
  DynamicSaved<std::variant<GraphUnit<Variant>>> units;
  typename GraphUnit<Variant>::Store store;
};

// Unit k's saved state, pointed at the slot's table.
template <class V, class Index, class L>
auto& saved_at(GraphSlot<V>& slot, Index k, L&) {
  auto& s = slot.units.template at<L>(std::size_t(k));
  s.shared = &slot.store;
  return s;
}

} // namespace telar::detail
