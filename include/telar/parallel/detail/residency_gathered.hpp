#pragma once
// Parameter residency, gathered on demand (ZeRO-3): a rank keeps only its
// shard [r N/dp, (r+1) N/dp) of the flat values ("telar::ZeRO::param_shard",
// the store padded to a multiple of dp * alignment). Layers are grouped as
// the gradients are (BucketPlan buckets). Before a layer of a group runs
// forward or backward, the group's full values are all-gathered
// (MPI_Iallgatherv: each rank contributes the part of the group's flat range
// inside its shard) into a buffer ("telar::ZeRO::gathered") and the layers'
// value views are rebound into it; the next group in the direction of travel
// (forward order in forward, backward order in backward) is prefetched so its
// gather overlaps the compute. Backward gathers again; the weight-gradient
// half of a split backward (W) needs no values, only the gradient buffers.
//
// ZeRO3Gather::PerStep keeps a gathered group until the step ends (one
// gather per group per step); PerMicrobatch frees a group as soon as the
// layers move on to another group (its layers are done for this pass), and
// whatever an instruction used after it (the executor's progress() call),
// and gathers again at the next use: at most the group in use and the one
// prefetched are gathered. Every dp rank starts the same gathers in the same order: the
// decisions depend only on the sequence of hooks, never on whether a
// request happened to complete.
//
// Under Precision<bf16, ...> (SyncContext::bf16_gathers) the values travel
// as bf16, rounded to nearest even from the fp32 master shards: half the
// gather bytes. PerMicrobatch: they travel inside the group's fp32 buffer
// (received into its first half, this rank's part sent from its second
// half, so no other allocation) and are widened in place on arrival.
// PerStep: a gathered group stays bf16 words (gathered in place, 2 bytes a
// value) for the step, and only the group whose layers run is widened into
// an fp32 buffer, dropped when the layers move to another group: every
// group at 2 bytes plus one at 4, where fp32 values would hold all at 4;
// done where that is less (no group half the model or more:
// gather_words_save). PerMicrobatch holds two groups at most, so the words
// would save nothing there beside the fp32 copy of the one in use. The
// words of the group in use are its values' bf16 copy for the matmuls
// (core/detail/bf16_copy.hpp: exactly their rounding, as they were widened
// from them), so no bf16 matmul converts a weight of the group again.
// Either way the layers read the rounded values in fp32. The bf16 GEMMs and
// convolutions round their weights to the same values, so only the
// parameters used in fp32 (biases, norms' scales and shifts, embeddings)
// compute with bf16-rounded values (relative error at most 2^-8;
// docs/precision.md).
#include <telar/comm/communicator.hpp>
#include <telar/comm/detail/bf16_word.hpp>
#include <telar/comm/device_buffer.hpp>
#include <telar/core/detail/bf16_copy.hpp>
#include <telar/core/parameters.hpp>
#include <telar/parallel/detail/bucket_plan.hpp>
#include <telar/parallel/detail/gradient_sync_decl.hpp>
#include <telar/parallel/detail/plan_model_states.hpp>
#include <telar/parallel/strategy.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace telar::detail {

template <class T, class MemorySpace>
class GatheredParameters {
public:
  using Store = ParameterStore<T, MemorySpace>;
  using Vec = Vector<T, MemorySpace>;

  GatheredParameters() = default;
  GatheredParameters(SyncContext const& ctx, ZeRO3Gather mode) : ctx_(ctx), mode_(mode) {}

  // Without MPI there is nothing to shard: the layers are drawn and the
  // gradient sync binds them as usual.
  bool sharded() const { return ctx_.dp != nullptr; }
  Vec const& shard() const { return shard_; }

