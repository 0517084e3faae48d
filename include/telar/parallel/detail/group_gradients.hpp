#pragma once
// ZeRO-2/3 gradients: a rank holds its shard of the reduced gradient (Ψ/N)
// and only the gradient buffers of the groups (BucketPlan buckets) being
// accumulated or reduced, never the full flat gradient.
//
// A group's buffer ("telar::ZeRO::group_grads") is allocated, zeroed, at the
// group's first backward in a step and the layers' gradient views are
// rebound into it; it accumulates over the step's micro-batches. When the
// group's gradient is complete (BucketPlan::ready) it is reduce-scattered
// into the shard and freed once that reduction has completed. With several
// micro-batches in flight (pipelines, gradient accumulation) a group lives
// from its first backward to its last, so several (up to all) groups can be
// live at once; with one micro-batch at most two are.
//
// With SyncContext::bf16_gradients a group travels as bf16 words, rounded
// in place into the first half of its buffer and received into the first
// half of its block of the shard, widened there on arrival: half the bytes,
// nothing allocated beside the fp32 buffers.
//
// Peak memory has a deterministic bound (the plan's): at most one
// reduce-scatter is in flight; before group g's reduction starts, the
// previous one is waited for and its buffer freed (sooner if a poll sees it
// complete, so the peak reached depends on timing). Every dp rank starts
// the reductions in the same order (the order the groups complete in, which
// the schedule fixes), so the collectives match.
#include <telar/comm/communicator.hpp>
#include <telar/comm/detail/bf16_word.hpp>
#include <telar/comm/device_buffer.hpp>
#include <telar/core/parameters.hpp>
#include <telar/parallel/detail/bucket_plan.hpp>
#include <telar/parallel/detail/gradient_sync_decl.hpp>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace telar::detail {

template <class T, class MemorySpace>
class GroupGradients {
public:
  using Store = ParameterStore<T, MemorySpace>;
  using Vec = Vector<T, MemorySpace>;
  // Points the gradient views of the flat range [b, e) into a buffer (empty: nowhere).
  using Rebind = std::function<void(std::size_t, std::size_t, Vec const&)>;

  GroupGradients() = default;
  // `store` is laid out with a size that is a multiple of the dp size.
  GroupGradients(SyncContext const& ctx, Store const& store, Rebind rebind)
      : ctx_(ctx), rebind_(std::move(rebind)), plan_(store, ctx.bucket_bytes, sizeof(T)) {
    std::size_t const p = std::size_t(ctx_.dp->size());
    chunk_ = store.size() / p;
    lo_ = std::size_t(ctx_.dp->rank()) * chunk_;
    shard_ = Vec("telar::ZeRO::shard_grads", chunk_);
    groups_ = std::vector<Group>(plan_.size());
    for (std::size_t i = 0; i < groups_.size(); ++i)
      split(groups_[i], plan_.range(i), p);
  }

  BucketPlan const& plan() const { return plan_; }
  std::size_t group_count() const { return groups_.size(); }
  std::size_t chunk() const { return chunk_; }
  std::size_t begin() const { return lo_; }
  // The summed gradient of this rank's shard (after end_backward).
  Vec const& shard() const { return shard_; }

  void begin_step(int calls) {
    plan_.begin_step(calls);
    for (auto& g : groups_)
      g.started = false;
  }

  // A layer's backward is about to run: its group's buffer must exist.
  void before_backward(std::size_t layer) {
    long const i = plan_.bucket_of(layer);
    if (i >= 0)
      allocate(groups_[std::size_t(i)]);
  }

  template <class Exec>
  void gradient_ready(Exec const& exec, std::size_t layer) {
    long const i = plan_.ready(layer);
    if (i >= 0)
      start(exec, std::size_t(i));
    poll();
  }

  void poll() {
    if (in_flight_ >= 0 && groups_[std::size_t(in_flight_)].request.test())
      finish();
  }

