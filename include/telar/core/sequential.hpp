#pragma once
/*! \file
 *  \brief telar::Sequential: a chain of layers and blocks, checked where it is
 *  formed; itself a layer, so chains nest. */
#include <telar/core/detail/activation_liveness.hpp>
#include <telar/core/detail/chain_run.hpp>
#include <telar/core/detail/counter_rng.hpp>
#include <telar/core/detail/host_simd.hpp>
#include <telar/core/detail/layer_walk.hpp>
#include <telar/core/detail/shared_pool.hpp>
#include <telar/core/detail/type_traits.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace telar {

namespace detail {

// Compile-time shape flowing out of a layer given the flow into it: a
// declared static_output_shape, else the input for shape-preserving layers.
template <class L>
constexpr Shape static_out(Shape in) {
  if constexpr (layer_traits<L>::static_output_shape.known())
    return layer_traits<L>::static_output_shape;
  else
    return flag_v<preserves_shape_t, L> ? in : Shape{};
}

template <class... Layers>
constexpr std::array<Shape, sizeof...(Layers) + 1> static_shape_flow() {
  std::array<Shape, sizeof...(Layers) + 1> flow{};
  std::array<Shape, sizeof...(Layers)> ins{layer_traits<Layers>::static_input_shape...};
  std::array<Shape (*)(Shape), sizeof...(Layers)> outs{&static_out<Layers>...};
  flow[0] = ins[0];
  for (std::size_t i = 0; i < sizeof...(Layers); ++i)
    flow[i + 1] = outs[i](ins[i].known() ? ins[i] : flow[i]);
  return flow;
}

// Index of the first layer whose static input shape differs from what the
// previous layers produce, or the layer count when all fit.
template <class... Layers>
constexpr std::size_t first_static_mismatch() {
  constexpr auto flow = static_shape_flow<Layers...>();
  constexpr std::array<Shape, sizeof...(Layers)> ins{layer_traits<Layers>::static_input_shape...};
  for (std::size_t i = 1; i < sizeof...(Layers); ++i)
    if (ins[i].known() && flow[i].known() && ins[i] != flow[i])
      return i;
  return sizeof...(Layers);
}

// Carries the failing index in its type so the compiler prints it.
template <std::size_t Layer, std::size_t Count>
struct StaticShapeCheck {
  static_assert(Layer == Count,
                "telar::Sequential: a layer's compile-time input shape (static_input_shape) "
                "differs from the shape the previous layer produces; see the layer index in "
                "StaticShapeCheck<index, count> below");
  static constexpr bool value = true;
};

template <class F, class Tuple, std::size_t... I>
void for_each_indexed(Tuple& t, F&& f, std::index_sequence<I...>) {
  (f(std::integral_constant<std::size_t, I>{}, std::get<I>(t)), ...);
}
template <class F, class Tuple, std::size_t... I>
void for_each_indexed_reverse(Tuple& t, F&& f, std::index_sequence<I...>) {
  constexpr std::size_t n = sizeof...(I);
  (f(std::integral_constant<std::size_t, n - 1 - I>{}, std::get<n - 1 - I>(t)), ...);
}

// Layer k's saved state in a compile-time chain (integral_constant index);
// DynamicSequential's run-time overload is found by argument lookup.
template <class Index, class L, class... S>
auto& saved_at(std::tuple<S...>& saved, Index, L&) {
  return std::get<Index::value>(saved);
}

// Element-wise dst += src over two [n, k] batches (residual connections).
template <class Exec, class D, class S>
void add_batch(Exec const& exec, D const& dst, S const& src) {
  std::size_t const n = dst.extent(0), k = dst.extent(1);
  auto* d = dst.data();
  auto const* s = src.data();
  simd_for(
      "telar::add_batch", exec, n * k, KOKKOS_LAMBDA(std::size_t i) { d[i] += s[i]; });
}

} // namespace detail

