#pragma once
// Gradient buckets: contiguous ranges of the flat gradient buffer formed
// from whole layers in backward order (last layer first), so a bucket is
// complete as soon as its last layer's final micro-batch has run
// backward_weight. The plan only says which bucket a layer completes; what
// happens to a complete bucket (allreduce, reduce-scatter) is its owner's.
#include <algorithm>
#include <cstddef>
#include <map>
#include <utility>
#include <vector>

namespace telar::detail {

class BucketPlan {
public:
  BucketPlan() = default;

  // Buckets of at least `bucket_bytes` over the layers of `store` (a
  // ParameterStore), `element_bytes` per gradient value.
  template <class Store>
  BucketPlan(Store const& store, std::size_t bucket_bytes, std::size_t element_bytes) {
    std::vector<std::size_t> layers;
    for (auto const& p : store.entries())
      if (layers.empty() || layers.back() != p.layer)
        layers.push_back(p.layer);
    std::reverse(layers.begin(), layers.end());
    Bucket current;
    for (std::size_t layer : layers) {
      auto const [b, e] = store.layer_range(layer);
      current.begin = current.layers.empty() ? b : std::min(current.begin, b);
      current.end = current.layers.empty() ? e : std::max(current.end, e);
      current.layers.push_back(layer);
      if ((current.end - current.begin) * element_bytes >= bucket_bytes) {
        buckets_.push_back(std::move(current));
        current = Bucket{};
      }
    }
    if (!current.layers.empty())
      buckets_.push_back(std::move(current));
    for (std::size_t i = 0; i < buckets_.size(); ++i)
      for (std::size_t layer : buckets_[i].layers)
        bucket_of_[layer] = i;
  }

  std::size_t size() const { return buckets_.size(); }
  std::pair<std::size_t, std::size_t> range(std::size_t i) const {
    return {buckets_[i].begin, buckets_[i].end};
  }

  // The bucket holding `layer`, or -1 (a layer without parameters here).
  long bucket_of(std::size_t layer) const {
    auto it = bucket_of_.find(layer);
    return it == bucket_of_.end() ? -1 : long(it->second);
  }
  std::vector<std::size_t> const& layers(std::size_t i) const { return buckets_[i].layers; }
  // Every bucket's flat range, in backward order.
  std::vector<std::pair<std::size_t, std::size_t>> ranges() const {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    for (std::size_t i = 0; i < size(); ++i)
      out.push_back(range(i));
    return out;
  }

  // Start of a step: every layer will report `calls` times (micro-batches).
  void begin_step(int calls) {
    for (auto& b : buckets_)
      b.remaining = int(b.layers.size()) * calls;
  }

  // One micro-batch's gradient of `layer` is accumulated: the index of the
  // bucket this completes, or -1.
  long ready(std::size_t layer) {
    auto it = bucket_of_.find(layer);
    if (it == bucket_of_.end())
      return -1;
    return --buckets_[it->second].remaining == 0 ? long(it->second) : -1;
  }

private:
  struct Bucket {
    std::size_t begin = 0, end = 0;
    std::vector<std::size_t> layers;
    int remaining = 0;
  };
  std::vector<Bucket> buckets_;
  std::map<std::size_t, std::size_t> bucket_of_;
};

} // namespace telar::detail
