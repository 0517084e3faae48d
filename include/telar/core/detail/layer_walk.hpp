#pragma once
// The chain operations every model shares (telar::Sequential,
// telar::DynamicSequential, telar::DynamicGraph, telar::GraphChain and the
// blocks over them), written once over the model's for_each_layer(f(index,
// layer)): a compile-time chain passes std::integral_constant indices, a
// run-time one std::size_t. Shapes are indexed as the walk's index (a chain's
// entry k is layer k's input; a graph passes its layer nodes' inputs by node).
#include <telar/core/detail/counter_rng.hpp>
#include <telar/core/detail/decl.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace telar::detail {

template <class T>
inline constexpr bool is_variant_v = false;
template <class... Ts>
inline constexpr bool is_variant_v<std::variant<Ts...>> = true;

// f(k, item), with the alternative it holds when the item is a variant: the
// run-time models' for_each_layer over their vector of layers (or units).
template <class Item, class F>
void visit_item(std::size_t k, Item& item, F& f) {
  if constexpr (is_variant_v<std::remove_const_t<Item>>)
    std::visit([&](auto& l) { f(k, l); }, item);
  else
    f(k, item);
}

// for_each_layer(f) and for_each_layer_reverse(f), then their const
// overloads, of a run-time model over the vector its walked() returns
// (layers or units).
template <class Derived>
class ItemWalk {
public:
  /*! \brief Calls f(index, item) for each item, first to last, with the
   *  concrete type a variant holds. \param f the visitor */
  template <class F>
  void for_each_layer(F&& f) {
    walk(self().walked(), f, false);
  }
  /*! \brief As for_each_layer, last to first. \param f the visitor */
  template <class F>
  void for_each_layer_reverse(F&& f) {
    walk(self().walked(), f, true);
  }
  /*! \brief Const overload. \param f the visitor */
  template <class F>
  void for_each_layer(F&& f) const {
    walk(self().walked(), f, false);
  }
  /*! \brief Const overload. \param f the visitor */
  template <class F>
  void for_each_layer_reverse(F&& f) const {
    walk(self().walked(), f, true);
  }

private:
  Derived& self() { return static_cast<Derived&>(*this); }
  Derived const& self() const { return static_cast<Derived const&>(*this); }
  template <class Vec, class F>
  static void walk(Vec& items, F& f, bool reverse) {
    std::size_t const n = items.size();
    for (std::size_t i = 0; i < n; ++i) {
      std::size_t const k = reverse ? n - 1 - i : i;
      visit_item(k, items[k], f);
    }
  }
};

// A layer's cost estimate, or one operation per input element.
template <class L>
double layer_flops(L const& l, std::size_t samples, Shape const& in) {
  if constexpr (is_detected_v<flops_t, L>)
    return l.flops(samples, in);
  else
    return double(samples) * double(in.size());
}

// Elements per sample of every shape (a model's feature_sizes).
TELAR_DECL std::vector<std::size_t> feature_sizes(std::vector<Shape> const& shapes);

// layer_name of every layer, in walk order.
template <class Model>
std::vector<std::string> layer_names_of(Model const& m) {
  std::vector<std::string> names;
  m.for_each_layer([&](auto, auto const& l) { names.push_back(layer_name(l)); });
  return names;
}

// Sum of f(index, layer) over the layers.
template <class T, class Model, class F>
T sum_over_layers(Model const& m, F&& f, T total = T{}) {
  m.for_each_layer([&](auto index, auto const& l) { total += f(index, l); });
  return total;
}

