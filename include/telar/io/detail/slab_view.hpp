#pragma once
// What io/ reads from and restores into a telar::SlabDataParallel (a
// friend of it), as trainer_view.hpp and trainer_access.hpp do for a
// telar::Trainer: the run's world communicator, the graph's buffers, every
// tensor's pieces in this rank's shard, the shard's values and optimizer
// state (ZeRO-3: the residency's value shard). When the update sums over
// the world, its shards span every rank (ZeRO: each rank owns its shard;
// else world rank 0 owns all); otherwise every rank of a spatial group
// holds the same parameters, so only its first rank owns pieces (ZeRO:
// each dp rank its shard; else dp rank 0). The buffers (BatchNorm's
// running statistics, equal over the group) are written by dp rank 0's
// first spatial rank.
#include <telar/io/detail/model_buffers.hpp>
#include <telar/io/detail/model_pieces.hpp>
#include <telar/io/detail/store_pieces.hpp>
#include <telar/io/detail/trainer_access.hpp>
#include <telar/io/error.hpp>
#include <telar/optim/optimizer.hpp>
#include <telar/parallel/slab_data_parallel.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace telar::detail {

struct SlabView {
  // Every rank of the run; refused (the same on every rank: sp is) when the
  // graph is split and the update was given no world.
  template <class S>
  static Communicator const* comm(S const& s) {
    if (s.world() == nullptr && s.graph_.spatial_size() > 1)
      throw CheckpointError("telar::checkpoint: the SlabDataParallel of a graph split over sp = " +
                            std::to_string(s.graph_.spatial_size()) +
                            " needs SlabDataParallelOptions::world, every rank of the run");
    return s.world();
  }
  template <class S>
  static char const* optimizer_name() {
    return telar::optimizer_name<typename S::optimizer_type>();
  }
  template <class S>
  static std::vector<ModelBuffer<typename S::value_type>> buffers(S& s) {
    bool const writer = s.dp_rank() == 0 && s.graph_.spatial_rank() == 0;
    return model_buffers<typename S::value_type>(s.graph_, comm(s), writer);
  }
  template <class S>
  static void set_buffers(S& s, std::vector<ModelBuffer<typename S::value_type>> const& b) {
    set_model_buffers(s.graph_, b);
  }
  template <class S>
  static ModelPieces pieces(S& s) {
    bool const owner =
        s.sums_over_world() // shards span every rank
            ? S::sharding::stage > 0 || s.rank() == 0
            : (S::sharding::stage > 0 || s.dp_rank() == 0) && s.graph_.spatial_rank() == 0;
    return store_pieces(s.graph_, s.store_, s.tensors_.names(), s.shard(),
                        optimizer_traits<typename S::optimizer_type>::state_size, comm(s),
                        [&](ParameterInfo const&) { return owner; });
  }
  // No dropout in a slab graph: no seed keys anything.
  template <class S>
  static std::uint64_t seed(S const&) {
    return 0;
  }

  template <class S>
  static std::vector<typename S::value_type> values(S const& s) {
    return host_copy(s.residency_.optimizer_values(s.sync_, s.store_));
  }
  template <class S>
  static std::vector<typename S::value_type> state(S const& s) {
    return host_copy(s.engine_.state());
  }
  template <class S>
  static void restore(S& s, std::vector<typename S::value_type> const& values,
                      std::vector<typename S::value_type> const& state, long long step,
                      long long skipped = 0) {
    copy_from_host(values, s.residency_.optimizer_values(s.sync_, s.store_));
    copy_from_host(state, s.engine_.state());
    typename S::execution_space exec;
    s.sync_.publish(exec, s.store_); // ZeRO-3: nothing (the next gathers read the shard)
    exec.fence();
    s.step_ = step;
    s.skipped_ = skipped;
  }
};

} // namespace telar::detail
