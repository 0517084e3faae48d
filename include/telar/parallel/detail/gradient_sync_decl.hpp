#pragma once
// The gradient-synchronisation component: what the data-parallel ranks do
// with the gradients between backward and the optimizer, and with the
// parameters after it. One specialisation per sharding policy, each in its
// own file (CUTLASS keeps one collective per dispatch policy the same way),
// but one for ZeRO-2 and -3, which differ in three functions:
//
//   sync_no_sharding.hpp  NoSharding: allreduce in buckets during backward
//   sync_zero1.hpp        ZeRO<1>: reduce each rank's shard after backward,
//                         update the shard, all-gather the parameters
//   sync_group_gradients.hpp
//                         ZeRO<2> and ZeRO<3, Gather>: reduce-scatter group by
//                         group during backward into a shard-sized buffer,
//                         holding only the groups in progress
//                         (group_gradients.hpp); ZeRO<2> then as ZeRO<1>, while
//                         ZeRO<3>'s values are the residency's shard
//                         (residency_gathered.hpp), so nothing is published
//
// Where the parameter values live is the residency component's
// (residency.hpp): it draws the layers and, under ZeRO-3, lays the store out
// before bind() runs.
//
// Every specialisation offers, for ParameterStore<T, MemorySpace> store:
//   GradientSync(SyncContext const&)
//   bind(model, owned, store)       binds the store (its buffers are the sync's to choose)
//   shard()                         [begin, end) of the flat store this rank's optimizer updates
//   begin_step(calls)               every layer will report `calls` times
//   before_backward(layer)          a layer's backward is about to run (ZeRO-2/3:
//                                   its group's gradient buffer must exist)
//   gradient_ready(exec, layer)     one micro-batch's gradient of `layer` is accumulated
//   poll()                          advance communication in flight
//   end_backward(exec)              every gradient is produced: finish what overlaps backward
//   reduce(exec, store)             make grads() the summed gradient of the shard
//   values(store), grads(store)     what the optimizer updates (shard() long;
//                                   ZeRO-3: the residency's shard instead of values)
//   sum_norms(v, n)                 sums per-tensor norm pieces over the ranks that hold them
//   publish(exec, store)            every rank sees the updated parameters
//   bucket_count()                  buckets that overlap backward
#include <telar/comm/communicator.hpp>
#include <telar/core/detail/type_traits.hpp>
#include <telar/profile/trace.hpp>

#include <cstddef>

namespace telar::detail {

// What a gradient-sync component works with (collective objects owned by the
// process grid, which outlives it).
struct SyncContext {
  Communicator const* dp = nullptr;    // null or one rank: nothing to synchronise
  Communicator const* world = nullptr; // every rank: where shard norms are summed
  Communicator const* mp = nullptr;    // the ranks of one model replica
  std::size_t bucket_bytes = std::size_t(8) << 20;
  bool shared_memory = true; // ZeRO: may use MPI-3 shared memory on one node
  TraceRecorder* trace = nullptr;
  // ZeRO-3 gathers parameter values as bf16 (Precision<bf16, ...>: the
  // bf16 kernels round them anyway): half the gather bytes.
  bool bf16_gathers = false;
  // ZeRO's gradient reduce-scatters send bf16 words (Precision<..., bf16>):
  // half the bytes, each addition rounded to bf16 (docs/precision.md).
  bool bf16_gradients = false;

  bool data_parallel() const { return dp != nullptr && dp->size() > 1; }
  // Sums v over the ranks of one model replica (pipeline stages, tensor shards).
  void sum_model_parallel(double* v, std::size_t n) const {
    if (mp != nullptr && mp->size() > 1)
      mp->allreduce(v, n);
  }
};

template <class Sharding, class T, class MemorySpace, class Algorithm>
class GradientSync {
  static_assert(dependent_false<Sharding>,
                "telar::DataParallel: no gradient synchronisation for this sharding policy; use "
                "telar::NoSharding, telar::ZeRO<1>, telar::ZeRO<2> or telar::ZeRO<3>");
};

} // namespace telar::detail
