#pragma once
// Runs an Optimizer over the flat range of parameters a rank owns. It knows
// nothing of ranks: what crosses shards (gradient norm, tensor norms) goes
// through the `reduce` callback, which sums doubles over every rank holding a
// part of the same parameters (identity when nothing is sharded).
#include <telar/core/detail/host_simd.hpp>
#include <telar/core/detail/math.hpp>
#include <telar/core/tensor.hpp>
#include <telar/optim/optimizer.hpp>

#include <cmath>
#include <functional>
#include <vector>

namespace telar::detail {

// A piece of one tensor inside the owned range.
struct TensorSegment {
  std::size_t offset = 0; // relative to the start of the owned range
  std::size_t size = 0;
  int replicas = 1; // identical copies across the reduce group
};

using ReduceSum = std::function<void(double*, std::size_t)>;

template <class Optimizer, class MemorySpace>
class OptimizerEngine {
  static_assert(check_optimizer<Optimizer>());

public:
  using T = typename Optimizer::value_type;
  using Traits = optimizer_traits<Optimizer>;

  OptimizerEngine() = default;
  OptimizerEngine(Optimizer opt, std::size_t n) : opt_(opt), n_(n) {
    if constexpr (Traits::state_size > 0)
      state_ = Vector<T, MemorySpace>("telar::Optimizer::state", n * Traits::state_size);
    if constexpr (Traits::layerwise)
      direction_ = Vector<T, MemorySpace>("telar::Optimizer::direction", n);
  }

  Optimizer const& optimizer() const { return opt_; }
  Vector<T, MemorySpace> const& state() const { return state_; }
  std::size_t size() const { return n_; }
  std::size_t direction_size() const { return direction_.size(); }

  // Sum of squares of v over each segment.
  template <class Exec, class V>
  std::vector<double> segment_sq_norms(Exec const& exec, V const& v,
                                       std::vector<TensorSegment> const& segs) const {
    std::vector<double> out(segs.size(), 0.0);
    for (std::size_t s = 0; s < segs.size(); ++s) {
      std::size_t const o = segs[s].offset;
      double acc = 0;
      Kokkos::parallel_reduce(
          "telar::Optimizer::norm", Kokkos::RangePolicy<Exec>(exec, o, o + segs[s].size),
          KOKKOS_LAMBDA(std::size_t i, double& a) { a += double(v(i)) * double(v(i)); }, acc);
      out[s] = acc;
    }
    return out;
  }

  // Global L2 norm of g over all ranks in the reduce group; replicated tensors
  // count once.
  template <class Exec>
  double grad_norm(Exec const& exec, Vector<T, MemorySpace> const& grads,
                   std::vector<TensorSegment> const& segs, ReduceSum const& reduce) const {
    auto sq = segment_sq_norms(exec, grads, segs);
    double total = 0;
    for (std::size_t s = 0; s < segs.size(); ++s)
      total += sq[s] / segs[s].replicas;
    if (reduce)
      reduce(&total, 1);
    return std::sqrt(total);
  }

  // One optimizer step over the owned range. `values` and `grads` are the
  // owned range (length n); `segments` its tensor pieces in order, covering
  // it, with `tensor_ids` mapping each segment to a tensor index shared by
  // every rank (for reducing per-tensor norms), `num_tensors` entries long.
  template <class Exec>
  void step(Exec const& exec, Vector<T, MemorySpace> const& values,
            Vector<T, MemorySpace> const& grads, std::vector<TensorSegment> const& segments,
            std::vector<std::size_t> const& tensor_ids, std::size_t num_tensors, StepInfo<T> info,
            double clip_norm, ReduceSum const& reduce) {
    if (Traits::needs_grad_norm || clip_norm > 0) {
      double const norm = grad_norm(exec, grads, segments, reduce);
      info.grad_norm = T(norm);
      if (clip_norm > 0 && norm > clip_norm)
        info.grad_scale = T(clip_norm / (norm + 1e-6));
    }
    Optimizer opt = opt_;
    if constexpr (Traits::has_begin_step)
      opt.begin_step(info);
    T* const state = state_.data();
    std::size_t const n = n_;
    if constexpr (!Traits::layerwise) {
      simd_for(
          "telar::Optimizer::update", exec, n, KOKKOS_LAMBDA(std::size_t i) {
            opt.update(values(i), grads(i) * info.grad_scale, OptimizerState<T>{state + i, n},
                       info);
          });
    } else {
      auto dir = direction_;
      Kokkos::parallel_for(
          "telar::Optimizer::direction", Kokkos::RangePolicy<Exec>(exec, 0, n),
          KOKKOS_LAMBDA(std::size_t i) {
            dir(i) = opt.direction(values(i), grads(i) * info.grad_scale,
                                   OptimizerState<T>{state + i, n}, info);
          });
      // Per-tensor ||w||^2 and ||u||^2, summed over shards: [w0..wk, u0..uk].
      std::vector<double> sums(2 * num_tensors, 0.0);
      auto wsq = segment_sq_norms(exec, values, segments);
      auto usq = segment_sq_norms(exec, dir, segments);
      for (std::size_t s = 0; s < segments.size(); ++s) {
        sums[tensor_ids[s]] += wsq[s] / segments[s].replicas;
        sums[num_tensors + tensor_ids[s]] += usq[s] / segments[s].replicas;
      }
      if (reduce && !sums.empty())
        reduce(sums.data(), sums.size());
      for (std::size_t s = 0; s < segments.size(); ++s) {
        TensorNorms<T> norms{T(std::sqrt(sums[tensor_ids[s]])),
                             T(std::sqrt(sums[num_tensors + tensor_ids[s]]))};
        std::size_t const o = segments[s].offset;
        Kokkos::parallel_for(
            "telar::Optimizer::apply", Kokkos::RangePolicy<Exec>(exec, o, o + segments[s].size),
            KOKKOS_LAMBDA(std::size_t i) { opt.apply(values(i), dir(i), norms, info); });
      }
    }
  }

private:
  Optimizer opt_{};
  std::size_t n_ = 0;
  Vector<T, MemorySpace> state_;
  Vector<T, MemorySpace> direction_;
};

} // namespace telar::detail
