#pragma once
// This rank's pieces (model_pieces.hpp) of a model bound into a flat
// telar::ParameterStore: every tensor's name and global shape (each layer's
// parameter_block places its local tensor), and the parts of the local
// tensors inside the flat range [lo, hi) the rank's optimizer updates. What
// checkpoints read from a telar::Trainer (trainer_view.hpp) and from a
// telar::SlabDataParallel (slab_view.hpp) alike.
#include <telar/comm/communicator.hpp>
#include <telar/core/layer.hpp>
#include <telar/io/detail/model_pieces.hpp>
#include <telar/io/error.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace telar::detail {

// The owned pieces of every tensor must cover it exactly once (a layer
// that shards a tensor without saying where, parameter_block, would not).
inline void check_cover(Communicator const* comm, ModelPieces const& m) {
  std::vector<std::uint64_t> owned(m.names.size(), 0);
  for (auto const& p : m.pieces)
    if (p.owner)
      owned[p.tensor] += p.size;
  if (comm != nullptr && comm->size() > 1 && !owned.empty())
    comm->allreduce(owned.data(), owned.size());
  for (std::size_t t = 0; t < m.names.size(); ++t) {
    std::uint64_t n = 1;
    for (std::size_t d : m.shapes[t])
      n *= d;
    if (owned[t] != n)
      throw CheckpointError("telar::checkpoint: tensor " + m.names[t] + " " +
                            shape_str(m.shapes[t]) + " has " + std::to_string(n) +
                            " elements but the ranks hold " + std::to_string(owned[t]) +
                            " distinct ones: is its layer tensor-parallel without "
                            "parameter_block (telar/core/layer.hpp)?");
  }
}

// The pieces of `model` (bound into `store`) inside [shard.first,
// shard.second), `names` every tensor of the model (some may be on other
// ranks), `owns(entry)` whether this rank writes a piece of that store
// entry. Collective over `comm` (shapes agreed, the cover checked).
template <class Model, class Store, class Owns>
ModelPieces store_pieces(Model& model, Store const& store, std::vector<std::string> names,
                         std::pair<std::size_t, std::size_t> shard, int state_size,
                         Communicator const* comm, Owns&& owns) {
  ModelPieces m;
  m.names = std::move(names);
  m.shard_size = shard.second - shard.first;
  m.state_size = state_size;
  // Local extents and blocks of this rank's tensors, by name.
  std::vector<std::vector<std::size_t>> local(m.names.size()), global(m.names.size());
  std::vector<TensorBlock> blocks(m.names.size());
  auto id = [&](std::string const& n) {
    for (std::size_t i = 0; i < m.names.size(); ++i)
      if (m.names[i] == n)
        return i;
    return m.names.size();
  };
  auto const& entries = store.entries();
  model.for_each_layer([&](auto index, auto& layer) {
    using L = std::decay_t<decltype(layer)>;
    if constexpr (layer_traits<L>::has_parameters)
      layer.parameters([&](char const* name, auto& value, auto&) {
        std::string const full = layer_prefix(model, index) + name;
        bool held = false;
        for (auto const& e : entries)
          held = held || e.name == full;
        std::size_t const k = id(full);
        if (!held || k == m.names.size())
          return;
        std::vector<std::size_t> ext;
        for (unsigned d = 0; d < std::decay_t<decltype(value)>::rank; ++d)
          ext.push_back(value.extent(d));
        local[k] = ext;
        blocks[k] = telar::parameter_block(layer, name, ext);
        global[k] = blocks[k].shape;
      });
  });
  agree_shapes(comm, m, global);
  for (auto const& [e, off, len] : store.pieces(shard.first, shard.second)) {
    auto const& entry = entries[e];
    std::size_t const k = id(entry.name);
    TensorPiece p;
    p.tensor = k;
    p.shard_offset = off;
    p.local_begin = shard.first + off - entry.offset;
    p.size = len;
    auto const& ext = local[k];
    auto const& b = blocks[k];
    if (ext.size() == 1) {
      p.local_cols = ext[0];
      p.col0 = b.offset[0];
    } else {
      p.local_rows = ext[0];
      p.local_cols = ext.size() > 1 ? ext[1] : 1;
      p.row0 = b.offset[0];
      p.col0 = b.offset.size() > 1 ? b.offset[1] : 0;
    }
    p.owner = owns(entry);
    m.pieces.push_back(p);
  }
  check_cover(comm, m);
  return m;
}

} // namespace telar::detail
