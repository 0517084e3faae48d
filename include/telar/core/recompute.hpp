#pragma once
/*! \file
 *  \brief telar::Recompute: activation recomputation (gradient checkpointing)
 *  as a layer wrapper, and telar::RecomputeAll for a whole model.
 *
 *  `telar::Recompute<L>` wraps any layer or block `L` (a Sequential, a
 *  Residual, a single layer). Its forward runs `L`'s forward and keeps only
 *  the input view (the checkpoint); `L`'s saved state goes back to a small
 *  workspace owned by the wrapper. Its backward re-runs `L`'s forward from
 *  the checkpoint to rebuild that state, then runs `L`'s backward. Because
 *  the wrapper is itself a layer, it composes with every schedule, strategy
 *  and block unchanged:
 *  \code
 *  using Block = telar::Sequential<telar::Dense<float>, telar::GELU<float>, telar::Dense<float>>;
 *  // Selective: only the middle block is recomputed.
 *  using Model = telar::Sequential<telar::Dense<float>, telar::Recompute<Block>,
 * telar::Dense<float>>;
 *  // Full: every top-level unit is recomputed.
 *  using Plain = telar::Sequential<telar::Dense<float>, Block, telar::Dense<float>>;
 *  telar::RecomputeAll<Plain> full = telar::recompute_all(Plain(...));
 *  \endcode
 *
 *  Lifetime of the rebuilt state: with a split backward, the state rebuilt by
 *  `backward_input` stays alive until `backward_weight` of the same
 *  micro-batch (zero-bubble schedules run them far apart), then returns to
 *  the workspace. So `L`'s saved state exists only between recomputation
 *  and W: the workspace holds as many states as micro-batches are between B
 *  and W at once (at least one, reused by every forward), not one per
 *  micro-batch in flight.
 *
 *  Tensor-parallel layers inside (telar::RowParallel) repeat their forward
 *  allreduce when recomputed; every rank of the group recomputes at the same
 *  point of the schedule, so the collectives still match.
 *
 *  Stochastic layers replay exactly when their randomness is a pure function
 *  of (seed, counter, element) and they expose the counter as
 *  `std::uint64_t random_counter() const` and
 *  `void set_random_counter(std::uint64_t)`: the wrapper records the counter
 *  of every such layer inside (through Sequential, Residual and the other blocks
 *  of branches, and nested
 *  Recompute) before the forward, sets it back for the recomputation and
 *  restores the current value afterwards.
 */
#include <telar/core/detail/type_traits.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/residual.hpp>
#include <telar/core/sequential.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace telar {

template <class L>
class Recompute;

