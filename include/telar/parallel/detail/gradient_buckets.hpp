#pragma once
// Data-parallel gradient allreduce in buckets (bucket_plan.hpp): a bucket's
// allreduce starts as soon as backward has produced it and progresses while
// backward goes on (each poll() advances every operation in flight).
#include <telar/comm/allreduce.hpp>
#include <telar/comm/communicator.hpp>
#include <telar/comm/device_buffer.hpp>
#include <telar/core/parameters.hpp>
#include <telar/parallel/detail/bucket_plan.hpp>
#include <telar/profile/trace.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace telar::detail {

template <class T, class MemorySpace, class Algorithm>
class GradientBuckets {
public:
  using Grads = Vector<T, MemorySpace>;

  GradientBuckets() = default;

  // Buckets of at least `bucket_bytes` (whole layers, last layer first).
  GradientBuckets(Communicator const* comm, Algorithm algorithm,
                  ParameterStore<T, MemorySpace> const& store, std::size_t bucket_bytes,
                  TraceRecorder* trace)
      : comm_(comm), algorithm_(algorithm), grads_(store.grads()), trace_(trace),
        plan_(store, bucket_bytes, sizeof(T)), buckets_(plan_.size()) {
    for (std::size_t i = 0; i < buckets_.size(); ++i)
      std::tie(buckets_[i].begin, buckets_[i].end) = plan_.range(i);
  }

  bool active() const { return comm_ != nullptr && comm_->size() > 1; }
  std::size_t bucket_count() const { return buckets_.size(); }
  std::pair<std::size_t, std::size_t> bucket_range(std::size_t i) const {
    return {buckets_[i].begin, buckets_[i].end};
  }

  // Start of a step: every layer will report `calls` times (micro-batches).
  void begin_step(int calls) {
    plan_.begin_step(calls);
    for (auto& b : buckets_)
      b.started = false;
  }

  // One micro-batch's weight gradients of `layer` are accumulated.
  template <class Exec>
  void layer_done(Exec const& exec, std::size_t layer) {
    if (!active())
      return;
    long const i = plan_.ready(layer);
    if (i >= 0)
      start(exec, buckets_[std::size_t(i)], std::size_t(i));
    poll();
  }

  // Advances every reduction in flight.
  void poll() {
    if (!active())
      return;
    for (auto& b : buckets_)
      if (b.started && !b.op.done())
        if (b.op.test())
          finished(b);
  }

  // Waits for every bucket; starts any that never became ready (layers that
  // produced no gradient on this rank still take part, with zeros).
  template <class Exec>
  void finish(Exec const& exec) {
    if (!active())
      return;
    for (std::size_t i = 0; i < buckets_.size(); ++i)
      if (!buckets_[i].started)
        start(exec, buckets_[i], i);
    for (auto& b : buckets_) {
      b.op.wait();
      finished(b);
    }
  }

private:
  using Sub = decltype(Kokkos::subview(std::declval<Grads const&>(),
                                       std::declval<std::pair<std::size_t, std::size_t>>()));
  struct Bucket {
    std::size_t begin = 0, end = 0;
    bool started = false;
    bool copied_back = true;
    bool recorded = false;
    AllreduceOp<T> op;
    std::shared_ptr<AllreduceBuffer<Sub, Algorithm>> staging;
    double t_start = 0;
    std::size_t index = 0;
  };

  template <class Exec>
  void start(Exec const& exec, Bucket& b, std::size_t index) {
    b.started = true;
    b.recorded = false;
    b.index = index;
    if (b.end == b.begin)
      return;
    exec.fence(); // the gradients must be written before MPI reads them
    auto sub = Kokkos::subview(grads_, std::make_pair(b.begin, b.end));
    b.staging = std::make_shared<AllreduceBuffer<Sub, Algorithm>>(sub, true);
    b.copied_back = AllreduceBuffer<Sub, Algorithm>::direct;
    if (trace_)
      b.t_start = trace_->now();
    b.op = algorithm_.start(*comm_, b.staging->data(), b.end - b.begin);
    if (b.op.done())
      finished(b);
  }

  // Idempotent: copies a staged bucket back and records it once.
  void finished(Bucket& b) {
    if (!b.copied_back) {
      b.staging->copy_back();
      b.copied_back = true;
    }
    if (trace_ && trace_->enabled() && b.end > b.begin && !b.recorded) {
      b.recorded = true;
      trace_->add("allreduce bucket " + std::to_string(b.index) + " (" +
                      std::to_string((b.end - b.begin) * sizeof(T) >> 10) + " KiB)",
                  "comm", b.t_start, trace_->now(), 1);
    }
  }

  Communicator const* comm_ = nullptr;
  Algorithm algorithm_{};
  Grads grads_;
  TraceRecorder* trace_ = nullptr;
  BucketPlan plan_;
  std::vector<Bucket> buckets_;
};

} // namespace telar::detail
