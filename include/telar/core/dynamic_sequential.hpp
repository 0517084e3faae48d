#pragma once
/*! \file
 *  \brief telar::DynamicSequential: a chain of layers known only at run time
 *  (e.g. read from an ONNX file), each a std::variant over built-in layer
 *  types, trained by the Trainer as a telar::Sequential is. */
#include <telar/core/detail/chain_run.hpp>
#include <telar/core/detail/counter_rng.hpp>
#include <telar/core/detail/layer_walk.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/sequential.hpp>
#include <telar/core/shape.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace telar {

namespace detail {

// Position of L among the alternatives of a std::variant (unique types).
template <class L, class V>
struct variant_index;
template <class L, class... Ts>
struct variant_index<L, std::variant<Ts...>> {
  static constexpr std::size_t value = [] {
    constexpr bool same[] = {std::is_same_v<L, Ts>...};
    for (std::size_t i = 0; i < sizeof...(Ts); ++i)
      if (same[i])
        return i;
    return sizeof...(Ts);
  }();
  static constexpr bool found = value < sizeof...(Ts);
};

// Saved states of a run-time chain: entry k holds layer k's saved_type, made
// on first use. A deque, so growing it keeps references to earlier entries.
template <class V>
class DynamicSaved;
template <class... Ls>
class DynamicSaved<std::variant<Ls...>> {
  using Entry = std::variant<std::monostate, typename layer_traits<Ls>::saved_type...>;

public:
  template <class L>
  typename layer_traits<L>::saved_type& at(std::size_t k) {
    static_assert(variant_index<L, std::variant<Ls...>>::found,
                  "telar::DynamicSequential: layer type not in the variant");
    constexpr std::size_t i = variant_index<L, std::variant<Ls...>>::value + 1;
    if (entries_.size() <= k)
      entries_.resize(k + 1);
    if (entries_[k].index() != i)
      entries_[k].template emplace<i>();
    return std::get<i>(entries_[k]);
  }

private:
  std::deque<Entry> entries_;
};

// Layer k's saved state in a run-time chain (the compile-time overload is in
// sequential.hpp).
template <class V, class L>
auto& saved_at(DynamicSaved<V>& saved, std::size_t k, L&) {
  return saved.template at<std::decay_t<L>>(k);
}

} // namespace detail

/*! \brief A chain of layers chosen at run time, each one of the alternatives
 *  of \p Variant (a std::variant of built-in layer types).
 *
 *  It offers the members of telar::Sequential that the Trainer uses, so a
 *  model read from a file trains under every strategy as a compile-time
 *  model does: for_each_layer visits each layer's variant on the host and
 *  passes a run-time index; kernels only ever see the concrete layer.
 *  \code
 *  using Layer = std::variant<telar::Dense<float>, telar::ReLU<float>>;
 *  telar::DynamicSequential<Layer> model;
 *  model.push_back(telar::Dense<float>(784, 64));
 *  model.push_back(telar::ReLU<float>{});
 *  model.push_back(telar::Dense<float>(64, 10));
 *  \endcode
 *  \tparam Variant a std::variant of layer types sharing value_type and memory_space
 */
