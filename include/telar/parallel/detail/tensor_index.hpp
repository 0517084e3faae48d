#pragma once
// Names every parameter tensor of the model ("layer3.1.weight") and says
// where this rank's pieces of them lie: every local tensor in the flat store
// (norms of resident parameters), and the pieces inside this rank's shard
// (what the optimizer updates; norms of ZeRO-3 shards). Per-tensor norms are
// summed from these pieces over the ranks that hold them, so they are the
// same under every strategy.
#include <telar/core/layer.hpp>
#include <telar/optim/detail/engine.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace telar::detail {

class TensorIndex {
public:
  // The pieces of one view of the flat values: where, and which tensor.
  struct Pieces {
    std::vector<TensorSegment> segments;
    std::vector<std::size_t> tensor_ids;
  };

  // Every tensor of `model` by name; this rank's pieces from `store` (a bound
  // ParameterStore) and its shard [lo, hi) of the flat range.
  template <class Model, class Store>
  void build(Model& model, Store const& store, std::pair<std::size_t, std::size_t> shard) {
    names_.clear();
    model.for_each_layer([&](auto index, auto& layer) {
      using L = std::decay_t<decltype(layer)>;
      if constexpr (layer_traits<L>::has_parameters)
        layer.parameters([&](char const* name, auto&, auto&) {
          names_.push_back(layer_prefix(model, index) + name);
        });
    });
    local_ = Pieces{};
    shard_ = Pieces{};
    auto const& entries = store.entries();
    for (auto const& p : entries) {
      local_.segments.push_back({p.offset, p.size, p.replicas});
      local_.tensor_ids.push_back(id_of(p.name));
    }
    for (auto const& [t, off, len] : store.pieces(shard.first, shard.second)) {
      shard_.segments.push_back({off, len, entries[t].replicas});
      shard_.tensor_ids.push_back(id_of(entries[t].name));
    }
    shard_size_ = shard.second - shard.first;
  }

  std::vector<std::string> const& names() const { return names_; }
  Pieces const& local() const { return local_; }
  Pieces const& shard() const { return shard_; }
  std::size_t shard_size() const { return shard_size_; }

  // Squared norm of every tensor by id: this rank's `pieces` of `values`
  // (replicated pieces count once), summed over ranks by `sum(v, n)`.
  template <class Engine, class Exec, class Values, class Sum>
  std::vector<double> sq_norms(Engine const& engine, Exec const& exec, Values const& values,
                               Pieces const& pieces, Sum&& sum) const {
    auto const sq = engine.segment_sq_norms(exec, values, pieces.segments);
    std::vector<double> all(names_.size(), 0.0);
    for (std::size_t s = 0; s < pieces.segments.size(); ++s)
      all[pieces.tensor_ids[s]] += sq[s] / pieces.segments[s].replicas;
    if (!all.empty())
      sum(all.data(), all.size());
    return all;
  }

private:
  std::size_t id_of(std::string const& name) const {
    return std::size_t(std::find(names_.begin(), names_.end(), name) - names_.begin());
  }

  std::vector<std::string> names_;
  Pieces local_, shard_;
  std::size_t shard_size_ = 0;
};

} // namespace telar::detail
