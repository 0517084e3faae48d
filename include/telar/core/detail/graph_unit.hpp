#pragma once
// One node of a telar::DynamicGraph as a unit of telar::GraphChain: a layer
// whose input and output are the graph's live sets before and after the
// node, packed. A live set holds every tensor produced before a cut and read
// after it (and the graph output at the end), side by side in one
// [samples, sum of widths] batch, so a pipeline boundary that sends one
// activation sends them all (a U-Net's skips included). The node reads its
// inputs from the packed batch, and copies the tensors it does not touch
// through; gradients go the other way.
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

template <class Variant>
class GraphUnit {
  using Graph = DynamicGraph<Variant>;
  using First = std::variant_alternative_t<0, Variant>;

public:
  using value_type = typename layer_traits<First>::value_type;
  using memory_space = typename layer_traits<First>::memory_space;
  // backward_weight takes the node's output gradient that backward_input unpacked.
  static constexpr bool backward_input_first = true;
  using Mat = Matrix<value_type, memory_space>;
  using CMat = ConstMatrix<value_type, memory_space>;

  // What one micro-batch keeps: the node's state and the unpacked copies.
  struct saved_type {
    mutable DynamicSaved<Variant> inner; // the node layer's state (entry 0)
    std::vector<CMat> ins;               // the node's input values (views)
    std::vector<Mat> unpacked;           // copies of inputs out of a packed batch
    Mat out;                             // the node's output, when y holds more
    mutable Mat gout;                    // dL/d out, when dy holds more
    mutable std::vector<Mat> gin;        // dL/d each input-set tensor, when dx holds more
    mutable Mat scratch;                 // one contribution before it is added
    mutable Mat unused_dx;               // dL/d input set nobody reads (the first node)
    mutable bool grads_ready = false;    // backward_input ran since the last backward_weight
  };

  GraphUnit() = default;
  // Node `node` at position `position` of the order; `in`, `out`: the live
  // sets before and after it.
  GraphUnit(Graph* g, std::size_t node, std::size_t position, GraphLiveSet in, GraphLiveSet out)
      : g_(g), node_(node), first_(position == 0), in_(std::move(in)), out_(std::move(out)) {
    scratch_width_ = 0;
    auto const& ids = node_info().in_ids;
    for (std::size_t j = 0; j < ids.size(); ++j)
      if (out_.holds(ids[j]) || std::count(ids.begin(), ids.end(), ids[j]) > 1)
        scratch_width_ = std::max(scratch_width_, width(ids[j]));
  }