/*! \brief A chain of layers (or blocks) applied one after the other.
 *
 *  Every layer type is checked against the Layer concept here (see
 *  telar/core/layer.hpp); all layers must share value_type and memory_space;
 *  shapes known at compile time must agree between neighbours. Shapes known
 *  only at run time are checked by shapes() and build(), with a message
 *  naming the layer (index and name) and both shapes.
 *
 *  A Sequential is a layer itself: it nests, as a block that is one unit for
 *  pipeline partitioning, and its parameters are named by position
 *  ("layer3.1.weight": parameter weight of layer 1 of the block at layer 3),
 *  as PyTorch names nn.Sequential's.
 *  \code
 *  using Model = telar::Sequential<telar::Dense<float>, telar::ReLU<float>, telar::Dense<float>>;
 *  Model model(telar::Dense<float>(784, 256), telar::ReLU<float>{}, telar::Dense<float>(256, 10));
 *  \endcode
 *  \tparam Layers layer functor types, first to last
 */
template <class... Layers>
class Sequential : public detail::ChainWalk<Sequential<Layers...>>,
                   public detail::TensorParallelNames<Sequential<Layers...>> {
  static_assert(sizeof...(Layers) > 0, "telar::Sequential: a model needs at least one layer");
  static_assert((detail::check_layer<Layers>() && ...));

public:
  /*! \brief Scalar type of the whole model. */
  using value_type =
      typename layer_traits<std::tuple_element_t<0, std::tuple<Layers...>>>::value_type;
  /*! \brief Memory space of the whole model. */
  using memory_space =
      typename layer_traits<std::tuple_element_t<0, std::tuple<Layers...>>>::memory_space;
  /*! \brief Execution space that runs the model's kernels by default. */
  using execution_space = typename memory_space::execution_space;
  /*! \brief The layer types as a tuple. */
  using layers_type = std::tuple<Layers...>;
  /*! \brief As a nested block, what its backward reads: the input if its
   *  first layer reads it, the output if its last layer does. */
  static constexpr BackwardReads backward_reads =
      detail::chain_reads<std::tuple_element_t<0, layers_type>,
                          std::tuple_element_t<sizeof...(Layers) - 1, layers_type>>();
  /*! \brief Per-micro-batch saved state of every layer. */
  using saved_tuple = std::tuple<typename layer_traits<Layers>::saved_type...>;

  static_assert((std::is_same_v<typename layer_traits<Layers>::value_type, value_type> && ...),
                "telar::Sequential: all layers must have the same value_type");
  static_assert((std::is_same_v<typename layer_traits<Layers>::memory_space, memory_space> && ...),
                "telar::Sequential: all layers must have the same memory_space");
  static_assert(detail::StaticShapeCheck<detail::first_static_mismatch<Layers...>(),
                                         sizeof...(Layers)>::value);

  /*! \brief Number of layers. */
  static constexpr std::size_t size = sizeof...(Layers);
  /*! \brief Number of layers (as telar::DynamicSequential::layer_count). */
  static constexpr std::size_t layer_count() { return size; }

  /*! \brief Default-constructed layers. */
  Sequential() = default;
  /*! \brief \param layers the configured layers, first to last */
  explicit Sequential(Layers... layers) : layers_(std::move(layers)...) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "Sequential"; }
  /*! \brief backward_weight reuses the inner gradients of backward_input:
   *  run together, the input part goes first (else it would be computed twice). */
  static constexpr bool backward_input_first = true;

  /*! \brief Layer \p I. \tparam I index */
  template <std::size_t I>
  auto& layer() {
    return std::get<I>(layers_);
  }
  /*! \brief Layer \p I. \tparam I index */
  template <std::size_t I>
  auto const& layer() const {
    return std::get<I>(layers_);
  }
  /*! \brief All layers. */
  layers_type& layers() { return layers_; }
  /*! \brief All layers. */
  layers_type const& layers() const { return layers_; }

  /*! \brief Calls f(std::integral_constant<size_t, I>, layer) for each layer, first to last.
   *  \param f the visitor */
  template <class F>
  void for_each_layer(F&& f) {
    detail::for_each_indexed(layers_, f, std::index_sequence_for<Layers...>{});
  }
  /*! \brief Const overload. \param f the visitor */
  template <class F>
  void for_each_layer(F&& f) const {
    detail::for_each_indexed(layers_, f, std::index_sequence_for<Layers...>{});
  }
  /*! \brief Calls f(std::integral_constant<size_t, I>, layer) for each layer, last to first.
   *  \param f the visitor */
  template <class F>
  void for_each_layer_reverse(F&& f) {
    detail::for_each_indexed_reverse(layers_, f, std::index_sequence_for<Layers...>{});
  }

  /*! \brief Per-sample shapes along the chain: entry k is the input of layer
   *  k, the last entry the output.
   *  \param in per-sample shape of the input
   *  \throws ShapeError naming the first layer that cannot take its input,
   *  with both shapes */
  std::vector<Shape> shapes(Shape const& in) const {
    std::vector<Shape> s{in};
    for_each_layer([&](auto index, auto const& l) { s.push_back(next_shape(index, l, s.back())); });
    return s;
  }

  /*! \brief The first layer's required input shape, if it declares one. */
  Shape input_shape() const { return expected_input(std::get<0>(layers_)); }

  /*! \brief Calls initialize on layers [first, last) that have one, each with
   *  its own stream derived from \p seed and the layer index, so the values do
   *  not depend on which rank initialises which layer.
   *  \param seed model seed \param first first layer \param last one past the last layer */
  void initialize(std::uint64_t seed, std::size_t first = 0, std::size_t last = size) {
    for_each_layer([&](auto index, auto& l) {
      if (index >= first && index < last)
        detail::initialize_layer(l, detail::mix_seed(seed, index));
    });
  }

  using detail::TensorParallelNames<Sequential>::set_tensor_parallel;

  /*! \brief What a nested chain keeps per micro-batch: its layers' saved
   *  state and its inner activations and gradients (reused between steps). */
  struct saved_type {
    saved_tuple inner;                                 //!< each layer's saved state
    std::vector<Matrix<value_type, memory_space>> act; //!< act[k]: input of layer k, k >= 1
    mutable std::vector<Matrix<value_type, memory_space>> grad; //!< grad[k]: dL/d act[k]
    mutable Matrix<value_type, memory_space> scratch; //!< dx of a first fused layer, unused
    mutable bool grads_ready = false; //!< backward_input ran since the last backward_weight
  };

  /*! \brief The stage's shared pool (detail/shared_pool.hpp), set by the
   *  stage runner on the blocks it runs: from then on the inner tensors no
   *  backward reads, and the inner gradients of a fused backward(), live
   *  there at \p depth instead of with each micro-batch, and inner layers
   *  that can keep a compact copy of what they read do so (as between a
   *  stage's layers). Blocks inside get depth + 1.
   *  \param pool the pool \param depth this chain's nesting depth */
  void set_shared_pool(typename detail::PoolHandle<value_type, memory_space>::Pool const& pool,
                       std::size_t depth) {
    pool_.set(pool, depth);
    live_ = detail::activation_liveness(*this, 0, size);
    for_each_layer([&](auto, auto& l) { detail::pass_shared_pool(l, pool, depth + 1); });
  }
  /*! \brief saved_bytes() under a shared pool: the inner activations a
   *  backward reads, the inner gradients only when \p split (backward_input
   *  and backward_weight apart), the layers' saved state (compact copies,
   *  pooled blocks). \param samples rows \param in input shape
   *  \param split whether backward runs as two calls */
  std::size_t pooled_saved_bytes(std::size_t samples, Shape const& in, bool split) const {
    auto const s = shapes(in);
    detail::Liveness const live = detail::activation_liveness(*this, 0, size);
    std::size_t n = 0;
    for (std::size_t k = 1; k < size; ++k)
      n += (live.kept[k] + split) * detail::view_bytes<value_type>(samples * s[k].size());
    for_each_layer([&](auto index, auto const& l) {
      n += detail::pooled_saved_bytes_of(l, samples, s[index], live.compact[index], split);
    });
    return n;
  }
  /*! \brief What the shared pool holds for this chain at \p depth (and its
   *  blocks below), per sample. \param in input shape \param split see
   *  pooled_saved_bytes() \param most per-depth extents, raised in place
   *  \param depth this chain's depth */
  void pool_extents(Shape const& in, bool split, detail::PoolExtents& most,
                    std::size_t depth) const {
    auto const s = shapes(in);
    detail::Liveness const live = detail::activation_liveness(*this, 0, size);
    for (std::size_t k = 1; k < size; ++k)
      if (!split || !live.kept[k])
        detail::note_pool_extent(most, depth, k, s[k].size());
    for_each_layer([&](auto index, auto const& l) {
      detail::pool_extents_of(l, s[index], split, most, depth + 1);
    });
  }

  /*! \brief Runs the chain (as a nested block). \param exec execution space instance
   *  \param x input [n, in] \param y output [n, out] \param saved per-micro-batch state */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<value_type, memory_space> x,
               Matrix<value_type, memory_space> y, saved_type& saved) {
    std::size_t const n = x.extent(0);
    ensure(saved.act, n, "telar::Sequential::activation",
           [&](std::size_t k) { return !pool_ || live_.kept[k]; });
    saved.grads_ready = false; // gradients of an earlier micro-batch in this slot are stale
    std::vector<Matrix<value_type, memory_space>> act = saved.act;
    if (pool_) {
      pool_->reserve(pool_.depth(), n, inner_extents(false));
      for (std::size_t k = 1; k < size; ++k)
        if (!live_.kept[k])
          act[k] = pool_->at(pool_.depth(), k, n, shapes_[k].size());
    }
    for_each_layer([&](auto index, auto const& l) {
      if constexpr (layer_traits<std::decay_t<decltype(l)>>::has_compact_copy)
        std::get<decltype(index)::value>(saved.inner).compact = pool_ && live_.compact[index];
    });
    detail::chain_forward(*this, exec, x, y, act, inner_of(saved));
  }

  /*! \brief backward_input and backward_weight in one call (schedules that
   *  do not split them): under a shared pool the inner gradients live
   *  there, not with the micro-batch. \param exec execution space instance
   *  \param dy gradient of the output \param dx gradient of the input
   *  (wanted) \param saved state */
  template <class Exec>
  void backward(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                Matrix<value_type, memory_space> dx, saved_type const& saved) {
    if (!pool_) {
      backward_input(exec, dy, dx, saved);
      backward_weight(exec, dy, saved);
      return;
    }
    std::size_t const n = dy.extent(0);
    pool_->reserve(pool_.depth(), n, inner_extents(true));
    std::vector<Matrix<value_type, memory_space>> grad(size);
    for (std::size_t k = 1; k < size; ++k)
      grad[k] = pool_->at(pool_.depth(), k, n, shapes_[k].size());
    detail::chain_backward_fused(*this, exec, dy, dx, grad, inner_of(saved));
    saved.grads_ready = false;
  }

  /*! \brief dL/dx through the chain, keeping every inner gradient for
   *  backward_weight. \param exec execution space instance
   *  \param dy gradient of the output \param dx gradient of the input \param saved state */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                      Matrix<value_type, memory_space> dx, saved_type const& saved) {
    propagate(exec, dy, dx, saved, true);
  }

  /*! \brief dL/dW of every layer (after backward_input, or on its own when
   *  nothing needs dL/dx). \param exec execution space instance
   *  \param dy gradient of the output \param saved state */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                       saved_type const& saved) {
    if (!saved.grads_ready)
      propagate(exec, dy, Matrix<value_type, memory_space>(), saved, false);
    detail::chain_backward_weight(*this, exec, dy, saved.grad, inner_of(saved));
    saved.grads_ready = false;
  }