template <class Variant>
class DynamicSequential : public detail::ChainWalk<DynamicSequential<Variant>>,
                          public detail::ItemWalk<DynamicSequential<Variant>> {
  using First = std::variant_alternative_t<0, Variant>;
  friend detail::ItemWalk<DynamicSequential>;

public:
  /*! \brief The layer variant. */
  using layer_variant = Variant;
  /*! \brief Scalar type of the whole model. */
  using value_type = typename layer_traits<First>::value_type;
  /*! \brief Memory space of the whole model. */
  using memory_space = typename layer_traits<First>::memory_space;
  /*! \brief Execution space that runs the model's kernels by default. */
  using execution_space = typename memory_space::execution_space;
  /*! \brief Per-micro-batch saved state of every layer. */
  using saved_tuple = detail::DynamicSaved<Variant>;
  /*! \brief Called after layer k's initialize(seed) (e.g. to load starting
   *  values from a file): f(k, layer). */
  using initializer = std::function<void(std::size_t, Variant&)>;

  /*! \brief An empty chain; add layers with push_back. */
  DynamicSequential() = default;
  /*! \brief Chain \p d over another layer variant, each layer
   *  \p convert(layer): what telar::Precision's rebind makes of a chain. No
   *  initializer hook: \p d's takes its own variant (the rebind converts it
   *  too). \param d the chain \param convert maps a V2 const& to a Variant */
  template <class V2, class Convert>
  DynamicSequential(DynamicSequential<V2> const& d, Convert&& convert) {
    for (std::size_t k = 0; k < d.layer_count(); ++k)
      layers_.push_back(convert(d.layer(k)));
  }

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "DynamicSequential"; }

  /*! \brief Appends a layer. \param layer any alternative of Variant
   *  \return its index */
  std::size_t push_back(Variant layer) {
    layers_.push_back(std::move(layer));
    return layers_.size() - 1;
  }
  /*! \brief Number of layers. */
  std::size_t layer_count() const { return layers_.size(); }
  /*! \brief Layer \p k. \param k index */
  Variant& layer(std::size_t k) { return layers_.at(k); }
  /*! \brief Layer \p k. \param k index */
  Variant const& layer(std::size_t k) const { return layers_.at(k); }

  /*! \brief Runs \p f(k, layer) after layer k's initialize (starting values).
   *  \param f the hook */
  void set_initializer(initializer f) { init_ = std::move(f); }
  /*! \brief Whether an initializer hook is set. */
  bool has_initializer() const { return bool(init_); }
  /*! \brief The initializer hook (empty if none). */
  initializer const& initializer_hook() const { return init_; }

  /*! \brief Per-sample shapes along the chain (see Sequential::shapes).
   *  \param in per-sample shape of the input
   *  \throws ShapeError naming the first layer that cannot take its input */
  std::vector<Shape> shapes(Shape const& in) const {
    if (layers_.empty())
      throw Error("telar::DynamicSequential: the model has no layer");
    std::vector<Shape> s{in};
    this->for_each_layer([&](std::size_t k, auto const& l) {
      s.push_back(detail::chain_next_shape("telar::DynamicSequential", *this, k, l, s.back()));
    });
    return s;
  }

  /*! \brief Calls initialize on layers [first, last) that have one (seeds as
   *  Sequential's), then the initializer hook if set.
   *  \param seed model seed \param first first layer \param last one past the last layer */
  void initialize(std::uint64_t seed, std::size_t first = 0, std::size_t last = std::size_t(-1)) {
    for (std::size_t k = first; k < last && k < layers_.size(); ++k) {
      std::visit([&](auto& l) { detail::initialize_layer(l, detail::mix_seed(seed, k)); },
                 layers_[k]);
      if (init_)
        init_(k, layers_[k]);
    }
  }

private:
  std::vector<Variant>& walked() { return layers_; }
  std::vector<Variant> const& walked() const { return layers_; }

  std::vector<Variant> layers_;
  initializer init_;
};

/*! \brief A residual block over a run-time chain: y = x + body(x), the body a
 *  telar::DynamicSequential (e.g. the branch of an ONNX Add onto its input).
 *  Its parameters are named "<k>.<name>" by body layer, as a nested
 *  telar::Sequential's. \tparam Variant the body's layer variant */
template <class Variant>
class DynamicResidual {
  using Body = DynamicSequential<Variant>;

public:
  /*! \brief Scalar type. */
  using value_type = typename Body::value_type;
  /*! \brief Memory space of parameters and activations. */
  using memory_space = typename Body::memory_space;
  /*! \brief backward_weight reuses the inner gradients of backward_input. */
  static constexpr bool backward_input_first = true;

  /*! \brief What one micro-batch keeps: the body's saved states, its inner
   *  activations and their gradients. */
  struct saved_type {
    mutable detail::DynamicSaved<Variant> inner; //!< each body layer's state
    std::vector<Matrix<value_type, memory_space>>
        act; //!< act[k]: input of layer k, act[n]: body output
    mutable std::vector<Matrix<value_type, memory_space>> grad; //!< grad[k]: dL/d act[k]
    mutable Matrix<value_type, memory_space> scratch;           //!< dx nobody reads
    mutable bool grads_ready = false; //!< backward_input ran since the last backward_weight
  };

