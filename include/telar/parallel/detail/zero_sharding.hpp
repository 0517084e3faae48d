#pragma once
// ZeRO stage 1 over the data-parallel group: rank r owns the optimizer state
// of the flat range [r N/dp, (r+1) N/dp) and is the only one to update it.
//
// Shared mode (every dp rank on one node, host memory): the node holds ONE
// copy of the parameters in an MPI-3 shared window and every rank's gradient
// buffer lives in a second window. After backward each rank sums its shard
// straight out of the other ranks' gradient buffers (no message, no copy),
// updates its shard of the shared parameters, and a fence makes the update
// visible. Per rank this moves about as many bytes as a serial optimizer
// step, so data parallelism costs almost nothing on top of the compute.
//
// Distributed mode (anything else): reduce-scatter the gradients, update the
// shard, all-gather the parameters.
#include <telar/comm/communicator.hpp>
#include <telar/comm/device_buffer.hpp>
#include <telar/comm/shared_window.hpp>
#include <telar/core/parameters.hpp>
#include <telar/optim/detail/engine.hpp>
#include <telar/profile/memory.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace telar::detail {

// Every rank's updated shard [r chunk, (r+1) chunk) of `values`, gathered
// into `values` on every rank of `dp` (ZeRO stages 1 and 2, messages).
template <class Exec, class T, class MemorySpace>
void allgather_shards(Exec const& exec, Communicator const& dp,
                      Vector<T, MemorySpace> const& values, std::size_t chunk) {
  using Vec = Vector<T, MemorySpace>;
  exec.fence();
  Vec shard("telar::ZeRO::shard_values", chunk);
  Kokkos::deep_copy(shard, Vec(values.data() + std::size_t(dp.rank()) * chunk, chunk));
  HostBuffer<Vec> send(shard, true);
  HostBuffer<Vec> recv(values, false);
  dp.allgather(send.data(), chunk, recv.data());
  recv.copy_back();
}

template <class T, class MemorySpace>
class ZeroOneSharding {
public:
  using Vec = Vector<T, MemorySpace>;
  static constexpr bool host_memory =
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible;

  ZeroOneSharding() = default;

  // Collective over `dp`. Decides the mode (`allow_shared` false forces the
  // distributed one).
  ZeroOneSharding(Communicator const* dp, bool allow_shared) : dp_(dp) {
    bool same_node = false;
    if constexpr (host_memory) {
      if (!allow_shared) {
        shared_ = false;
        return;
      }
      node_.emplace(dp->split_shared("telar::dp_node"));
      same_node = node_->size() == dp->size();
    }
    // Every rank decides alike: the node split is collective and symmetric,
    // but agree anyway so a mixed answer cannot split the group's behaviour.
    shared_ = !dp->any(!same_node);
  }

  bool active() const { return dp_ != nullptr; }
  bool shared() const { return shared_; }
  int rank() const { return dp_->rank(); }
  int size() const { return dp_->size(); }

  // Flat buffers for ParameterStore::bind: shared windows in shared mode.
  auto allocator() {
    return [this](std::size_t n) -> std::pair<Vec, Vec> {
      if (!shared_)
        return {Vec("telar::ParameterStore::values", n), Vec("telar::ParameterStore::grads", n)};
      if constexpr (host_memory) {
        std::size_t const bytes = n * sizeof(T);
        values_window_ = SharedWindow(*node_, node_->rank() == 0 ? bytes : 0);
        grads_window_ = SharedWindow(*node_, bytes);
        for (int r = 0; r < node_->size(); ++r)
          peers_.push_back(static_cast<T*>(grads_window_.base(r)));
        Vec values(static_cast<T*>(values_window_.base(0)), n);
        Vec grads(static_cast<T*>(grads_window_.base(node_->rank())), n);
        // Windows are MPI's memory, not Kokkos': record them for the meter.
        if (node_->rank() == 0)
          values_record_ = MemoryRecord("telar::ParameterStore::values", values.data(), bytes);
        grads_record_ = MemoryRecord("telar::ParameterStore::grads", grads.data(), bytes);
        Kokkos::deep_copy(grads, T(0));
        if (node_->rank() == 0)
          Kokkos::deep_copy(values, T(0));
        return {values, grads};
      } else {
        return {};
      }
    };
  }
  // In shared mode one rank writes the node's parameters.
  bool copy_values() const { return !shared_ || node_->rank() == 0; }

  // After ParameterStore::bind: the shard of this rank.
  void bound(ParameterStore<T, MemorySpace> const& store) {
    std::size_t const n = store.size(), p = std::size_t(size()), r = std::size_t(rank());
    chunk_ = n / p; // bind() rounded n up to a multiple of p
    lo_ = r * chunk_;
    hi_ = lo_ + chunk_;
    if (shared_)
      values_window_.fence(); // rank 0's initial values are visible to all
  }

  std::size_t begin() const { return lo_; }
  std::size_t end() const { return hi_; }
  std::size_t chunk() const { return chunk_; }

  Vec values_shard(ParameterStore<T, MemorySpace> const& store) const {
    return Vec(store.values().data() + lo_, chunk_);
  }
  Vec grads_shard(ParameterStore<T, MemorySpace> const& store) const {
    return Vec(store.grads().data() + (shared_ ? lo_ : 0), chunk_);
  }

  // Sums the data-parallel gradients of this rank's shard into grads_shard().
  template <class Exec>
  void reduce(Exec const& exec, ParameterStore<T, MemorySpace> const& store) {
    exec.fence();
    if (shared_) {
      if constexpr (host_memory) {
        grads_window_.fence(); // every rank's backward is complete
        T* const out = store.grads().data() + lo_;
        std::vector<T*> const peers = peers_;
        std::size_t const lo = lo_, p = peers.size();
        // Host-only (shared mode requires host memory): a plain lambda. The
        // sum runs in rank order, so it is the same wherever it is done.
        Kokkos::parallel_for("telar::ZeRO::reduce_shard",
                             Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(0, chunk_),
                             [=](std::size_t i) {
                               T s = peers[0][lo + i];
                               for (std::size_t k = 1; k < p; ++k)
                                 s += peers[k][lo + i];
                               out[i] = s;
                             });
        Kokkos::DefaultHostExecutionSpace().fence();
      }
    } else {
      // In place: the summed shard lands at the start of the gradient buffer
      // (no second, shard-sized gradient buffer; the next step zeroes it).
      HostBuffer<Vec> grads(store.grads(), true);
      dp_->reduce_scatter(grads.data(), grads.data(), chunk_);
      grads.copy_back();
    }
  }

  // Makes every rank's updated shard visible to all.
  template <class Exec>
  void publish(Exec const& exec, ParameterStore<T, MemorySpace> const& store) {
    if (shared_) {
      exec.fence();
      if constexpr (host_memory)
        values_window_.fence();
    } else {
      allgather_shards(exec, *dp_, store.values(), chunk_);
    }
  }

private:
  Communicator const* dp_ = nullptr;
  std::optional<Communicator> node_;
  bool shared_ = false;
  SharedWindow values_window_;
  SharedWindow grads_window_;
  MemoryRecord values_record_, grads_record_;
  std::vector<T*> peers_;
  std::size_t chunk_ = 0, lo_ = 0, hi_ = 0;
};

} // namespace telar::detail