private:
  friend detail::TensorParallelNames<Sequential>;
  using detail::ChainWalk<Sequential>::shapes_;

  template <class L>
  static Shape expected_input(L const& l) {
    if constexpr (detail::is_detected_v<detail::input_shape_t, L>)
      return l.input_shape();
    else
      return layer_traits<L>::static_input_shape;
  }

  template <class Index, class L>
  Shape next_shape(Index index, L const& l, Shape const& have) const {
    Shape const expect = expected_input(l);
    if (expect.known() && expect != have)
      throw ShapeError("telar::Sequential: " + detail::layer_label(index, layer_name(l)) +
                       " expects input " + expect.str() + " but " +
                       detail::chain_input_source(*this, index) + " produces " + have.str());
    return detail::chain_next_shape("telar::Sequential", *this, index, l, have);
  }

  // Layer k's entry of a micro-batch's saved tuple, for the chain walks.
  template <class Saved>
  static auto inner_of(Saved& saved) {
    return [p = &saved](auto index, auto const&) -> auto& {
      return std::get<decltype(index)::value>(p->inner);
    };
  }

  // Calls f(layer, rest) for parameter "<index>.<rest>"'s layer.
  template <class F>
  void with_parameter_layer(std::string const& name, F&& f) const {
    std::size_t const dot = name.find('.');
    if (dot == std::string::npos)
      return;
    std::size_t const which = std::stoul(name.substr(0, dot));
    std::string const rest = name.substr(dot + 1);
    for_each_layer([&](auto index, auto const& l) {
      if (index == which)
        f(l, rest);
    });
  }

  template <class Keep = bool (*)(std::size_t)>
  void ensure(
      std::vector<Matrix<value_type, memory_space>>& bufs, std::size_t n, char const* label,
      Keep keep = [](std::size_t) { return true; }) const {
    if (shapes_.size() != size + 1)
      throw Error("telar::Sequential: a nested block was run before build(input shape)");
    detail::size_chain_buffers(bufs, shapes_, n, size - 1, label, keep);
  }
  // Per-sample extents of the pool's two buffers for this chain's inner
  // tensors: the dead activations, and every gradient when `grads`.
  std::pair<std::size_t, std::size_t> inner_extents(bool grads) const {
    return detail::shared_extents(detail::feature_sizes(shapes_), 0, size,
                                  [&](std::size_t k) { return grads || !live_.kept[k]; });
  }

  template <class Exec>
  void propagate(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                 Matrix<value_type, memory_space> dx, saved_type const& saved, bool need_dx) {
    std::size_t const n = dy.extent(0);
    ensure(saved.grad, n, "telar::Sequential::activation_grad");
    detail::chain_backward_input(*this, exec, dy, dx, saved.grad, inner_of(saved), need_dx, [&] {
      return detail::sized_matrix(saved.scratch, n, shapes_[0].size(),
                                  "telar::Sequential::scratch");
    });
    saved.grads_ready = true;
  }

  layers_type layers_;
  detail::PoolHandle<value_type, memory_space> pool_; // the stage's, when set
  detail::Liveness live_; // inner tensors kept per micro-batch under the pool
};

/*! \brief True for telar::Sequential types. \tparam M a type */
template <class M>
inline constexpr bool is_sequential_v = false;
/*! \brief True for telar::Sequential types. \tparam Ls layer types */
template <class... Ls>
inline constexpr bool is_sequential_v<Sequential<Ls...>> = true;

namespace detail {
// Blocks whose for_each_layer(f(index, layer)) reaches their inner layers:
// chains, and the run-time graph (specialised in dynamic_graph.hpp). What
// for_each_stochastic descends into (dropout switches, random counters).
template <class L>
inline constexpr bool has_layer_walk_v = is_sequential_v<L>;
} // namespace detail

} // namespace telar
