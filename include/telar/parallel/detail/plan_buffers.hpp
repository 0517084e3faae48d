#pragma once
// Bytes of the buffers (BatchNorm's running statistics) of one rank's
// layers, for telar::plan_memory: counted with the parameters, since the
// layers allocate them in initialize() beside their parameters (the
// Trainer's meter puts them there too). Whole on every rank that owns the
// layer: no strategy shards them.
#include <telar/core/layer.hpp>

#include <cstddef>
#include <vector>

namespace telar::detail {

template <class Model>
std::size_t plan_buffer_bytes(Model const& model, std::vector<bool> const& owned) {
  std::size_t n = 0;
  model.for_each_layer([&](auto index, auto const& layer) {
    if (owned[index])
      n += buffer_count_of(layer);
  });
  return n * sizeof(typename Model::value_type);
}

} // namespace telar::detail