  /*! \brief An empty block. */
  DynamicResidual() = default;
  /*! \brief \param body the branch (its output shape must equal its input's) */
  explicit DynamicResidual(Body body) : body_(std::move(body)) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "DynamicResidual"; }
  /*! \brief The branch. */
  Body& body() { return body_; }
  /*! \brief The branch. */
  Body const& body() const { return body_; }

  /*! \brief \p in; the body must map it to itself. \param in the input shape
   *  \throws ShapeError otherwise */
  Shape output_shape(Shape const& in) const {
    Shape const out = body_.output_shape(in);
    if (out != in)
      throw ShapeError("DynamicResidual: the body maps " + in.str() + " to " + out.str() +
                       "; a residual connection needs the same shape");
    return in;
  }
  /*! \brief Tells the body its input shape. \param in the input shape */
  void build(Shape const& in) { shapes_ = body_.build(in); }
  /*! \brief The body's flops plus the addition. \param samples rows \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    return body_.flops(samples, in) + double(samples) * double(in.size());
  }
  /*! \brief The body's parameter values. */
  std::size_t parameter_count() const { return body_.parameter_count(); }
  /*! \brief The body's inner activations and gradients per micro-batch,
   *  its output and its layers' saved state.
   *  \param samples rows \param in input shape */
  std::size_t saved_bytes(std::size_t samples, Shape const& in) const {
    return body_.saved_bytes(samples, in) + 2 * detail::view_bytes<value_type>(samples * in.size());
  }
  /*! \brief The body's workspace. \param samples rows \param in input shape */
  std::size_t workspace_bytes(std::size_t samples, Shape const& in) const {
    return body_.workspace_bytes(samples, in);
  }
  /*! \brief Draws the body's parameters (the streams telar::Residual uses).
   *  \param seed stream seed */
  void initialize(std::uint64_t seed) { body_.initialize(detail::mix_seed(seed, 0)); }
  /*! \brief Visits the body's parameters as "<k>.<name>".
   *  \param f callable as f(char const*, View&, View&) */
  template <class F>
  void parameters(F&& f) {
    body_.parameters(f);
  }
  /*! \brief Visits the body's buffers as "<k>.<name>".
   *  \param f callable as f(char const*, View&) */
  template <class F>
  void buffers(F&& f) {
    body_.buffers(f);
  }
  /*! \brief The body's buffer values. */
  std::size_t buffer_count() const { return body_.buffer_count(); }
  /*! \brief Passes a data-parallel context to the body.
   *  \param ctx a telar::DataParallelContext */
  template <class Context>
  void set_data_parallel(Context const& ctx) {
    body_.set_data_parallel(ctx);
  }

  /*! \brief y = x + body(x). \param exec execution space instance \param x input
   *  \param y output \param saved per-micro-batch state */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<value_type, memory_space> x,
               Matrix<value_type, memory_space> y, saved_type& saved) const {
    std::size_t const n = body_.layer_count();
    ensure(saved.act, x.extent(0), "telar::DynamicResidual::activation");
    saved.grads_ready = false;
    // The body's output has its own buffer: its last layer may keep it (ReLU,
    // Tanh and Sigmoid keep y), so the sum must not overwrite it.
    detail::chain_forward(body_, exec, x, saved.act[n], saved.act, inner_of(saved));
    Kokkos::deep_copy(exec, y, saved.act[n]);
    detail::add_batch(exec, y, x);
  }
  /*! \brief dx = dy + body'(x)^T dy. \param exec execution space instance
   *  \param dy gradient of the output \param dx gradient of the input \param saved state */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                      Matrix<value_type, memory_space> dx, saved_type const& saved) const {
    propagate(exec, dy, dx, saved);
    detail::add_batch(exec, dx, dy);
  }
  /*! \brief The body's weight gradients. \param exec execution space instance
   *  \param dy gradient of the output \param saved state */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                       saved_type const& saved) const {
    if (!saved.grads_ready)
      propagate(exec, dy, scratch(saved, dy.extent(0)), saved);
    detail::chain_backward_weight(body_, exec, dy, saved.grad, inner_of(saved));
    saved.grads_ready = false;
  }

private:
  // Body layer k's slot of a micro-batch's saved states, for the chain walks.
  static auto inner_of(saved_type const& saved) {
    return [p = &saved](std::size_t k, auto const& l) -> auto& {
      return p->inner.template at<std::decay_t<decltype(l)>>(k);
    };
  }
  void ensure(std::vector<Matrix<value_type, memory_space>>& bufs, std::size_t rows,
              char const* label) const {
    std::size_t const n = body_.layer_count();
    if (shapes_.size() != n + 1)
      throw Error("telar::DynamicResidual: run before build(input shape)");
    detail::size_chain_buffers(bufs, shapes_, rows, n, label); // act[n]: the body's output
  }
  Matrix<value_type, memory_space> scratch(saved_type const& saved, std::size_t rows) const {
    return detail::sized_matrix(saved.scratch, rows, shapes_[0].size(),
                                "telar::DynamicResidual::scratch");
  }
  // Body input gradients, last layer first, into saved.grad and dx (every
  // layer's, the first's too: dx is a scratch buffer when nobody reads it).
  template <class Exec>
  void propagate(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                 Matrix<value_type, memory_space> dx, saved_type const& saved) const {
    ensure(saved.grad, dy.extent(0), "telar::DynamicResidual::activation_grad");
    detail::chain_backward_input(body_, exec, dy, dx, saved.grad, inner_of(saved), true,
                                 [&]() -> Matrix<value_type, memory_space>& { return dx; });
    saved.grads_ready = true;
  }

  Body body_;
  std::vector<Shape> shapes_;
};

/*! \brief telar::DynamicSequential trains as a telar::Sequential does.
 *  \tparam V the layer variant */
template <class V>
inline constexpr bool is_sequential_v<DynamicSequential<V>> = true;

} // namespace telar
