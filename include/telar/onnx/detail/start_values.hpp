#pragma once
// What an imported model does after the graph walk: Megatron pairs of its
// Dense runs under tensor parallelism, each layer's starting values (this
// rank's block of the file's parameters and buffers, loaded after
// initialize), and a forward pass for predict.
#include <telar/core/dynamic_sequential.hpp>
#include <telar/layers/dense.hpp>
#include <telar/onnx/model.hpp>
#include <telar/parallel/detail/stage_runner.hpp>
#include <telar/parallel/tensor_parallel.hpp>

#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace telar::onnx::detail {

// Whether layers[k] exists and holds one of Ls.
template <class... Ls, class Layers>
bool holds_one_of(Layers const& layers, std::size_t k) {
  return k < layers.size() && (std::holds_alternative<Ls>(layers[k]) || ...);
}

// Dense, element-wise, Dense runs become Megatron pairs (the activation acts
// on the column-parallel shard, as in telar::ColumnParallel's docs).
template <class Layers>
void make_tensor_parallel_pairs(Layers& layers) {
  using D = std::variant_alternative_t<0, typename Layers::value_type>; // Dense<T, M>
  using T = typename D::value_type;
  using M = typename D::memory_space;
  auto dense = [&](std::size_t k) { return holds_one_of<D>(layers, k); };
  auto elementwise = [&](std::size_t k) {
    return holds_one_of<ReLU<T, M>, GELU<T, M>, Sigmoid<T, M>, Tanh<T, M>>(layers, k);
  };
  for (std::size_t k = 0; k + 2 < layers.size(); ++k)
    if (dense(k) && elementwise(k + 1) && dense(k + 2)) {
      auto const& a = std::get<D>(layers[k]);
      auto const& b = std::get<D>(layers[k + 2]);
      layers[k] = ColumnParallel<Dense<T, M>>(a.in_features(), a.out_features(), a.has_bias());
      layers[k + 2] = RowParallel<Dense<T, M>>(b.in_features(), b.out_features(), b.has_bias());
      k += 2;
    }
}

// The block of a full [rows, cols] parameter a layer holds: first row and
// column, extents, and whether other tensor-parallel ranks hold the same values.
struct Block {
  std::size_t row0 = 0, col0 = 0, rows = 0, cols = 0;
  bool replicated = false;
};
template <class L> // a layer outside a tensor-parallel pair: every tp rank has it all
Block block_of(L const&, std::string const&, std::size_t rows, std::size_t cols) {
  return {0, 0, rows, cols, true};
}
template <class T, class M>
Block block_of(ColumnParallel<Dense<T, M>> const& l, std::string const&, std::size_t,
               std::size_t cols) {
  return {l.shard_begin(), 0, l.shard_size(), cols, false};
}
template <class T, class M>
Block block_of(RowParallel<Dense<T, M>> const& l, std::string const& param, std::size_t rows,
               std::size_t cols) {
  if (param == "bias")
    return {0, 0, rows, cols, true};
  return {0, l.shard_begin(), rows, l.shard_size(), false};
}

// Copies this layer's block of a full host tensor into its value view.
template <class V, class T>
void load_block(V const& v, std::vector<T> const& full, std::size_t cols, Block const& b) {
  auto h = Kokkos::create_mirror_view(v);
  if constexpr (V::rank == 1) {
    for (std::size_t i = 0; i < h.extent(0); ++i)
      h(i) = full[b.row0 + i];
  } else {
    for (std::size_t i = 0; i < h.extent(0); ++i)
      for (std::size_t j = 0; j < h.extent(1); ++j)
        h(i, j) = full[(b.row0 + i) * cols + b.col0 + j];
  }
  Kokkos::deep_copy(v, h);
}

// The initializer hook of an imported model: after a layer draws its
// values, overwrite them with the file's (this rank's block of them).
// DynamicSequential calls it with the layer's index; the DynamicGraph of a
// whole file (telar::onnx::import_graph) with the node's name, whose
// bindings are layer 0's "<node>.<name>".
template <class T, class M>
struct StartValues {
  std::vector<ParameterBinding> bindings;
  std::shared_ptr<std::map<std::string, std::vector<T>>> start;

  template <class Variant>
  void operator()(std::size_t k, Variant& layer) const {
    load(k, "", layer);
  }
  template <class Variant>
  void operator()(std::string const& node, Variant& layer) const {
    load(0, node + ".", layer);
  }

private:
  template <class Variant>
  void load(std::size_t k, std::string const& prefix, Variant& layer) const {
    auto bound = [&](ParameterBinding const& b, std::string const& param, bool buffer) {
      return b.layer == k && b.buffer == buffer && b.param == param;
    };
    std::visit(
        [&](auto& l) {
          using L = std::decay_t<decltype(l)>;
          if constexpr (layer_traits<L>::has_parameters)
            l.parameters([&](char const* name, auto& value, auto&) {
              std::string const param = prefix + name;
              for (auto const& b : bindings)
                if (bound(b, param, false))
                  load_block(value, start->at(b.initializer), b.cols,
                             block_of(l, name, b.rows, b.cols));
            });
          auto buffer = [&](char const* name, auto& value) {
            std::string const param = prefix + name;
            for (auto const& b : bindings)
              if (bound(b, param, true))
                load_block(value, start->at(b.initializer), b.cols,
                           Block{0, 0, b.rows, b.cols, true});
          };
          telar::detail::prefixed_buffers(l, "", buffer);
        },
        layer);
  }
};

template <class Model, class X>
auto run_forward(Model& model, X const& x) {
  using T = typename Model::value_type;
  using MS = typename Model::memory_space;
  std::vector<std::size_t> const features = model.feature_sizes(model.built_shapes().at(0));
  telar::detail::StageRunner<Model> runner(&model, 0, model.layer_count(), features);
  int const slot = runner.acquire(x.extent(0));
  typename Model::execution_space exec;
  runner.forward(exec, slot, ConstMatrix<T, MS>(x));
  exec.fence();
  Matrix<T, MS> y("telar::onnx::predict", x.extent(0), features.back());
  Kokkos::deep_copy(y, runner.output(slot));
  return y;
}

} // namespace telar::onnx::detail
