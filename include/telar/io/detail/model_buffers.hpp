#pragma once
// A model's buffers (the Layer concept's buffers(f): BatchNorm's running
// statistics) as host vectors, for checkpoints and gather_model. Named
// "layer<k>.<name>" as parameters. Buffers are whole on every rank that
// holds their layer (no layer shards them) and equal over data-parallel
// replicas (the Trainer averages them), so one rank per stage writes each.
#include <telar/comm/communicator.hpp>
#include <telar/core/layer.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace telar::detail {

template <class T>
struct ModelBuffer {
  std::string name;      // "layer<k>.<name>"
  std::vector<T> values; // this rank's copy (empty: its layer is on another stage)
  std::size_t size = 0;  // elements, agreed over ranks
  bool owner = false;    // this rank writes it (and counts it in checksums)
};

// Calls f(full name, view) for every buffer of model's layers.
template <class Model, class F>
void for_each_model_buffer(Model& model, F&& f) {
  model.for_each_layer(
      [&](auto index, auto& layer) { prefixed_buffers(layer, layer_prefix(model, index), f); });
}

// Every buffer of the model with this rank's values; sizes agreed over
// `comm` (collective); `writer`: this rank writes what it holds.
template <class T, class Model>
std::vector<ModelBuffer<T>> model_buffers(Model& model, Communicator const* comm, bool writer) {
  std::vector<ModelBuffer<T>> out;
  for_each_model_buffer(model, [&](char const* name, auto& v) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, v);
    out.push_back({name, std::vector<T>(h.data(), h.data() + h.span()), h.span(), false});
  });
  std::vector<std::uint64_t> sizes;
  for (auto const& b : out)
    sizes.push_back(b.size);
  if (comm != nullptr && comm->size() > 1 && !sizes.empty())
    comm->allreduce(sizes.data(), sizes.size(), ReduceOp::max);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i].owner = writer && out[i].size > 0;
    out[i].size = std::size_t(sizes[i]);
  }
  return out;
}

// Copies values back into the buffers this rank holds.
template <class T, class Model>
void set_model_buffers(Model& model, std::vector<ModelBuffer<T>> const& in) {
  std::size_t i = 0;
  for_each_model_buffer(model, [&](char const*, auto& v) {
    auto const& b = in[i++];
    if (v.span() == 0 || b.values.size() != v.span())
      return;
    auto h = Kokkos::create_mirror_view(v);
    for (std::size_t k = 0; k < b.values.size(); ++k)
      h.data()[k] = b.values[k];
    Kokkos::deep_copy(v, h);
  });
}

} // namespace telar::detail