  static constexpr char const* name() { return "DynamicGraph node"; }
  void reseat(Graph* g) { g_ = g; }
  std::size_t node() const { return node_; }
  GraphLiveSet const& input_set() const { return in_; }
  GraphLiveSet const& output_set() const { return out_; }

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
  // The layer's state plus what unpacking needs: going forward, copies of
  // the inputs and the output when the batch holds more; going back, every
  // input-set tensor's gradient and the output's likewise, the scratch for
  // a tensor's second gradient, and the first node's unread dL/dx.
  std::size_t saved_bytes(std::size_t samples, Shape const&) const {
    auto const& n = node_info();
    std::size_t bytes = 0;
    if (layer())
      std::visit(
          [&](auto const& l) { bytes = saved_bytes_of(l, samples, g_->shapes_[n.in_ids[0]]); },
          *layer());
    auto const matrix = [&](std::size_t cols) { return view_bytes<value_type>(samples * cols); };
    if (in_.tensors.size() > 1) {
      for (std::size_t t : n.in_ids)
        bytes += matrix(width(t));
      for (std::size_t t : in_.tensors)
        bytes += matrix(width(t));
    }
    if (packed_out())
      bytes += 2 * matrix(width(n.out_id));
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

  template <class Exec>
  void forward(Exec const& exec, CMat x, Mat y, saved_type& saved) {
    auto const& n = node_info();
    std::size_t const rows = x.extent(0);
    saved.grads_ready = false;
    saved.ins.clear();
    saved.unpacked.resize(n.in_ids.size());
    for (std::size_t j = 0; j < n.in_ids.size(); ++j)
      saved.ins.push_back(in_.tensors.size() == 1 ? x : unpack(exec, x, n.in_ids[j], saved, j));
    Mat const out = packed_out() ? sized(saved.out, rows, width(n.out_id)) : y;
    if (layer())
      std::visit(
          [&](auto& l) {
            using L = std::decay_t<decltype(l)>;
            l.forward(exec, saved.ins[0], out, saved.inner.template at<L>(0));
          },
          *layer());
    else
      g_->join_forward(exec, n, out, saved.ins);
    if (packed_out())
      for (std::size_t a = 0; a < out_.tensors.size(); ++a) {
        std::size_t const t = out_.tensors[a];
        auto const dst = graph_columns(y, out_.offsets[a], width(t));
        if (t == n.out_id)
          Kokkos::deep_copy(exec, dst, CMat(out));
        else
          Kokkos::deep_copy(exec, dst, columns(x, t));
      }
  }

  // dL/d input set: the node's input gradients plus the gradients of the
  // tensors passed through, summed per tensor.
  template <class Exec>
  void backward_input(Exec const& exec, CMat dy, Mat dx, saved_type const& saved) {
    auto const& n = node_info();
    std::size_t const rows = dy.extent(0);
    CMat const g = out_grad(exec, dy, saved);
    bool const direct = in_.tensors.size() == 1;
    saved.gin.resize(in_.tensors.size());
    std::vector<bool> started(in_.tensors.size(), false);
    for (std::size_t a = 0; a < in_.tensors.size(); ++a) {
      std::size_t const t = in_.tensors[a], b = out_.find(t);
      if (!direct)
        sized(saved.gin[a], rows, width(t));
      if (b < out_.tensors.size()) { // passed through: its gradient starts from dy's
        started[a] = true;
        Kokkos::deep_copy(exec, grad_of(a, dx, saved),
                          graph_columns(dy, out_.offsets[b], width(t)));
      }
    }
    auto const contribute = [&](std::size_t t, auto&& write) {
      std::size_t const a = in_.find(t);
      Mat const own = grad_of(a, dx, saved);
      if (!started[a]) {
        started[a] = true;
        write(own);
      } else {
        Mat const s = scratch(saved, rows, width(t));
        write(s);
        add_batch(exec, own, s);
      }
    };
    if (layer())
      input_grad(exec, g, saved, contribute);
    else
      g_->join_input_grads(exec, n, g, saved.ins, contribute);
    if (!direct)
      for (std::size_t a = 0; a < in_.tensors.size(); ++a)
        Kokkos::deep_copy(exec, graph_columns(dx, in_.offsets[a], width(in_.tensors[a])),
                          saved.gin[a]);
    saved.grads_ready = true;
  }

  template <class Exec>
  void backward_weight(Exec const& exec, CMat dy, saved_type const& saved) {
    // Nothing needed dL/dx (the first node): a split layer only needs its
    // output gradient, a fused one runs whole into a buffer nobody reads.
    if (!saved.grads_ready && fused())
      backward_input(exec, dy, sized(saved.unused_dx, dy.extent(0), in_.width), saved);
    else if (!saved.grads_ready)
      out_grad(exec, dy, saved);
    if (layer())
      std::visit(
          [&](auto& l) {
            using L = std::decay_t<decltype(l)>;
            if constexpr (layer_traits<L>::has_split_backward &&
                          layer_traits<L>::has_backward_weight)
              l.backward_weight(exec, packed_out() ? CMat(saved.gout) : dy,
                                saved.inner.template at<L>(0));
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
  bool packed_out() const { return out_.tensors.size() > 1; }
  // A layer with only a fused backward (its weight part runs with dL/dx).
  bool fused() const {
    return layer() && std::visit(
                          [](auto const& l) {
                            return !layer_traits<std::decay_t<decltype(l)>>::has_split_backward;
                          },
                          *layer());
  }

  // A [rows, cols] buffer in `m`, reallocated only when the size changes.
  static Mat sized(Mat& m, std::size_t rows, std::size_t cols) {
    if (m.extent(0) != rows || m.extent(1) != cols)
      m = Mat(Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::GraphChain::unpacked"), rows,
              cols);
    return m;
  }
  // A [rows, cols] view of the scratch buffer (as wide as the widest tensor
  // that gets a second gradient, so one allocation serves them all).
  Mat scratch(saved_type const& saved, std::size_t rows, std::size_t cols) const {
    sized(saved.scratch, rows, scratch_width_);
    return Mat(saved.scratch.data(), rows, cols);
  }
  template <class M>
  auto columns(M const& packed, std::size_t t) const {
    return graph_columns(packed, in_.offsets[in_.find(t)], width(t));
  }
  template <class Exec>
  CMat unpack(Exec const& exec, CMat x, std::size_t t, saved_type& saved, std::size_t j) const {
    Mat const m = sized(saved.unpacked[j], x.extent(0), width(t));
    Kokkos::deep_copy(exec, m, columns(x, t));
    return m;
  }
  template <class Exec>
  CMat out_grad(Exec const& exec, CMat dy, saved_type const& saved) const {
    if (!packed_out())
      return dy;
    std::size_t const t = node_info().out_id;
    Mat const m = sized(saved.gout, dy.extent(0), width(t));
    Kokkos::deep_copy(exec, m, graph_columns(dy, out_.offsets[out_.find(t)], width(t)));
    return m;
  }
  Mat grad_of(std::size_t a, Mat const& dx, saved_type const& saved) const {
    return in_.tensors.size() == 1 ? dx : saved.gin[a];
  }

  template <class Exec, class Contribute>
  void input_grad(Exec const& exec, CMat g, saved_type const& saved, Contribute& contribute) {
    std::visit(
        [&](auto& l) {
          using L = std::decay_t<decltype(l)>;
          auto& inner = saved.inner.template at<L>(0);
          contribute(node_info().in_ids[0], [&](Mat const& dx) {
            if constexpr (layer_traits<L>::has_split_backward)
              l.backward_input(exec, g, dx, inner);
            else
              l.backward(exec, g, dx, inner);
          });
        },
        *layer());
  }

  Graph* g_ = nullptr;
  std::size_t node_ = 0;
  bool first_ = false; // the first node: nothing reads its dL/dx
  GraphLiveSet in_, out_;
  std::size_t scratch_width_ = 0;
};

} // namespace telar::detail