  // The optimizer updates the value shard (the sync's range without MPI).
  template <class Sync>
  Vec optimizer_values(Sync const& sync, Store const& store) const {
    return sharded() ? shard_ : sync.values(store);
  }
  // Every rank's shard all-gathered over the data-parallel group
  // (collective), or the store without MPI.
  template <class Exec>
  Vec full_values(Exec const& exec, Store const& store) const {
    if (!sharded())
      return store.values();
    exec.fence();
    Vec full("telar::Trainer::full_values", store.size());
    HostBuffer<Vec> send(shard_, true);
    HostBuffer<Vec> recv(full, false);
    ctx_.dp->allgather(send.data(), shard_.size(), recv.data());
    recv.copy_back();
    return full;
  }
  // From the value shards summed over the world (the sync's sum), or as
  // resident without MPI.
  template <class Tensors, class Engine, class Exec, class Sync, class Sum>
  std::vector<double> sq_norms(Tensors const& tensors, Engine const& engine, Exec const& exec,
                               Store const& store, Sync const& sync, Sum&& model_sum) const {
    if (!sharded())
      return tensors.sq_norms(engine, exec, store.values(), tensors.local(), model_sum);
    return tensors.sq_norms(engine, exec, shard_, tensors.shard(),
                            [&sync](double* v, std::size_t n) { sync.sum_norms(v, n); });
  }
  std::size_t group_count() const { return groups_.size(); }

  // Draws the layers one at a time, never the whole model: a first pass
  // learns the shapes (dropping each layer's values), the store is laid out,
  // a second pass draws each layer again (the same values: one stream per
  // layer) and keeps the part inside this rank's shard. Layers with
  // parameters are assumed to allocate them in initialize().
  template <class Model, class Init>
  void bind(Model& model, std::vector<bool> const& owned, Store& store, Init&& init) {
    if (!sharded()) {
      for (std::size_t k = 0; k < owned.size(); ++k)
        if (owned[k])
          init(k);
      return;
    }
    for (std::size_t k = 0; k < owned.size(); ++k)
      if (owned[k]) {
        init(k);
        Store::drop(model, k);
      }
    std::size_t const p = std::size_t(ctx_.dp->size());
    store.layout(model, owned, p * Store::alignment);
    chunk_ = store.size() / p;
    lo_ = std::size_t(ctx_.dp->rank()) * chunk_;
    shard_ = Vec("telar::ZeRO::param_shard", chunk_); // zero padding
    for (std::size_t k = 0; k < owned.size(); ++k)
      if (owned[k]) {
        init(k);
        auto const [b, e] = store.layer_range(k);
        std::size_t const lo = std::max(b, lo_), hi = std::min(e, lo_ + chunk_);
        if (lo < hi)
          store.copy_values(model, lo, hi, Vec(shard_.data() + (lo - lo_), hi - lo));
        Store::drop(model, k);
      }
    plan_ = BucketPlan(store, ctx_.bucket_bytes, sizeof(T));
    groups_ = std::vector<Group>(plan_.size());
    std::vector<std::size_t> sizes;
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      split(groups_[i], plan_.range(i), p);
      sizes.push_back(groups_[i].end - groups_[i].begin);
    }
    words_ = bf16_capable && ctx_.bf16_gathers && mode_ == ZeRO3Gather::PerStep &&
             gather_words_save(sizes);
    rebind_ = [&model, &store](std::size_t b, std::size_t e, Vec const& buf) {
      store.rebind(model, b, e, buf, Store::Part::values);
    };
  }

  void begin_step(int) {}
  void before_forward(std::size_t layer) { use(layer, true); }
  void before_backward(std::size_t layer) { use(layer, false); }

  // Between instructions: advance the gathers in flight; PerMicrobatch frees
  // what the instruction used.
  void progress() {
    for (std::size_t i = 0; i < groups_.size(); ++i)
      if (groups_[i].state == State::in_flight && groups_[i].request.test())
        arrived(i);
    if (mode_ == ZeRO3Gather::PerMicrobatch)
      for (auto& g : groups_)
        if (g.used)
          release(g);
    current_ = -1;
  }

  void end_step() {
    for (std::size_t i = 0; i < groups_.size(); ++i)
      if (groups_[i].state == State::in_flight) {
        groups_[i].request.wait();
        arrived(i);
      }
    for (auto& g : groups_)
      release(g);
    current_ = -1;
  }