namespace detail {

template <class L>
using random_counter_t = decltype(std::uint64_t(std::declval<L const&>().random_counter()));
template <class L>
using set_random_counter_t = decltype(std::declval<L&>().set_random_counter(std::uint64_t{}));
template <class L>
using body_t = decltype(std::declval<L&>().body());
struct AnyBranchVisitor {
  template <class I, class B>
  void operator()(I, B&) const {}
};
template <class L>
using for_each_branch_t =
    decltype(std::declval<L&>().for_each_branch(std::declval<AnyBranchVisitor&>()));

template <class L>
inline constexpr bool is_recompute_v = false;
template <class L>
inline constexpr bool is_recompute_v<Recompute<L>> = true;

/// True for a layer whose randomness is keyed by a counter it exposes.
template <class L>
inline constexpr bool is_stochastic_v =
    is_detected_v<random_counter_t, L>&& is_detected_v<set_random_counter_t, L>;

// Calls f(layer) for `l` and every layer nested in it, depth first, in a
// fixed order: through Sequential, DynamicGraph, blocks of branches
// (Residual: body, then projection; Concat, Add, Mul: branch 0 first) and
// nested Recompute. `L` may be const.
template <class L, class F>
void walk_layers(L& l, F& f) {
  using U = std::remove_const_t<L>;
  f(l);
  if constexpr (has_layer_walk_v<U>) {
    l.for_each_layer([&](auto, auto& inner) { walk_layers(inner, f); });
  } else if constexpr (is_recompute_v<U>) {
    walk_layers(l.inner(), f);
  } else if constexpr (is_detected_v<for_each_branch_t, U>) {
    l.for_each_branch([&](auto, auto& inner) { walk_layers(inner, f); });
  } else if constexpr (is_detected_v<body_t, U>) {
    walk_layers(l.body(), f);
  }
}

// A layer walk_layers() enters: it holds other layers.
template <class L>
inline constexpr bool is_block_v = has_layer_walk_v<L> || is_recompute_v<L> ||
                                   is_detected_v<for_each_branch_t, L> || is_detected_v<body_t, L>;

// Calls f(layer) for every stochastic layer in `l`, in walk_layers() order.
template <class L, class F>
void for_each_stochastic(L& l, F& f) {
  auto visit = [&](auto& x) {
    if constexpr (is_stochastic_v<std::decay_t<decltype(x)>>)
      f(x);
  };
  walk_layers(l, visit);
}

template <class L>
struct RecomputeState {
  using T = typename layer_traits<L>::value_type;
  using M = typename layer_traits<L>::memory_space;
  typename layer_traits<L>::saved_type inner; // L's saved state
  Matrix<T, M> out;                           // output of the recomputed forward
  std::uint64_t owner = 0;                    // token of the saved object holding it; 0: free
};

template <class L>
struct RecomputeSaved {
  using T = typename layer_traits<L>::value_type;
  using M = typename layer_traits<L>::memory_space;
  ConstMatrix<T, M> x;                              // the checkpoint (a view, no copy)
  std::vector<std::uint64_t> counters;              // random counters before the forward
  mutable std::shared_ptr<RecomputeState<L>> state; // the rebuilt state, or null
  mutable std::uint64_t token = 0;                  // state is ours while state->owner == token
  mutable bool weight_done = false;                 // backward_weight ran since the forward
};

// The backward members Recompute<L> offers, by what L offers: split with a
// weight part, split without, or fused. (Members disabled by SFINAE would
// still be found by the concept's "wrong signature" checks.)
template <class Derived, class L, bool Split = layer_traits<L>::has_split_backward,
          bool Weight = layer_traits<L>::has_backward_weight>
struct RecomputeBackward {
  using T = typename layer_traits<L>::value_type;
  using M = typename layer_traits<L>::memory_space;
  template <class Exec>
  void backward(Exec const& exec, ConstMatrix<T, M> dy, Matrix<T, M> dx,
                RecomputeSaved<L> const& saved) {
    static_cast<Derived*>(this)->fused_part(exec, dy, dx, saved);
  }
};
template <class Derived, class L>
struct RecomputeBackward<Derived, L, true, false> {
  using T = typename layer_traits<L>::value_type;
  using M = typename layer_traits<L>::memory_space;
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, M> dy, Matrix<T, M> dx,
                      RecomputeSaved<L> const& saved) {
    static_cast<Derived*>(this)->input_part(exec, dy, dx, saved);
  }
};
template <class Derived, class L>
struct RecomputeBackward<Derived, L, true, true> : RecomputeBackward<Derived, L, true, false> {
  using T = typename layer_traits<L>::value_type;
  using M = typename layer_traits<L>::memory_space;
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<T, M> dy, RecomputeSaved<L> const& saved) {
    static_cast<Derived*>(this)->weight_part(exec, dy, saved);
  }
};

template <class L>
constexpr char const* recompute_name() {
  if constexpr (is_detected_v<static_name_t, L>)
    return L::name();
  else
    return "layer";
}

} // namespace detail

