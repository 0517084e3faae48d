#pragma once
// Internals of spatial parallelism shared by the layer wrappers.
#include <telar/comm/communicator.hpp>
#include <telar/core/error.hpp>
#include <telar/core/shape.hpp>
#include <telar/parallel/spatial_decomposition.hpp>
#include <telar/parallel/spatial_tally.hpp>
#include <telar/profile/trace.hpp>

#include <chrono>
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace telar::detail {

// The group size and rank the spatial wrappers build for: their
// communicator's, or those a telar::SpatialPlanAs on this thread set (a
// plan for another sp, built without its ranks).
struct GroupPosition {
  int size = 0, rank = 0; // size 0: none set
};
inline GroupPosition& planned_position() {
  thread_local GroupPosition p;
  return p;
}
inline int group_size(Communicator const& c) {
  return planned_position().size > 0 ? planned_position().size : c.size();
}
inline int group_rank(Communicator const& c) {
  return planned_position().size > 0 ? planned_position().rank : c.rank();
}

// Refuses a call whose [xn, xf] -> [yn, yf] are not a slab layer's batch
// [n, slab features] -> [n, out] (the slab's shape named in the message).
inline void check_slab_call(char const* layer, char const* what, Shape const& slab, std::size_t out,
                            std::size_t xn, std::size_t xf, std::size_t yn, std::size_t yf) {
  if (xn != yn || xf != slab.size() || yf != out)
    throw ShapeError(std::string("telar::") + layer + "::" + what + ": expected [n, " +
                     std::to_string(slab.size()) + "] (the slab " + slab.str() + ") -> [n, " +
                     std::to_string(out) + "], got [" + std::to_string(xn) + ", " +
                     std::to_string(xf) + "] -> [" + std::to_string(yn) + ", " +
                     std::to_string(yf) + "]");
}

// Runs a layer's backward_weight so that its gradients grow by the sum over
// the spatial group of every rank's part (each rank saw only its slab), and
// not by this rank's part alone. The layer accumulates (+=) into gradients
// that may already hold earlier micro-batches, so the part is what the call
// added: after - before, summed over the group, added to before. Host
// memory (the wrappers assert it); one allreduce per layer, tallied in
// telar::group_sum_tally(); none (and no copies) in a group of one rank, or
// when partial: the caller sums every layer's part at once
// (telar::SlabDataParallel, over dp x sp, with the data-parallel average).
template <class T>
class GroupGradientSum {
public:
  template <class Layer, class F>
  void operator()(Layer& layer, Communicator const& group, F&& accumulate) {
    if (group.size() == 1 || partial_) { // nothing to add here
      accumulate();
      return;
    }
    before_.clear();
    layer.parameters([&](char const*, auto&, auto& g) {
      before_.insert(before_.end(), g.data(), g.data() + g.span());
    });
    accumulate();
    part_.resize(before_.size());
    std::size_t i = 0;
    layer.parameters([&](char const*, auto&, auto& g) {
      for (std::size_t k = 0; k < g.span(); ++k, ++i)
        part_[i] = g.data()[k] - before_[i];
    });
    auto const t0 = std::chrono::steady_clock::now();
    double const began = trace_ ? trace_->now() : 0;
    group.allreduce(part_.data(), part_.size());
    GroupSumTally& tally = group_sum_tally();
    ++tally.sums;
    tally.values += part_.size();
    tally.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (trace_)
      trace_->add("gradient sum", "comm", began, trace_->now(), 0);
    i = 0;
    layer.parameters([&](char const*, auto&, auto& g) {
      for (std::size_t k = 0; k < g.span(); ++k, ++i)
        g.data()[k] = before_[i] + part_[i];
    });
  }

  // Records each allreduce as "gradient sum" (null: none).
  void set_trace(TraceRecorder* trace) { trace_ = trace; }
  // Leaves this rank's part unsummed (true) or sums it over the group.
  void set_partial(bool on) { partial_ = on; }

private:
  std::vector<T> before_, part_;
  TraceRecorder* trace_ = nullptr;
  bool partial_ = false;
};

// The window of a layer along its first spatial axis: a convolution's
// settings are per dimension, a pooling's the same in every one (and it has
// no dilation).
template <class V>
std::size_t first_axis(V const& v) {
  if constexpr (std::is_arithmetic_v<V>)
    return std::size_t(v);
  else
    return std::size_t(v[0]);
}
template <class L, class = void>
struct has_dilation : std::false_type {};
template <class L>
struct has_dilation<L, std::void_t<decltype(std::declval<L const&>().dilation())>>
    : std::true_type {};

// Layers that say which input rows an output row range reads (Upsample).
template <class L, class = void>
struct has_input_rows : std::false_type {};
template <class L>
struct has_input_rows<L, std::void_t<decltype(std::declval<L const&>().input_rows(
                             std::declval<Shape const&>(), std::size_t(), std::size_t()))>>
    : std::true_type {};

template <class L>
ConvAxis split_axis(L const& l) {
  std::size_t dilation = 1;
  if constexpr (has_dilation<L>::value)
    dilation = first_axis(l.dilation());
  return {first_axis(l.kernel()), first_axis(l.stride()), first_axis(l.padding()), dilation};
}

} // namespace telar::detail
