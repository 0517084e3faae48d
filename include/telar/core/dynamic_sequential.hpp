#pragma once
/*! \file
 *  \brief telar::DynamicSequential: a chain of layers known only at run time
 *  (e.g. read from an ONNX file), each a std::variant over built-in layer
 *  types, trained by the Trainer as a telar::Sequential is. */
#include <telar/core/detail/counter_rng.hpp>
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
  static_assert(value < sizeof...(Ts), "telar::DynamicSequential: layer type not in the variant");
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
class DynamicSequential {
  using First = std::variant_alternative_t<0, Variant>;

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

  /*! \brief Calls f(index, layer) for each layer, first to last, with the
   *  concrete layer type. \param f the visitor */
  template <class F>
  void for_each_layer(F&& f) {
    for (std::size_t k = 0; k < layers_.size(); ++k)
      std::visit([&](auto& l) { f(k, l); }, layers_[k]);
  }
  /*! \brief Const overload. \param f the visitor */
  template <class F>
  void for_each_layer(F&& f) const {
    for (std::size_t k = 0; k < layers_.size(); ++k)
      std::visit([&](auto const& l) { f(k, l); }, layers_[k]);
  }
  /*! \brief Calls f(index, layer) for each layer, last to first. \param f the visitor */
  template <class F>
  void for_each_layer_reverse(F&& f) {
    for (std::size_t k = layers_.size(); k-- > 0;)
      std::visit([&](auto& l) { f(k, l); }, layers_[k]);
  }

  /*! \brief Names of the layers, for messages. */
  std::vector<std::string> layer_names() const {
    std::vector<std::string> names;
    for_each_layer([&](std::size_t, auto const& l) { names.push_back(layer_name(l)); });
    return names;
  }

  /*! \brief Per-sample shapes along the chain (see Sequential::shapes).
   *  \param in per-sample shape of the input
   *  \throws ShapeError naming the first layer that cannot take its input */
  std::vector<Shape> shapes(Shape const& in) const {
    if (layers_.empty())
      throw Error("telar::DynamicSequential: the model has no layer");
    std::vector<Shape> s{in};
    for_each_layer([&](std::size_t k, auto const& l) { s.push_back(next_shape(k, l, s.back())); });
    return s;
  }
  /*! \brief Elements per sample along the chain. \param in per-sample input shape */
  std::vector<std::size_t> feature_sizes(Shape const& in) const {
    std::vector<std::size_t> f;
    for (Shape const& s : shapes(in))
      f.push_back(s.size());
    return f;
  }
  /*! \brief Checks the chain and tells every layer with a build() hook its
   *  input shape. \param in per-sample input shape \return shapes(in) */
  std::vector<Shape> build(Shape const& in) {
    shapes_ = shapes(in);
    for_each_layer([&](std::size_t k, auto& l) {
      using L = std::decay_t<decltype(l)>;
      if constexpr (layer_traits<L>::has_build)
        l.build(shapes_[k]);
    });
    return shapes_;
  }
  /*! \brief Shapes from the last build() (empty before). */
  std::vector<Shape> const& built_shapes() const { return shapes_; }
  /*! \brief Output shape for input \p in. \param in input shape */
  Shape output_shape(Shape const& in) const { return shapes(in).back(); }

  /*! \brief Cost estimate: the sum of the layers'. \param samples rows \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    auto const s = shapes(in);
    double total = 0;
    for_each_layer([&](std::size_t k, auto const& l) {
      using L = std::decay_t<decltype(l)>;
      if constexpr (detail::is_detected_v<detail::flops_t, L>)
        total += l.flops(samples, s[k]);
      else
        total += double(samples) * double(s[k].size());
    });
    return total;
  }
  /*! \brief Parameter values of every layer. */
  std::size_t parameter_count() const {
    std::size_t n = 0;
    for_each_layer([&](std::size_t, auto const& l) {
      using L = std::decay_t<decltype(l)>;
      if constexpr (layer_traits<L>::has_parameter_count)
        n += l.parameter_count();
    });
    return n;
  }

  /*! \brief Calls initialize on layers [first, last) that have one (seeds as
   *  Sequential's), then the initializer hook if set.
   *  \param seed model seed \param first first layer \param last one past the last layer */
  void initialize(std::uint64_t seed, std::size_t first = 0, std::size_t last = std::size_t(-1)) {
    for (std::size_t k = first; k < last && k < layers_.size(); ++k) {
      std::visit(
          [&](auto& l) {
            using L = std::decay_t<decltype(l)>;
            if constexpr (layer_traits<L>::has_initialize)
              l.initialize(detail::mix_seed(seed, k));
          },
          layers_[k]);
      if (init_)
        init_(k, layers_[k]);
    }
  }

  /*! \brief Visits (name, value, gradient) of every parameter, named
   *  "<index>.<name>". \param f callable as f(char const*, View&, View&) */
  template <class F>
  void parameters(F&& f) {
    for_each_layer([&](std::size_t k, auto& l) {
      using L = std::decay_t<decltype(l)>;
      if constexpr (layer_traits<L>::has_parameters)
        l.parameters([&](char const* name, auto& value, auto& grad) {
          std::string const full = std::to_string(k) + "." + name;
          f(full.c_str(), value, grad);
        });
    });
  }

  /*! \brief Passes a tensor-parallel context to every layer that takes one.
   *  \param ctx a telar::TensorParallelContext */
  template <class Context>
  void set_tensor_parallel(Context const& ctx) {
    for_each_layer([&](std::size_t, auto& l) {
      using L = std::decay_t<decltype(l)>;
      if constexpr (layer_traits<L>::has_tensor_parallel)
        l.set_tensor_parallel(ctx);
    });
  }

private:
  template <class L>
  Shape next_shape(std::size_t k, L const& l, Shape const& have) const {
    auto const from = [&] {
      return k == 0 ? std::string("the model input")
                    : detail::layer_label(k - 1, layer_names()[k - 1]);
    };
    try {
      Shape const out = l.output_shape(have);
      if (!out.known())
        throw ShapeError("output shape " + out.str() + " is not of rank 1 to 4");
      return out;
    } catch (ShapeError const& e) {
      throw ShapeError("telar::DynamicSequential: " + detail::layer_label(k, layer_name(l)) +
                       " cannot take input " + have.str() + " from " + from() + ": " + e.what());
    }
  }

  std::vector<Variant> layers_;
  std::vector<Shape> shapes_;
  initializer init_;
};

/*! \brief telar::DynamicSequential trains as a telar::Sequential does.
 *  \tparam V the layer variant */
template <class V>
inline constexpr bool is_sequential_v<DynamicSequential<V>> = true;

} // namespace telar