/*! \brief Activation recomputation for one layer or block \p L: keeps only
 *  the input (the checkpoint) from forward and re-runs \p L's forward during
 *  backward.
 *
 *  Everything but the saved state passes through to \p L: output_shape,
 *  build, initialize, parameters (with unchanged names, so checkpoints and
 *  naming do not depend on recomputation), flops, name, set_tensor_parallel,
 *  parameter_replicas and compile-time shapes. It offers a split backward
 *  (backward_input, plus backward_weight when \p L has one) when \p L does,
 *  and a fused backward when \p L has only that.
 *
 *  Cost: one extra forward of \p L per micro-batch. Memory: per micro-batch
 *  in flight, a view of the input instead of \p L's saved state; the wrapper
 *  keeps a workspace of \p L's saved states (and output buffers) sized by the
 *  number of micro-batches between backward_input and backward_weight at
 *  once, at least one (see states_allocated()).
 *
 *  backward_input and backward_weight (or backward) are inherited from
 *  detail::RecomputeBackward, which offers exactly those \p L has (a layer
 *  without parameters gets no backward_weight).
 *
 *  \tparam L a layer or block (checked against the Layer concept) */
template <class L>
class Recompute : public detail::RecomputeBackward<Recompute<L>, L> {
  static_assert(detail::check_layer<L>());
  friend struct detail::RecomputeBackward<Recompute<L>, L>;
  friend struct detail::RecomputeBackward<Recompute<L>, L, true, false>; // its input part
  using Traits = layer_traits<L>;
  using InnerSaved = typename Traits::saved_type;
  static constexpr bool with_weight = Traits::has_split_backward && Traits::has_backward_weight;

public:
  /*! \brief Scalar type (L's). */
  using value_type = typename Traits::value_type;
  /*! \brief Memory space (L's). */
  using memory_space = typename Traits::memory_space;
  /*! \brief The wrapped layer's type. */
  using layer_type = L;
  /*! \brief L's compile-time input shape, if it declares one. */
  static constexpr Shape static_input_shape = Traits::static_input_shape;
  /*! \brief L's compile-time output shape, if it declares one. */
  static constexpr Shape static_output_shape = Traits::static_output_shape;
  /*! \brief L's preserves_shape (false if it has none). */
  static constexpr bool preserves_shape = detail::flag_v<detail::preserves_shape_t, L>;
  /*! \brief Run together (non-split schedules), the input part goes first:
   *  it recomputes once and backward_weight reuses the rebuilt state (and a
   *  block's inner gradients) right after, then drops it. */
  static constexpr bool backward_input_first = true;

  /*! \brief One entry of the wrapper's workspace: L's saved state and the
   *  output buffer of its recomputed forward. */
  using State = detail::RecomputeState<L>;
  /*! \brief What one micro-batch keeps: the input view (the checkpoint), the
   *  random counters of the stochastic layers inside at forward time, and,
   *  between backward_input and backward_weight only, the rebuilt state. */
  using saved_type = detail::RecomputeSaved<L>;

  /*! \brief A default-constructed \p L. */
  Recompute() = default;
  /*! \brief Wraps \p layer. \param layer the layer or block to recompute */
  explicit Recompute(L layer) : layer_(std::move(layer)) {}
  /*! \brief A copy of the layer, with an empty workspace. \param o the original */
  Recompute(Recompute const& o)
      : layer_(o.layer_), tp_size_(o.tp_size_), built_out_(o.built_out_) {}
  /*! \brief Moves the layer, with an empty workspace. \param o the original */
  Recompute(Recompute&& o) noexcept
      : layer_(std::move(o.layer_)), tp_size_(o.tp_size_), built_out_(o.built_out_) {}
  /*! \brief Copies the layer; the workspace is dropped. \param o the original */
  Recompute& operator=(Recompute const& o) {
    layer_ = o.layer_;
    tp_size_ = o.tp_size_;
    built_out_ = o.built_out_;
    free_.clear();
    pending_.reset();
    allocated_ = 0;
    return *this;
  }
  /*! \brief Moves the layer; the workspace is dropped. \param o the original */
  Recompute& operator=(Recompute&& o) noexcept {
    layer_ = std::move(o.layer_);
    tp_size_ = o.tp_size_;
    built_out_ = o.built_out_;
    free_.clear();
    pending_.reset();
    allocated_ = 0;
    return *this;
  }

