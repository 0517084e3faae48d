#pragma once
// What io/ reads from a telar::Trainer, through its public accessors only:
// the world communicator, the optimizer's name, the model's buffers, and
// every tensor's name, global shape and this rank's pieces of it.
#include <telar/io/detail/model_buffers.hpp>
#include <telar/io/detail/model_pieces.hpp>
#include <telar/io/detail/store_pieces.hpp>
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

  // Every tensor's name and global shape, and this rank's pieces
  // (collective): data-parallel replicas hold the same values unless ZeRO
  // shards them, tensor-parallel replicas (replicas > 1) the same block.
  template <class Tr>
  static ModelPieces pieces(Tr& t) {
    using Opt = typename Tr::optimizer_type;
    bool const sharded = strategy_zero_stage<typename Tr::strategy_type>() >= 1;
    GridCoord const coords = t.grid_coords();
    return store_pieces(t.model(), t.parameter_store(), t.tensor_names(), t.optimizer_shard(),
                        optimizer_traits<Opt>::state_size, comm(t), [&](ParameterInfo const& e) {
                          return (sharded || coords.dp == 0) && (e.replicas == 1 || coords.tp == 0);
                        });
  }

  // The model seed (dropout masks are keyed by it and the step).
  template <class Tr>
  static std::uint64_t seed(Tr const& t) {
    return std::uint64_t(t.options().seed);
  }
};

} // namespace telar::detail
