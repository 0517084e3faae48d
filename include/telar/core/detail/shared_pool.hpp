#pragma once
// Buffers the blocks of a stage share. A block's inner tensors that no
// backward reads, and its inner gradients when its backward runs as one call
// (input and weight parts together, every schedule but the zero-bubble
// ones), are needed only during one call of that block. Blocks at the same
// nesting depth never run at once, so one pair of buffers per depth serves
// every block and every micro-batch of a stage; the two alternate by layer
// index, so a layer's input and output never share one. The stage runner
// owns the pool and hands it to its blocks (set_shared_pool); a block
// without one (run on its own, or inside telar::Recompute) keeps every
// inner tensor with its micro-batch.
#include <telar/core/detail/type_traits.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

namespace telar::detail {

// Per-sample size of the largest tensor of each parity (even, odd layer
// index) that a depth's buffers must hold.
using PoolExtents = std::vector<std::pair<std::size_t, std::size_t>>;

inline void note_pool_extent(PoolExtents& most, std::size_t depth, std::size_t k,
                             std::size_t size) {
  if (most.size() <= depth)
    most.resize(depth + 1, {0, 0});
  std::size_t& m = k % 2 ? most[depth].second : most[depth].first;
  m = std::max(m, size);
}

template <class T>
std::size_t pool_bytes(PoolExtents const& most, std::size_t rows) {
  std::size_t n = 0;
  for (auto const& [even, odd] : most)
    n += view_bytes<T>(rows * even) + view_bytes<T>(rows * odd);
  return n;
}

template <class T, class Space>
class SharedPool {
public:
  // Room for `rows` samples of the per-sample sizes `most` at `depth`
  // (grows only: a smaller micro-batch reuses the buffers).
  void reserve(std::size_t depth, std::size_t rows, std::pair<std::size_t, std::size_t> most) {
    if (bufs_.size() <= depth)
      bufs_.resize(depth + 1);
    std::size_t const need[2] = {rows * most.first, rows * most.second};
    for (int p = 0; p < 2; ++p)
      if (need[p] > bufs_[depth][p].extent(0)) {
        bufs_[depth][p] = {}; // freed first: never the old and the new at once
        bufs_[depth][p] =
            View(Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::activation"), need[p]);
      }
  }
  // Layer k's tensor at `depth`, [rows, features], in the buffer of k's parity.
  Matrix<T, Space> at(std::size_t depth, std::size_t k, std::size_t rows,
                      std::size_t features) const {
    return Matrix<T, Space>(bufs_[depth][k % 2].data(), rows, features);
  }
  void clear() { bufs_.clear(); }

private:
  using View = Kokkos::View<T*, Space>;
  std::vector<std::array<View, 2>> bufs_;
};

// A block's hold on its stage's pool and its depth there. A copy or a moved
// block starts without one: it runs on its own (a calibration's copy, a
// model handed on), never beside the stage that made the pool.
template <class T, class Space>
class PoolHandle {
public:
  using Pool = std::shared_ptr<SharedPool<T, Space>>;
  PoolHandle() = default;
  PoolHandle(PoolHandle const&) {}
  PoolHandle& operator=(PoolHandle const&) {
    pool_.reset();
    depth_ = 0;
    return *this;
  }
  void set(Pool pool, std::size_t depth) {
    pool_ = std::move(pool);
    depth_ = depth;
  }
  SharedPool<T, Space>* operator->() const { return pool_.get(); }
  explicit operator bool() const { return bool(pool_); }
  std::size_t depth() const { return depth_; }

private:
  Pool pool_;
  std::size_t depth_ = 0;
};

// Blocks that take a pool (set_shared_pool(pool, depth)); they also say what
// they keep per micro-batch with it (pooled_saved_bytes(samples, in, split))
// and what the pool must hold for them (pool_extents(in, split, most, depth)).
template <class L>
using set_shared_pool_t = decltype(std::declval<L&>().set_shared_pool(
    std::declval<
        typename PoolHandle<typename L::value_type, typename L::memory_space>::Pool const&>(),
    std::size_t{}));
template <class L>
inline constexpr bool takes_shared_pool_v = is_detected_v<set_shared_pool_t, L>;

template <class L, class Pool>
void pass_shared_pool(L& layer, Pool const& pool, std::size_t depth) {
  if constexpr (takes_shared_pool_v<L>)
    layer.set_shared_pool(pool, depth);
  else
    (void)layer, (void)pool, (void)depth;
}

// What `layer` keeps per micro-batch where a pool serves it (`split`: its
// backward runs as two calls, so inner gradients stay with the micro-batch).
template <class L>
std::size_t pooled_saved_bytes_of(L const& layer, std::size_t samples, Shape const& in,
                                  bool compact, bool split) {
  if constexpr (takes_shared_pool_v<L>)
    return (void)compact, layer.pooled_saved_bytes(samples, in, split);
  else
    return (void)split, saved_bytes_of(layer, samples, in, compact);
}
template <class L>
void pool_extents_of(L const& layer, Shape const& in, bool split, PoolExtents& most,
                     std::size_t depth) {
  if constexpr (takes_shared_pool_v<L>)
    layer.pool_extents(in, split, most, depth);
  else
    (void)layer, (void)in, (void)split, (void)most, (void)depth;
}

} // namespace telar::detail