  /*! \brief The wrapped layer. */
  L& inner() { return layer_; }
  /*! \brief The wrapped layer. */
  L const& inner() const { return layer_; }

  /*! \brief L's name (so messages and traces name the layer, not the wrapper). */
  static constexpr char const* name() { return detail::recompute_name<L>(); }

  /*! \brief L's output shape. \param in input shape */
  Shape output_shape(Shape const& in) const { return layer_.output_shape(in); }
  /*! \brief L's required input shape: its input_shape(), else its static one. */
  Shape input_shape() const {
    if constexpr (detail::is_detected_v<detail::input_shape_t, L>)
      return layer_.input_shape();
    else
      return static_input_shape;
  }
  /*! \brief Builds L for input \p in (if it has build()) and sizes the
   *  recomputed output; call once before forward (Sequential does).
   *  \param in input shape */
  void build(Shape const& in) {
    built_out_ = layer_.output_shape(in).size();
    if constexpr (Traits::has_build)
      layer_.build(in);
  }
  /*! \brief Initialises L (if it has initialize()). \param seed stream seed */
  void initialize(std::uint64_t seed) { detail::initialize_layer(layer_, seed); }
  /*! \brief L's parameter count (0 if it has none). */
  std::size_t parameter_count() const { return detail::parameter_count_of(layer_); }
  /*! \brief Per micro-batch only the checkpoint (a view) is kept: 0. */
  std::size_t saved_bytes(std::size_t, Shape const&) const { return 0; }
  /*! \brief One state rebuilt in backward (L's saved state and output),
   *  kept by the layer for reuse: the layer holds as many as micro-batches
   *  between backward_input and backward_weight at once (one when they run
   *  together). \param samples rows \param in input shape */
  std::size_t rebuilt_bytes(std::size_t samples, Shape const& in) const {
    return detail::view_bytes<value_type>(samples * built_out_) +
           detail::saved_bytes_of(layer_, samples, in);
  }
  /*! \brief L's workspace (the recomputation reuses it). \param samples rows
   *  \param in input shape */
  std::size_t workspace_bytes(std::size_t samples, Shape const& in) const {
    return detail::workspace_bytes_of(layer_, samples, in);
  }
  /*! \brief L's cost estimate (the default, samples x inputs, if it has none);
   *  the recomputation is not counted. \param samples rows \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    if constexpr (detail::is_detected_v<detail::flops_t, L>)
      return layer_.flops(samples, in);
    else
      return double(samples) * double(in.size());
  }
  /*! \brief L's parameters, under their own names. \param f callable as
   *  f(char const*, View&, View&) */
  template <class F, class LL = L, std::enable_if_t<layer_traits<LL>::has_parameters, int> = 0>
  void parameters(F&& f) {
    layer_.parameters(std::forward<F>(f));
  }
  /*! \brief L's buffers, under their own names. \param f callable as
   *  f(char const*, View&) */
  template <class F, class LL = L, std::enable_if_t<layer_traits<LL>::has_buffers, int> = 0>
  void buffers(F&& f) {
    layer_.buffers(std::forward<F>(f));
  }
  /*! \brief L's buffer values (0 if it has none). */
  std::size_t buffer_count() const { return detail::buffer_count_of(layer_); }
  /*! \brief Passes a data-parallel context to L (if it takes one).
   *  \param ctx a telar::DataParallelContext */
  template <class Context>
  void set_data_parallel(Context const& ctx) {
    detail::pass_data_parallel(layer_, ctx);
  }
  /*! \brief Passes a tensor-parallel context to L (if it takes one).
   *  \param ctx a telar::TensorParallelContext */
  template <class Context>
  void set_tensor_parallel(Context const& ctx) {
    tp_size_ = ctx.size;
    if constexpr (Traits::has_tensor_parallel)
      layer_.set_tensor_parallel(ctx);
  }
  /*! \brief Replicas of parameter \p name in the tensor-parallel group: L's
   *  answer. \param name as passed to parameters(f) */
  int parameter_replicas(std::string const& name) const {
    return telar::parameter_replicas(layer_, name, tp_size_);
  }
  /*! \brief Where this rank's parameter lies in the whole tensor: L's
   *  answer. \param name its name \param local the local tensor's extents */
  TensorBlock parameter_block(std::string const& name,
                              std::vector<std::size_t> const& local) const {
    return telar::parameter_block(layer_, name, local);
  }