template <class Model>
std::size_t layers_parameter_count(Model const& m) {
  return sum_over_layers<std::size_t>(m, [](auto, auto const& l) { return parameter_count_of(l); });
}
template <class Model>
std::size_t layers_buffer_count(Model const& m) {
  return sum_over_layers<std::size_t>(m, [](auto, auto const& l) { return buffer_count_of(l); });
}
// \p in[index]: the input shape of the layer at walk index `index`.
// (added to \p start in walk order: the same rounding as a running total).
template <class Model>
double layers_flops(Model const& m, std::size_t samples, std::vector<Shape> const& in,
                    double start = 0) {
  return sum_over_layers<double>(
      m, [&](auto index, auto const& l) { return layer_flops(l, samples, in[index]); }, start);
}
template <class Model>
std::size_t layers_saved_bytes(Model const& m, std::size_t samples, std::vector<Shape> const& in) {
  return sum_over_layers<std::size_t>(
      m, [&](auto index, auto const& l) { return saved_bytes_of(l, samples, in[index]); });
}
template <class Model>
std::size_t layers_workspace_bytes(Model const& m, std::size_t samples,
                                   std::vector<Shape> const& in) {
  return sum_over_layers<std::size_t>(
      m, [&](auto index, auto const& l) { return workspace_bytes_of(l, samples, in[index]); });
}

// A chain's inner activations and their gradients (neither its input nor its
// output: shapes[1] to shapes[n - 1] of n + 1), as a nested chain keeps them.
template <class T>
std::size_t chain_activation_bytes(std::size_t samples, std::vector<Shape> const& shapes) {
  std::size_t n = 0;
  for (std::size_t k = 1; k + 1 < shapes.size(); ++k)
    n += 2 * view_bytes<T>(samples * shapes[k].size());
  return n;
}

// Tells every layer with a build() hook its input shape in[index].
template <class Model>
void build_layers(Model& m, std::vector<Shape> const& in) {
  m.for_each_layer([&](auto index, auto& l) {
    if constexpr (layer_traits<std::decay_t<decltype(l)>>::has_build)
      l.build(in[index]);
  });
}

// Calls f(prefix + name, value, grad) for each parameter of l (nothing if it
// has none): how blocks name their inner layers' parameters.
template <class L, class F>
void prefixed_parameters(L& l, std::string const& prefix, F& f) {
  if constexpr (layer_traits<L>::has_parameters)
    l.parameters([&](char const* name, auto& value, auto& grad) {
      std::string const full = prefix + name;
      f(full.c_str(), value, grad);
    });
}

// Every layer's parameters and buffers, named prefix(index) + name.
template <class Model, class Prefix, class F>
void named_parameters(Model& m, Prefix const& prefix, F& f) {
  m.for_each_layer([&](auto index, auto& l) { prefixed_parameters(l, prefix(index), f); });
}
template <class Model, class Prefix, class F>
void named_buffers(Model& m, Prefix const& prefix, F& f) {
  m.for_each_layer([&](auto index, auto& l) { prefixed_buffers(l, prefix(index), f); });
}
// "<index>." as a chain names its layers' parameters.
struct index_prefix {
  std::string operator()(std::size_t index) const { return std::to_string(index) + "."; }
};

// Passes a data- or tensor-parallel context to every layer that takes one.
template <class Model, class Context>
void layers_set_data_parallel(Model& m, Context const& ctx) {
  m.for_each_layer([&](auto, auto& l) { pass_data_parallel(l, ctx); });
}
template <class Model, class Context>
void layers_set_tensor_parallel(Model& m, Context const& ctx) {
  m.for_each_layer([&](auto, auto& l) {
    if constexpr (layer_traits<std::decay_t<decltype(l)>>::has_tensor_parallel)
      l.set_tensor_parallel(ctx);
  });
}

// "layer 2 (Conv2D)" in a message.
inline std::string layer_label(std::size_t index, std::string const& name) {
  return "layer " + std::to_string(index) + " (" + name + ")";
}
// Where layer k of a chain takes its input from, for messages.
template <class Model>
std::string chain_input_source(Model const& m, std::size_t k) {
  return k == 0 ? std::string("the model input") : layer_label(k - 1, m.layer_names()[k - 1]);
}

