#pragma once
// What io/ reads from a telar::Trainer, through its public accessors only:
// the world communicator, the optimizer's name, the model's buffers, and
// every tensor's name, global shape and this rank's pieces of it.
#include <telar/io/detail/model_buffers.hpp>
#include <telar/io/detail/model_pieces.hpp>
#include <telar/io/error.hpp>
#include <telar/optim/optimizer.hpp>
#include <telar/train/trainer.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace telar::detail {

struct TrainerView {
  // The trainer's world communicator (null without MPI).
  template <class Tr>
  static Communicator const* comm(Tr const& t) {
    return t.grid() ? &t.grid()->world() : nullptr;
  }

  template <class Tr>
  static char const* optimizer_name() {
    return telar::optimizer_name<typename Tr::optimizer_type>();
  }

  // Every buffer with this rank's values; the first data-parallel and
  // tensor-parallel replica of each stage writes (collective).
  template <class Tr>
  static std::vector<ModelBuffer<typename Tr::value_type>> buffers(Tr& t) {
    GridCoord const c = t.grid_coords();
    return model_buffers<typename Tr::value_type>(t.model(), comm(t), c.dp == 0 && c.tp == 0);
  }
  // Sets the buffers this rank holds.
  template <class Tr>
  static void set_buffers(Tr& t, std::vector<ModelBuffer<typename Tr::value_type>> const& b) {
    set_model_buffers(t.model(), b);
  }

  // Every tensor's name and global shape, and this rank's pieces (collective).
  template <class Tr>
  static ModelPieces pieces(Tr& t) {
    using Opt = typename Tr::optimizer_type;
    auto const [lo, hi] = t.optimizer_shard();
    ModelPieces m;
    m.names = t.tensor_names();
    m.shard_size = hi - lo;
    m.state_size = optimizer_traits<Opt>::state_size;
    // Local extents and blocks of this rank's tensors, by name.
    std::vector<std::vector<std::size_t>> local(m.names.size()), global(m.names.size());
    std::vector<TensorBlock> blocks(m.names.size());
    auto id = [&](std::string const& n) {
      for (std::size_t i = 0; i < m.names.size(); ++i)
        if (m.names[i] == n)
          return i;
      return m.names.size();
    };
    auto const& entries = t.parameter_store().entries();
    t.model().for_each_layer([&](auto index, auto& layer) {
      using L = std::decay_t<decltype(layer)>;
      if constexpr (layer_traits<L>::has_parameters)
        layer.parameters([&](char const* name, auto& value, auto&) {
          std::string const full = layer_prefix(t.model(), index) + name;
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
    agree_shapes(comm(t), m, global);
    bool const sharded = strategy_zero_stage<typename Tr::strategy_type>() >= 1;
    GridCoord const coords = t.grid_coords();
    for (auto const& [e, off, len] : t.parameter_store().pieces(lo, hi)) {
      auto const& entry = entries[e];
      std::size_t const k = id(entry.name);
      TensorPiece p;
      p.tensor = k;
      p.shard_offset = off;
      p.local_begin = lo + off - entry.offset;
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
      // Data-parallel replicas hold the same values unless ZeRO shards
      // them; tensor-parallel replicas (replicas > 1) the same block.
      p.owner = (sharded || coords.dp == 0) && (entry.replicas == 1 || coords.tp == 0);
      m.pieces.push_back(p);
    }
    check_cover(comm(t), m);
    return m;
  }

  // The owned pieces of every tensor must cover it exactly once (a layer
  // that shards a tensor without saying where, parameter_block, would not).
  static void check_cover(Communicator const* comm, ModelPieces const& m) {
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

  // The model seed (dropout masks are keyed by it and the step).
  template <class Tr>
  static std::uint64_t seed(Tr const& t) {
    return std::uint64_t(t.options().seed);
  }
};

} // namespace telar::detail