private:
  static constexpr bool bf16_capable = bf16_gathers_v<T, MemorySpace>;

  enum class State { idle, in_flight, ready };
  using Words = Kokkos::View<Bf16Word*, MemorySpace>;
  struct Group {
    std::size_t begin = 0, end = 0;  // in the flat store
    std::size_t send_offset = 0;     // this rank's part, in the shard
    std::vector<int> counts, displs; // MPI reads them until completion
    State state = State::idle;
    bool used = false; // rebound for a layer since the last progress()
    Vec values;        // fp32 (words_: only while the group's layers run)
    Words words;       // words_: the gathered bf16 words
    Request request;
    std::unique_ptr<HostBuffer<Vec>> send, recv;
    double t_start = 0;
  };

  // Rank q's part of a group: the part of [b, e) inside q's shard, landing
  // at its offset from b (shards are in rank order, so parts are too).
  void split(Group& g, std::pair<std::size_t, std::size_t> range, std::size_t p) const {
    auto const [b, e] = range;
    g.begin = b;
    g.end = e;
    g.counts.assign(p, 0);
    g.displs.assign(p, 0);
    for (std::size_t q = 0; q < p; ++q) {
      std::size_t const lo = std::max(b, q * chunk_), hi = std::min(e, (q + 1) * chunk_);
      g.counts[q] = hi > lo ? int(hi - lo) : 0;
      g.displs[q] = hi > lo ? int(lo - b) : 0;
    }
    g.send_offset = std::clamp(b, lo_, lo_ + chunk_) - lo_;
  }

  void use(std::size_t layer, bool forward) {
    long const i = plan_.bucket_of(layer);
    if (i < 0)
      return;
    if (mode_ == ZeRO3Gather::PerMicrobatch && current_ >= 0 && current_ != i)
      release(groups_[std::size_t(current_)]);
    current_ = i;
    Group& g = groups_[std::size_t(i)];
    if (g.state == State::idle)
      start(std::size_t(i));
    if (g.state == State::in_flight) {
      g.request.wait();
      arrived(std::size_t(i));
    }
    if (words_)
      widen(std::size_t(i));
    g.used = true;
    // Buckets are numbered in backward order: forward travels to i - 1.
    long const next = forward ? i - 1 : i + 1;
    if (next >= 0 && next < long(groups_.size()) && groups_[std::size_t(next)].state == State::idle)
      start(std::size_t(next));
  }

  void start(std::size_t i) {
    Group& g = groups_[i];
    g.state = State::in_flight;
    std::size_t const mine = std::size_t(g.counts[std::size_t(ctx_.dp->rank())]);
    g.t_start = ctx_.trace ? ctx_.trace->now() : 0;
    if (words_)
      return start_words(g, mine);
    g.values = Vec(Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::ZeRO::gathered"),
                   g.end - g.begin);
    if constexpr (bf16_capable) {
      if (ctx_.bf16_gathers) {
        // bf16 words: received into the first half of the fp32 buffer, this
        // rank's part sent from the second (MPI's buffers must not overlap).
        auto* words = reinterpret_cast<Bf16Word*>(g.values.data());
        Bf16Word* const send = words + (g.end - g.begin);
        T const* part = shard_.data() + g.send_offset;
        for (std::size_t k = 0; k < mine; ++k) { // bytes: the buffer's values are floats
          Bf16Word const w = Bf16Word::from_float(part[k]);
          std::memcpy(send + k, &w, sizeof w);
        }
        g.request = ctx_.dp->iallgatherv(send, g.counts, g.displs, words);
        return;
      }
    }
    g.send = std::make_unique<HostBuffer<Vec>>(Vec(shard_.data() + g.send_offset, mine), true);
    g.recv = std::make_unique<HostBuffer<Vec>>(g.values, false);
    g.request = ctx_.dp->iallgatherv(g.send->data(), g.counts, g.displs, g.recv->data());
  }

  // words_: the group gathered as words only (no fp32 buffer until
  // widen()), this rank's part rounded where it lands: in place.
  void start_words(Group& g, std::size_t mine) {
    g.words = Words(Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::ZeRO::gathered"),
                    g.end - g.begin);
    Bf16Word* const part = g.words.data() + g.displs[std::size_t(ctx_.dp->rank())];
    T const* from = shard_.data() + g.send_offset;
    for (std::size_t k = 0; k < mine; ++k)
      part[k] = Bf16Word::from_float(from[k]);
    g.request = ctx_.dp->iallgatherv(part, g.counts, g.displs, g.words.data());
  }

  // The gather completed: the layers' values point into it (words_:
  // once widened, in use()).
  void arrived(std::size_t i) {
    Group& g = groups_[i];
    g.state = State::ready;
    bool const bf16 = !g.recv; // the fp32 path's buffers, else bf16 words
    if (g.recv) {
      g.recv->copy_back();
      g.send.reset();
      g.recv.reset();
    } else if (!words_) {
      if constexpr (bf16_capable) // the bf16 words in the first half
        widen_in_place(g.values.data(), g.values.size());
    }
    if (!words_)
      rebind_(g.begin, g.end, g.values);
    if (ctx_.trace) // the bytes that travelled: bf16 words are half the values'
      ctx_.trace->add(
          "all-gather group " + std::to_string(i) + " (" +
              std::to_string((g.end - g.begin) * (bf16 ? sizeof(std::uint16_t) : sizeof(T)) >> 10) +
              (bf16 ? " KiB bf16)" : " KiB)"),
          "comm", g.t_start, ctx_.trace->now(), 1);
  }

  void release(Group& g) {
    g.used = false;
    if (g.state != State::ready)
      return; // a prefetch in flight stays until it is used or the step ends
    g.state = State::idle;
    drop_values(g);
    g.words = Words();
  }

  // words_: group i's words widened into fp32 values for its layers,
  // the group widened before dropped first (one fp32 group at a time).
  void widen(std::size_t i) {
    if (widened_ == long(i))
      return;
    if (widened_ >= 0)
      drop_values(groups_[std::size_t(widened_)]);
    Group& g = groups_[i];
    g.values = Vec(Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::ZeRO::gathered"),
                   g.end - g.begin);
    Bf16Word const* w = g.words.data();
    T* v = g.values.data();
    std::size_t const n = g.end - g.begin;
    for (std::size_t k = 0; k < n; ++k)
      v[k] = w[k].to_float();
    rebind_(g.begin, g.end, g.values);
    widened_ = long(i);
    if constexpr (bf16_capable) { // every word made: the matmuls read them
      static_assert(sizeof(Bf16Word) == sizeof(std::uint16_t), "a word is its bits");
      bf16_copy().share(v, n, reinterpret_cast<std::uint16_t*>(g.words.data()));
    }
  }
  void drop_values(Group& g) {
    if (widened_ >= 0 && &groups_[std::size_t(widened_)] == &g)
      widened_ = -1;
    if constexpr (bf16_capable)
      bf16_copy().forget(g.values.data());
    Kokkos::fence(); // kernels still reading the values may be in flight (devices)
    g.values = Vec();
    rebind_(g.begin, g.end, Vec());
  }

  SyncContext ctx_;
  ZeRO3Gather mode_ = ZeRO3Gather::PerMicrobatch;
  std::function<void(std::size_t, std::size_t, Vec const&)> rebind_;
  BucketPlan plan_;
  std::size_t chunk_ = 0, lo_ = 0;
  Vec shard_;
  std::vector<Group> groups_;
  long current_ = -1;  // the group the last layer used
  long widened_ = -1;  // words_: the group whose fp32 values exist
  bool words_ = false; // PerStep bf16: groups kept as words, widened while in use (bind())
};

} // namespace telar::detail