// l's output shape for input \p in; a ShapeError from the layer, or an
// output of no rank, comes back as one ShapeError: where() + ": " + why.
template <class L, class Where>
Shape checked_output_shape(L const& l, Shape const& in, Where const& where) {
  try {
    Shape const out = l.output_shape(in);
    if (!out.known())
      throw ShapeError("output shape " + out.str() + " is not of rank 1 to 4");
    return out;
  } catch (ShapeError const& e) {
    throw ShapeError(where() + ": " + e.what());
  }
}
// Layer k's output shape in the chain \p m called \p model in messages.
template <class Model, class L>
Shape chain_next_shape(char const* model, Model const& m, std::size_t k, L const& l,
                       Shape const& have) {
  return checked_output_shape(l, have, [&] {
    return std::string(model) + ": " + layer_label(k, layer_name(l)) + " cannot take input " +
           have.str() + " from " + chain_input_source(m, k);
  });
}

// \p m as a [rows, cols] matrix, reallocated (uninitialised) only when its
// extents differ: the buffers a model keeps between micro-batches.
template <class Mat>
Mat& sized_matrix(Mat& m, std::size_t rows, std::size_t cols, char const* label) {
  if (m.extent(0) != rows || m.extent(1) != cols)
    m = Mat(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), rows, cols);
  return m;
}
// bufs[1] to bufs[last] as [rows, shapes[k].size()] (a chain's inner
// tensors) where keep(k), else empty.
template <class Mat, class Keep>
void size_chain_buffers(std::vector<Mat>& bufs, std::vector<Shape> const& shapes, std::size_t rows,
                        std::size_t last, char const* label, Keep keep) {
  bufs.resize(shapes.size());
  for (std::size_t k = 1; k <= last; ++k)
    if (keep(k))
      sized_matrix(bufs[k], rows, shapes[k].size(), label);
    else
      bufs[k] = Mat();
}
template <class Mat>
void size_chain_buffers(std::vector<Mat>& bufs, std::vector<Shape> const& shapes, std::size_t rows,
                        std::size_t last, char const* label) {
  size_chain_buffers(bufs, shapes, rows, last, label, [](std::size_t) { return true; });
}

/*! \brief The members every model has over its for_each_layer (the
 *  Derived's): parameters and buffers by name, their counts, and the
 *  contexts passed down. A model names its layers' parameters
 *  name_prefix()(index) + name ("<index>." unless it says otherwise).
 *  \tparam Derived the model (CRTP) */
template <class Derived>
class LayerWalk {
public:
  /*! \brief Parameter values of every layer (layers without
   *  parameter_count() count 0). */
  std::size_t parameter_count() const { return layers_parameter_count(self()); }
  /*! \brief Buffer values of every layer. */
  std::size_t buffer_count() const { return layers_buffer_count(self()); }
  /*! \brief Visits (name, value, gradient) of every parameter of every layer,
   *  named by the layer's prefix ("<index>.<name>" in a chain).
   *  \param f callable as f(char const*, View&, View&) */
  template <class F>
  void parameters(F&& f) {
    named_parameters(self(), self().name_prefix(), f);
  }
  /*! \brief Visits (name, view) of every buffer of every layer, named as
   *  parameters. \param f callable as f(char const*, View&) */
  template <class F>
  void buffers(F&& f) {
    named_buffers(self(), self().name_prefix(), f);
  }
  /*! \brief Passes a data-parallel context to every layer that takes one.
   *  \param ctx a telar::DataParallelContext */
  template <class Context>
  void set_data_parallel(Context const& ctx) {
    layers_set_data_parallel(self(), ctx);
  }
  /*! \brief Passes a tensor-parallel context to every layer that takes one.
   *  \param ctx a telar::TensorParallelContext */
  template <class Context>
  void set_tensor_parallel(Context const& ctx) {
    layers_set_tensor_parallel(self(), ctx);
  }

protected:
  index_prefix name_prefix() const { return {}; }
  Derived& self() { return static_cast<Derived&>(*this); }
  Derived const& self() const { return static_cast<Derived const&>(*this); }
};

/*! \brief What a chain adds to LayerWalk (telar::Sequential and
 *  telar::DynamicSequential): sizes and costs along the Derived's shapes(in),
 *  where entry k is layer k's input. \tparam Derived the chain (CRTP) */