  /*! \brief y = L(x); keeps the view of x and the random counters, and
   *  returns L's saved state to the workspace.
   *  \param exec execution space instance \param x input \param y output
   *  \param saved per-micro-batch state */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<value_type, memory_space> x,
               Matrix<value_type, memory_space> y, saved_type& saved) {
    settle_pending(nullptr);
    drop(saved); // a state left from an earlier micro-batch in this slot
    saved.counters.clear();
    auto record = [&](auto& l) { saved.counters.push_back(std::uint64_t(l.random_counter())); };
    detail::for_each_stochastic(layer_, record);
    std::shared_ptr<State> s = acquire();
    layer_.forward(exec, x, y, s->inner);
    release(s);
    saved.x = x;
    saved.weight_done = false;
  }

  /*! \brief Saved states of L this wrapper has allocated (its workspace): one
   *  for the forwards, plus the most micro-batches that were between
   *  recomputation and backward_weight at once. Without the wrapper there is
   *  one per micro-batch in flight. */
  std::size_t states_allocated() const { return allocated_; }
  /*! \brief Saved states of L alive now, outside the free workspace (rebuilt
   *  and waiting for backward_weight). */
  std::size_t states_live() const { return allocated_ - free_.size(); }

private:
  // Recomputes L's forward from the checkpoint (unless backward_weight
  // just did), then dL/dx; with a backward_weight still to come, the rebuilt
  // state is kept for it.
  // \param exec execution space instance \param dy output gradient
  // \param dx input gradient \param saved state
  template <class Exec>
  void input_part(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                  Matrix<value_type, memory_space> dx, saved_type const& saved) {
    settle_pending(&saved);
    bool const after_weight = owns(saved); // backward_weight ran first and kept it
    std::shared_ptr<State> s = after_weight ? saved.state : rebuild(exec, saved);
    layer_.backward_input(exec, dy, dx, s->inner);
    if (after_weight || !with_weight || saved.weight_done)
      drop(saved);
  }

  // dL/dW of L: on the state rebuilt by backward_input, which is
  // then dropped; or, when backward_input has not run (the model's first
  // unit, or a schedule that runs W before B), on a state rebuilt here and
  // kept until this layer's next call (a backward_input of the same
  // micro-batch uses it).
  // \param exec execution space instance \param dy output gradient \param saved state
  template <class Exec>
  void weight_part(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                   saved_type const& saved) {
    settle_pending(&saved);
    saved.weight_done = true;
    if (owns(saved)) {
      layer_.backward_weight(exec, dy, saved.state->inner);
      drop(saved);
    } else {
      std::shared_ptr<State> s = rebuild(exec, saved);
      layer_.backward_weight(exec, dy, s->inner);
      pending_ = s;
    }
  }

  // Fused backward (when L has only that): recompute, then L's backward.
  // \param exec execution space instance \param dy output gradient
  // \param dx input gradient \param saved state
  template <class Exec>
  void fused_part(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                  Matrix<value_type, memory_space> dx, saved_type const& saved) {
    settle_pending(&saved);
    std::shared_ptr<State> s = rebuild(exec, saved);
    layer_.backward(exec, dy, dx, s->inner);
    drop(saved);
  }

  // Takes a state from the workspace (allocating one if none is free).
  std::shared_ptr<State> acquire() {
    std::shared_ptr<State> s;
    if (free_.empty()) {
      s = std::make_shared<State>();
      ++allocated_;
    } else {
      s = std::move(free_.back());
      free_.pop_back();
    }
    s->owner = ++next_token_;
    return s;
  }
  // Returns s to the workspace.
  void release(std::shared_ptr<State> const& s) {
    s->owner = 0;
    free_.push_back(s);
  }

  // Re-runs L's forward from the checkpoint into a workspace state, with the
  // random counters as they were at forward, and hands it to `saved`.
  template <class Exec>
  std::shared_ptr<State> rebuild(Exec const& exec, saved_type const& saved) {
    if (saved.x.extent(1) == 0)
      throw Error("telar::Recompute: backward before forward (no checkpoint)");
    if (built_out_ == 0)
      throw Error("telar::Recompute: run before build(input shape)");
    drop(saved);
    std::shared_ptr<State> s = acquire();
    std::size_t const n = saved.x.extent(0), k = built_out_;
    if (s->out.extent(0) != n || s->out.extent(1) != k)
      s->out = Matrix<value_type, memory_space>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::Recompute::out"), n, k);
    // Counters as at forward; the current ones restored after.
    std::vector<std::uint64_t> now;
    std::size_t i = 0;
    auto set = [&](auto& l) {
      now.push_back(std::uint64_t(l.random_counter()));
      l.set_random_counter(saved.counters.at(i++));
    };
    detail::for_each_stochastic(layer_, set);
    layer_.forward(exec, saved.x, s->out, s->inner);
    i = 0;
    auto restore = [&](auto& l) { l.set_random_counter(now[i++]); };
    detail::for_each_stochastic(layer_, restore);
    saved.state = s;
    saved.token = s->owner;
    return s;
  }

  bool owns(saved_type const& saved) const {
    return saved.state && saved.token != 0 && saved.state->owner == saved.token;
  }
  void drop(saved_type const& saved) {
    if (owns(saved))
      release(saved.state);
    saved.state.reset();
    saved.token = 0;
  }
  // A state kept by backward_weight for a backward_input that may follow:
  // released by any call but that one.
  void settle_pending(saved_type const* saved) {
    if (!pending_)
      return;
    bool const same = saved && saved->state == pending_ && owns(*saved);
    if (!same && pending_->owner != 0)
      release(pending_);
    pending_.reset();
  }

  L layer_{};
  int tp_size_ = 1;
  std::vector<std::shared_ptr<State>> free_;
  std::shared_ptr<State> pending_;
  std::size_t allocated_ = 0;
  std::uint64_t next_token_ = 0;
  std::size_t built_out_ = 0; // L's output elements per sample, from build()
};

/*! \brief Full recomputation: the same chain with every top-level unit
 *  wrapped in telar::Recompute. \tparam Model a telar::Sequential */
template <class Model>
struct recompute_all_type;
/*! \brief Sequential<Ls...> becomes Sequential<Recompute<Ls>...>. \tparam Ls layer types */
template <class... Ls>
struct recompute_all_type<Sequential<Ls...>> {
  using type = Sequential<Recompute<Ls>...>; //!< the wrapped chain
};
/*! \brief Sequential<Recompute<Ls>...> for Sequential<Ls...>. \tparam Model a telar::Sequential */
template <class Model>
using RecomputeAll = typename recompute_all_type<Model>::type;

/*! \brief The model with every top-level unit wrapped in telar::Recompute
 *  (same layers, same parameter names). \param model a configured
 *  telar::Sequential \return a telar::RecomputeAll<Model> */
template <class... Ls>
Sequential<Recompute<Ls>...> recompute_all(Sequential<Ls...> model) {
  return std::apply(
      [](auto&... l) { return Sequential<Recompute<Ls>...>(Recompute<Ls>(std::move(l))...); },
      model.layers());
}

} // namespace telar
