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
// Per-node mode (dp spans nodes that each hold the same number L > 1 of its
// ranks): each node keeps one copy of the parameters and its ranks' gradient
// buffers in shared windows, as above. Rank r still owns chunk r. The ranks
// with the same index on their nodes form a "cross" group of M = dp / L
// (one per node): each sums the chunks its cross group owns out of its node
// peers' buffers, the group reduce-scatters those sums (rank r keeps chunk
// r), and after the update all-gathers them back into each node's copy. A
// node sends 2 (M-1)/M of the gradient bytes across, as a two-level
// allreduce would, and holds one copy of the parameters, not L.
//
// Distributed mode (anything else): reduce-scatter the gradients, update the
// shard, all-gather the parameters.
//
// With bf16 gradients (Precision<..., bf16>) the reduce-scatters send bf16
// words, rounded in place (bf16_word.hpp); the sums in shared memory, where
// nothing travels, stay fp32.
#include <telar/comm/communicator.hpp>
#include <telar/comm/detail/bf16_word.hpp>
#include <telar/comm/device_buffer.hpp>
#include <telar/comm/shared_window.hpp>
#include <telar/core/parameters.hpp>
#include <telar/optim/detail/engine.hpp>
#include <telar/profile/memory.hpp>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
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

// How ZeroOneSharding moves gradients and parameters (see the file's notes).
enum class ZeroOneMode { distributed, shared, per_node };

template <class T, class MemorySpace>
class ZeroOneSharding {
public:
  using Vec = Vector<T, MemorySpace>;
  static constexpr bool host_memory =
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible;

  ZeroOneSharding() = default;

  // Collective over `dp`. Decides the mode (`allow_shared` false forces the
  // distributed one). Every rank decides alike: from the node sizes' minimum
  // and maximum over the group. `bf16`: gradients travel as bf16 words.
  ZeroOneSharding(Communicator const* dp, bool allow_shared, bool bf16 = false)
      : dp_(dp), bf16_(bf16) {
    if constexpr (host_memory) {
      if (!allow_shared)
        return;
      node_.emplace(dp->split_node("telar::dp_node"));
      int sizes[2] = {node_->size(), -node_->size()}; // min and -max
      dp->allreduce(sizes, 2, ReduceOp::min);
      int const local = sizes[0];
      if (local == dp->size())
        mode_ = ZeroOneMode::shared;
      else if (local == -sizes[1] && local > 1)
        mode_ = ZeroOneMode::per_node;
      if (mode_ == ZeroOneMode::per_node) {
        cross_.emplace(dp->split(node_->rank(), dp->rank(), "telar::dp_cross"));
        owners_.resize(std::size_t(cross_->size()));
        int const me = dp->rank();
        cross_->allgather(&me, 1, owners_.data()); // the chunks this cross group owns
      }
    }
  }

  bool active() const { return dp_ != nullptr; }
  bool shared() const { return mode_ != ZeroOneMode::distributed; }
  ZeroOneMode mode() const { return mode_; }
  int rank() const { return dp_->rank(); }
  int size() const { return dp_->size(); }
  // For traces: where the reduction goes, e.g. " (2 nodes of 2, shared within)".
  std::string where() const {
    if (mode_ == ZeroOneMode::shared)
      return " (shared memory)";
    if (mode_ == ZeroOneMode::per_node)
      return " (" + std::to_string(cross_->size()) + " nodes of " + std::to_string(node_->size()) +
             ", shared within)";
    return "";
  }

