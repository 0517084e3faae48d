#pragma once
// Gradient sync for ZeRO stage 2: rank r of the data-parallel group owns the
// flat range [r N/dp, (r+1) N/dp) of parameters, as in ZeRO<1>. Gradients
// are reduce-scattered bucket by bucket as backward completes them (the
// buckets of bucket_plan.hpp): each bucket is one MPI_Ireduce_scatter whose
// block for rank r is the part of the bucket inside r's shard, received
// straight into r's shard-sized gradient buffer. So reduction overlaps
// backward as with NoSharding, the reduced gradient kept on a rank is its
// shard only, and the optimizer updates the shard as in ZeRO<1>; the updated
// shards are then all-gathered.
//
// The layers still accumulate their micro-batches' gradients into the full
// flat buffer of the ParameterStore: a bucket is reduced once, after its
// last micro-batch, not once per micro-batch.
#include <telar/comm/communicator.hpp>
#include <telar/comm/device_buffer.hpp>
#include <telar/core/parameters.hpp>
#include <telar/parallel/detail/bucket_plan.hpp>
#include <telar/parallel/detail/gradient_sync_decl.hpp>
#include <telar/parallel/detail/zero_sharding.hpp>
#include <telar/parallel/strategy.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace telar::detail {

template <class T, class MemorySpace, class Algorithm>
class GradientSync<ZeRO<2>, T, MemorySpace, Algorithm> {
public:
  using Store = ParameterStore<T, MemorySpace>;
  using Vec = Vector<T, MemorySpace>;

  GradientSync() = default;
  explicit GradientSync(SyncContext const& ctx) : ctx_(ctx) {}

  // Equal shards: the store's length is rounded up to a multiple of dp.
  // With one data-parallel rank there is nothing to shard: as NoSharding.
  template <class Model>
  void bind(Model& model, std::vector<bool> const& owned, Store& store) {
    if (!ctx_.data_parallel()) {
      store.bind(model, owned);
      size_ = chunk_ = store.size();
      return;
    }
    std::size_t const p = std::size_t(ctx_.dp->size());
    store.bind(
        model, owned,
        [](std::size_t n) {
          return std::make_pair(Vec("telar::ParameterStore::values", n),
                                Vec("telar::ParameterStore::grads", n));
        },
        true, p * store.alignment);
    size_ = store.size();
    chunk_ = size_ / p;
    lo_ = std::size_t(ctx_.dp->rank()) * chunk_;
    shard_grads_ = Vec("telar::ZeRO::shard_grads", chunk_);
    grads_ = store.grads();
    plan_ = BucketPlan(store, ctx_.bucket_bytes, sizeof(T));
    buckets_ = std::vector<Bucket>(plan_.size());
    for (std::size_t i = 0; i < buckets_.size(); ++i)
      split(buckets_[i], plan_.range(i), p);
  }

  std::pair<std::size_t, std::size_t> shard() const { return {lo_, lo_ + chunk_}; }
  std::size_t bucket_count() const { return buckets_.size(); }

  void begin_step(int calls) {
    plan_.begin_step(calls);
    for (auto& b : buckets_)
      b.started = false;
  }
  template <class Exec>
  void gradient_ready(Exec const& exec, std::size_t layer) {
    if (!active())
      return;
    long const i = plan_.ready(layer);
    if (i >= 0)
      start(exec, std::size_t(i));
    poll();
  }
  void poll() {
    for (auto& b : buckets_)
      if (b.started && !b.received && b.request.test())
        received(b);
  }
  // Buckets that never became ready (layers without gradients on this rank)
  // still take part, with zeros.
  template <class Exec>
  void end_backward(Exec const& exec) {
    if (!active())
      return;
    for (std::size_t i = 0; i < buckets_.size(); ++i)
      if (!buckets_[i].started)
        start(exec, i);
    for (auto& b : buckets_)
      if (!b.received) {
        b.request.wait();
        received(b);
      }
  }

  template <class Exec>
  void reduce(Exec const&, Store const&) {} // the buckets did it
  Vec values(Store const& store) const {
    return active() ? Vec(store.values().data() + lo_, chunk_) : store.values();
  }
  Vec grads(Store const& store) const { return active() ? shard_grads_ : store.grads(); }
  // Shards are distinct on every rank of the world: norms sum over all.
  void sum_norms(double* v, std::size_t n) const {
    if (active())
      ctx_.world->allreduce(v, n);
    else
      ctx_.sum_model_parallel(v, n);
  }
  template <class Exec>
  void publish(Exec const& exec, Store const& store) {
    if (active())
      allgather_shards(exec, *ctx_.dp, store.values(), chunk_);
  }

private:
  struct Bucket {
    std::size_t begin = 0, end = 0; // in the flat store
    std::size_t out = 0;            // where this rank's block lands in shard_grads_
    std::vector<int> counts;        // block of each rank (MPI reads it until completion)
    bool started = false, received = true;
    Request request;
    std::unique_ptr<HostBuffer<Vec>> send, recv;
    double t_start = 0;
  };

  bool active() const { return ctx_.data_parallel(); }

  // Rank q's block of a bucket: the part of [b, e) inside q's shard.
  void split(Bucket& bucket, std::pair<std::size_t, std::size_t> range, std::size_t p) const {
    auto const [b, e] = range;
    bucket.begin = b;
    bucket.end = e;
    bucket.counts.assign(p, 0);
    for (std::size_t q = 0; q < p; ++q) {
      std::size_t const lo = std::max(b, q * chunk_), hi = std::min(e, (q + 1) * chunk_);
      bucket.counts[q] = hi > lo ? int(hi - lo) : 0;
    }
    bucket.out = std::clamp(b, lo_, lo_ + chunk_) - lo_;
  }

  template <class Exec>
  void start(Exec const& exec, std::size_t i) {
    Bucket& b = buckets_[i];
    b.started = true;
    b.received = b.end == b.begin;
    if (b.received)
      return;
    exec.fence(); // the gradients must be written before MPI reads them
    std::size_t const mine = std::size_t(b.counts[std::size_t(ctx_.dp->rank())]);
    b.send = std::make_unique<HostBuffer<Vec>>(Vec(grads_.data() + b.begin, b.end - b.begin), true);
    b.recv = std::make_unique<HostBuffer<Vec>>(Vec(shard_grads_.data() + b.out, mine), false);
    b.t_start = ctx_.trace ? ctx_.trace->now() : 0;
    b.request = ctx_.dp->ireduce_scatter(b.send->data(), b.recv->data(), b.counts);
  }

  void received(Bucket& b) {
    b.received = true;
    b.recv->copy_back();
    if (ctx_.trace)
      ctx_.trace->add("reduce-scatter bucket (" +
                          std::to_string((b.end - b.begin) * sizeof(T) >> 10) + " KiB)",
                      "comm", b.t_start, ctx_.trace->now(), 1);
  }

  SyncContext ctx_;
  std::size_t size_ = 0, chunk_ = 0, lo_ = 0;
  Vec grads_, shard_grads_;
  BucketPlan plan_;
  std::vector<Bucket> buckets_;
};

} // namespace telar::detail