template <class Derived>
class ChainWalk : public LayerWalk<Derived> {
public:
  /*! \brief Checks the chain for input \p in and tells every layer with a
   *  build() hook its input shape (nested blocks recursively). Call once,
   *  before initialize() and forward().
   *  \param in per-sample input shape \return shapes(in) */
  std::vector<Shape> build(Shape const& in) {
    shapes_ = self().shapes(in);
    build_layers(self(), shapes_);
    return shapes_;
  }
  /*! \brief Shapes from the last build() (empty before). */
  std::vector<Shape> const& built_shapes() const { return shapes_; }
  /*! \brief Names of the layers, for messages. */
  std::vector<std::string> layer_names() const { return layer_names_of(self()); }
  /*! \brief Elements per sample along the chain (shapes(in)[k].size()).
   *  \param in per-sample shape of the input */
  std::vector<std::size_t> feature_sizes(Shape const& in) const {
    return detail::feature_sizes(self().shapes(in));
  }
  /*! \brief Output shape for input \p in (the Layer concept). \param in input shape */
  Shape output_shape(Shape const& in) const { return self().shapes(in).back(); }
  /*! \brief Cost estimate: the sum of the layers' (Layer concept).
   *  \param samples rows \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    return layers_flops(self(), samples, self().shapes(in));
  }
  /*! \brief What a nested chain keeps per micro-batch: its inner
   *  activations and their gradients plus every layer's saved state.
   *  \param samples rows \param in input shape */
  std::size_t saved_bytes(std::size_t samples, Shape const& in) const {
    auto const s = self().shapes(in);
    using T = typename Derived::value_type;
    return chain_activation_bytes<T>(samples, s) + layers_saved_bytes(self(), samples, s);
  }
  /*! \brief Every layer's workspace. \param samples rows \param in input shape */
  std::size_t workspace_bytes(std::size_t samples, Shape const& in) const {
    return layers_workspace_bytes(self(), samples, self().shapes(in));
  }

protected:
  using LayerWalk<Derived>::self;
  std::vector<Shape> shapes_; //!< from the last build()
};

/*! \brief Parameter names across a tensor-parallel group, for models whose
 *  parameters are named "<layer>.<name>" (telar::Sequential,
 *  telar::DynamicGraph): the layer's own answer for its parameter.
 *  Derived::with_parameter_layer(name, f) calls f(layer, rest) for the layer
 *  that holds parameter \p name. \tparam Derived the model (CRTP) */
template <class Derived>
class TensorParallelNames {
public:
  /*! \brief Passes a tensor-parallel context to every layer that takes one
   *  (and keeps its size for parameter_replicas).
   *  \param ctx a telar::TensorParallelContext */
  template <class Context>
  void set_tensor_parallel(Context const& ctx) {
    tp_size_ = ctx.size;
    layers_set_tensor_parallel(static_cast<Derived&>(*this), ctx);
  }
  /*! \brief Replicas of parameter \p name in the tensor-parallel group: its
   *  layer's answer. \param name as passed to parameters(f) */
  int parameter_replicas(std::string const& name) const {
    int r = tp_size_;
    self().with_parameter_layer(name, [&](auto const& l, std::string const& rest) {
      r = telar::parameter_replicas(l, rest, tp_size_);
    });
    return r;
  }
  /*! \brief Where this rank's parameter \p name lies in the whole tensor: its
   *  layer's answer. \param name as passed to parameters(f)
   *  \param local the local tensor's extents */
  TensorBlock parameter_block(std::string const& name,
                              std::vector<std::size_t> const& local) const {
    TensorBlock b{local, std::vector<std::size_t>(local.size(), 0)};
    self().with_parameter_layer(name, [&](auto const& l, std::string const& rest) {
      b = telar::parameter_block(l, rest, local);
    });
    return b;
  }

private:
  Derived const& self() const { return static_cast<Derived const&>(*this); }
  int tp_size_ = 1;
};

} // namespace telar::detail

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/core/detail/layer_walk.ipp>
#endif