  // Groups that never became complete (layers without gradient on this
  // rank) take part with zeros; then the last reduction is waited for.
  template <class Exec>
  void end_backward(Exec const& exec) {
    for (std::size_t i = 0; i < groups_.size(); ++i)
      if (!groups_[i].started) {
        allocate(groups_[i]);
        start(exec, i);
      }
    wait();
  }

private:
  struct Group {
    std::size_t begin = 0, end = 0; // in the flat store
    std::size_t out = 0;            // where this rank's block lands in shard_
    std::vector<int> counts;        // block of each rank (MPI reads it until completion)
    bool started = false;
    Vec grads;
    Request request;
    std::unique_ptr<HostBuffer<Vec>> send, recv;
    double t_start = 0;
  };

  // Rank q's block of a group: the part of [b, e) inside q's shard.
  void split(Group& g, std::pair<std::size_t, std::size_t> range, std::size_t p) const {
    auto const [b, e] = range;
    g.begin = b;
    g.end = e;
    g.counts.assign(p, 0);
    for (std::size_t q = 0; q < p; ++q) {
      std::size_t const lo = std::max(b, q * chunk_), hi = std::min(e, (q + 1) * chunk_);
      g.counts[q] = hi > lo ? int(hi - lo) : 0;
    }
    g.out = std::clamp(b, lo_, lo_ + chunk_) - lo_;
  }

  void allocate(Group& g) {
    if (g.grads.data() != nullptr || g.end == g.begin)
      return;
    g.grads = Vec("telar::ZeRO::group_grads", g.end - g.begin); // zeroed
    rebind_(g.begin, g.end, g.grads);
  }

  template <class Exec>
  void start(Exec const& exec, std::size_t i) {
    wait(); // one reduction in flight: the previous group's buffer is freed first
    Group& g = groups_[i];
    g.started = true;
    if (g.end == g.begin)
      return;
    exec.fence(); // the gradients must be written before MPI reads them
    std::size_t const mine = std::size_t(g.counts[std::size_t(ctx_.dp->rank())]);
    g.send = std::make_unique<HostBuffer<Vec>>(g.grads, true);
    g.recv = std::make_unique<HostBuffer<Vec>>(Vec(shard_.data() + g.out, mine), false);
    g.t_start = ctx_.trace ? ctx_.trace->now() : 0;
    if constexpr (std::is_same_v<T, float>) {
      if (ctx_.bf16_gradients) {
        Bf16Word const* words = narrow_in_place(g.send->data(), g.end - g.begin);
        g.request =
            ctx_.dp->ireduce_scatter(words, reinterpret_cast<Bf16Word*>(g.recv->data()), g.counts);
        in_flight_ = long(i);
        return;
      }
    }
    g.request = ctx_.dp->ireduce_scatter(g.send->data(), g.recv->data(), g.counts);
    in_flight_ = long(i);
  }

  void wait() {
    if (in_flight_ < 0)
      return;
    groups_[std::size_t(in_flight_)].request.wait();
    finish();
  }

  // The in-flight reduction completed: copy its block out, free the group.
  void finish() {
    Group& g = groups_[std::size_t(in_flight_)];
    in_flight_ = -1;
    bool const bf16 = std::is_same_v<T, float> && ctx_.bf16_gradients;
    if constexpr (std::is_same_v<T, float>)
      if (bf16)
        widen_in_place(g.recv->data(), std::size_t(g.counts[std::size_t(ctx_.dp->rank())]));
    g.recv->copy_back();
    if (ctx_.trace) // the bytes that travelled
      ctx_.trace->add("reduce-scatter group (" +
                          std::to_string((g.end - g.begin) * (bf16 ? 2 : sizeof(T)) >> 10) +
                          (bf16 ? " KiB bf16)" : " KiB)"),
                      "comm", g.t_start, ctx_.trace->now(), 1);
    g.send.reset();
    g.recv.reset();
    g.grads = Vec();
    rebind_(g.begin, g.end, Vec());
  }

  SyncContext ctx_;
  Rebind rebind_;
  BucketPlan plan_;
  std::size_t chunk_ = 0, lo_ = 0;
  Vec shard_;
  std::vector<Group> groups_;
  long in_flight_ = -1;
};

} // namespace telar::detail
