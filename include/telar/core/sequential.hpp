#pragma once
/*! \file
 *  \brief telar::Sequential: a chain of layer functors, checked where it is
 *  formed. */
#include <telar/core/detail/counter_rng.hpp>
#include <telar/core/detail/type_traits.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace telar {

namespace detail {

template <class L>
using preserves_features_t = decltype(L::preserves_features);

// Compile-time feature count flowing out of layer I given the flow into it:
// a declared out_extent, else the input count for shape-preserving layers.
template <class L>
constexpr std::size_t static_out(std::size_t in) {
  if constexpr (layer_traits<L>::out_extent != dynamic_extent)
    return layer_traits<L>::out_extent;
  else if constexpr (is_detected_v<preserves_features_t, L>)
    return L::preserves_features ? in : dynamic_extent;
  else
    return dynamic_extent;
}

template <class... Layers>
constexpr std::array<std::size_t, sizeof...(Layers) + 1> static_feature_flow() {
  std::array<std::size_t, sizeof...(Layers) + 1> flow{};
  std::array<std::size_t, sizeof...(Layers)> ins{layer_traits<Layers>::in_extent...};
  std::array<std::size_t (*)(std::size_t), sizeof...(Layers)> outs{&static_out<Layers>...};
  flow[0] = ins[0];
  for (std::size_t i = 0; i < sizeof...(Layers); ++i) {
    std::size_t const in = ins[i] != dynamic_extent ? ins[i] : flow[i];
    flow[i + 1] = outs[i](in);
  }
  return flow;
}

// Index of the first layer whose static input count differs from what the
// previous layers produce, or the layer count when all fit.
template <class... Layers>
constexpr std::size_t first_static_mismatch() {
  constexpr auto flow = static_feature_flow<Layers...>();
  constexpr std::array<std::size_t, sizeof...(Layers)> ins{layer_traits<Layers>::in_extent...};
  for (std::size_t i = 1; i < sizeof...(Layers); ++i)
    if (ins[i] != dynamic_extent && flow[i] != dynamic_extent && ins[i] != flow[i])
      return i;
  return sizeof...(Layers);
}

// Carries the failing index in its type so the compiler prints it.
template <std::size_t Layer, std::size_t Count>
struct StaticShapeCheck {
  static_assert(Layer == Count,
                "telar::Sequential: a layer's compile-time input features (in_extent) differ from "
                "the features the previous layer produces; see the layer index in "
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

} // namespace detail

/*! \brief A chain of layers applied one after the other.
 *
 *  Every layer type is checked against the Layer concept here (see
 *  telar/core/layer.hpp); all layers must share value_type and memory_space;
 *  feature counts known at compile time (StaticDense) must agree between
 *  neighbours. Counts known only at run time are checked by feature_sizes().
 *  \code
 *  using Model = telar::Sequential<telar::Dense<float>, telar::ReLU<float>, telar::Dense<float>>;
 *  Model model(telar::Dense<float>(784, 256), telar::ReLU<float>{}, telar::Dense<float>(256, 10));
 *  \endcode
 *  \tparam Layers layer functor types, first to last
 */
template <class... Layers>
class Sequential {
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

  /*! \brief Default-constructed layers. */
  Sequential() = default;
  /*! \brief \param layers the configured layers, first to last */
  explicit Sequential(Layers... layers) : layers_(std::move(layers)...) {}

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

  /*! \brief Names of the layers, for messages. */
  std::vector<std::string> layer_names() const {
    std::vector<std::string> names;
    for_each_layer([&](auto, auto const& l) { names.push_back(layer_name(l)); });
    return names;
  }

  /*! \brief Feature counts along the chain: entry k is the input of layer k,
   *  the last entry the model's output.
   *  \param in features of the model input
   *  \throws ShapeError naming the first layer whose expected input differs */
  std::vector<std::size_t> feature_sizes(std::size_t in) const {
    std::vector<std::size_t> f{in};
    for_each_layer([&](auto index, auto const& l) {
      using L = std::decay_t<decltype(l)>;
      std::size_t const have = f.back();
      std::size_t expect = layer_traits<L>::in_extent;
      if constexpr (detail::is_detected_v<detail::input_features_t, L>)
        expect = l.input_features();
      if (expect != dynamic_extent && expect != have) {
        std::string from = index == 0 ? std::string("the model input")
                                      : "layer " + std::to_string(index - 1) + " (" +
                                            layer_names()[index - 1] + ")";
        throw ShapeError("telar::Sequential: layer " + std::to_string(index) + " (" +
                         layer_name(l) + ") expects " + std::to_string(expect) +
                         " input features but " + from + " produces " + std::to_string(have));
      }
      f.push_back(l.output_features(have));
    });
    return f;
  }

  /*! \brief Calls initialize on layers [first, last) that have one, each with
   *  its own stream derived from \p seed and the layer index, so the values do
   *  not depend on which rank initialises which layer.
   *  \param seed model seed \param first first layer \param last one past the last layer */
  void initialize(std::uint64_t seed, std::size_t first = 0, std::size_t last = size) {
    for_each_layer([&](auto index, auto& l) {
      using L = std::decay_t<decltype(l)>;
      if constexpr (layer_traits<L>::has_initialize)
        if (index >= first && index < last)
          l.initialize(detail::mix_seed(seed, index));
    });
  }

private:
  layers_type layers_;
};

/*! \brief True for telar::Sequential types. \tparam M a type */
template <class M>
inline constexpr bool is_sequential_v = false;
/*! \brief True for telar::Sequential types. \tparam Ls layer types */
template <class... Ls>
inline constexpr bool is_sequential_v<Sequential<Ls...>> = true;

} // namespace telar