  // Flat buffers for ParameterStore::bind: shared windows unless distributed.
  auto allocator() {
    return [this](std::size_t n) -> std::pair<Vec, Vec> {
      if (!shared())
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
  // With shared windows one rank of each node writes the node's parameters.
  bool copy_values() const { return !shared() || node_->rank() == 0; }

  // After ParameterStore::bind: the shard of this rank.
  void bound(ParameterStore<T, MemorySpace> const& store) {
    std::size_t const n = store.size(), p = std::size_t(size()), r = std::size_t(rank());
    chunk_ = n / p; // bind() rounded n up to a multiple of p
    lo_ = r * chunk_;
    hi_ = lo_ + chunk_;
    if (mode_ == ZeroOneMode::per_node)
      across_ =
          Kokkos::View<T*, Kokkos::HostSpace>("telar::ZeRO::across_nodes", owners_.size() * chunk_);
    if (shared())
      values_window_.fence(); // each node's initial values are visible to its ranks
  }

  std::size_t begin() const { return lo_; }
  std::size_t end() const { return hi_; }
  std::size_t chunk() const { return chunk_; }

  Vec values_shard(ParameterStore<T, MemorySpace> const& store) const {
    return Vec(store.values().data() + lo_, chunk_);
  }
  Vec grads_shard(ParameterStore<T, MemorySpace> const& store) const {
    return Vec(store.grads().data() + (shared() ? lo_ : 0), chunk_);
  }

  // Sums the data-parallel gradients of this rank's shard into grads_shard().
  template <class Exec>
  void reduce(Exec const& exec, ParameterStore<T, MemorySpace> const& store) {
    exec.fence();
    if (!shared()) {
      // In place: the summed shard lands at the start of the gradient buffer
      // (no second, shard-sized gradient buffer; the next step zeroes it).
      HostBuffer<Vec> grads(store.grads(), true);
      scatter_sums(*dp_, grads.data(), grads.data());
      grads.copy_back();
      return;
    }
    if constexpr (host_memory) {
      grads_window_.fence(); // every node peer's backward is complete
      T* const out = store.grads().data() + lo_;
      if (mode_ == ZeroOneMode::shared) {
        sum_node_chunks(std::vector<int>{rank()}, out);
      } else {
        // The node's sums of the cross group's chunks, then across the nodes:
        // chunk r lands on rank r (only it reads or writes that chunk here).
        sum_node_chunks(owners_, across_.data());
        scatter_sums(*cross_, across_.data(), out);
      }
    }
  }

  // Makes every rank's updated shard visible to all.
  template <class Exec>
  void publish(Exec const& exec, ParameterStore<T, MemorySpace> const& store) {
    if (!shared()) {
      allgather_shards(exec, *dp_, store.values(), chunk_);
      return;
    }
    exec.fence();
    if constexpr (host_memory) {
      if (mode_ == ZeroOneMode::per_node) {
        // The cross group's updated chunks into this node's copy (each rank
        // of the node writes the chunks of its own group: disjoint).
        T* const values = store.values().data();
        cross_->allgather(values + lo_, chunk_, across_.data());
        for (std::size_t k = 0; k < owners_.size(); ++k)
          if (owners_[k] != rank())
            std::copy_n(across_.data() + k * chunk_, chunk_,
                        values + std::size_t(owners_[k]) * chunk_);
      }
      values_window_.fence();
    }
  }

private:
  // comm's reduce-scatter of `send` (a chunk per rank) into `recv` (this
  // rank's chunk; `send` == `recv`: in place, the chunk at the start). In
  // bf16: rounded in place in `send`, received into `recv`'s first half and
  // widened there.
  void scatter_sums(Communicator const& comm, T* send, T* recv) const {
    if constexpr (std::is_same_v<T, float>) {
      if (bf16_) {
        Bf16Word* const words = narrow_in_place(send, chunk_ * std::size_t(comm.size()));
        comm.reduce_scatter(words, send == recv ? words : reinterpret_cast<Bf16Word*>(recv),
                            chunk_);
        widen_in_place(recv, chunk_);
        return;
      }
    }
    comm.reduce_scatter(send, recv, chunk_);
  }

  // out[k chunk + i] = the node's sum of element i of chunk owners[k], the
  // node's ranks added in their order (the same sum wherever it is done).
  void sum_node_chunks(std::vector<int> const& owners, T* out) const {
    std::size_t const c = chunk_;
    for (std::size_t k = 0; k < owners.size(); ++k) {
      std::vector<T const*> from; // chunk owners[k] of each node rank's gradients
      for (T* p : peers_)
        from.push_back(p + std::size_t(owners[k]) * c);
      T* const to = out + k * c;
      std::size_t const p = from.size();
      // Host-only (shared windows require host memory): a plain lambda.
      Kokkos::parallel_for("telar::ZeRO::reduce_shard",
                           Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(0, c),
                           [=](std::size_t i) {
                             T s = from[0][i];
                             for (std::size_t r = 1; r < p; ++r)
                               s += from[r][i];
                             to[i] = s;
                           });
    }
    Kokkos::DefaultHostExecutionSpace().fence();
  }

  Communicator const* dp_ = nullptr;
  bool bf16_ = false;
  std::optional<Communicator> node_;  // this rank's node (shared windows)
  std::optional<Communicator> cross_; // per node: one rank of each node
  ZeroOneMode mode_ = ZeroOneMode::distributed;
  SharedWindow values_window_;
  SharedWindow grads_window_;
  MemoryRecord values_record_, grads_record_;
  std::vector<T*> peers_;
  std::vector<int> owners_; // per node: the dp ranks of the cross group, in its order
  Kokkos::View<T*, Kokkos::HostSpace> across_; // per node: the cross group's chunks
  std::size_t chunk_ = 0, lo_ = 0, hi_ = 0;
};

} // namespace telar::detail
