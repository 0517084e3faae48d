#pragma once
// A step whose loss or gradient is not finite (TrainerOptions::nonfinite,
// SlabDataParallelOptions::nonfinite).
//
// One pass over this rank's gradient shard counts NaN and infinities; the
// count rides on the allreduce the loss needs anyway, so every rank reaches
// the same verdict without an extra message. Only when something is not
// finite are the counts split by tensor (one more small reduction, over the
// ranks that hold the pieces) to name the first tensor in model order; the
// message is built from reduced values only, so it is the same on every rank.
#include <telar/core/detail/decl.hpp>
#include <telar/core/detail/host_simd.hpp>
#include <telar/core/error.hpp>
#include <telar/core/tensor.hpp>
#include <telar/optim/nonfinite.hpp>
#include <telar/parallel/detail/tensor_index.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <sstream>
#include <string>
#include <vector>

namespace telar::detail {

// Values of v in [lo, hi) that are NaN or infinite: x - x is 0 exactly for
// finite x (portable to every Kokkos version; no math function needed). An
// integer count, because an integer sum vectorises (4x faster than a double
// one on the fashion_mnist MLP's 269k gradients: 50 us); an int one, in
// blocks of 2^30 values so that it cannot overflow, because a vector
// register holds twice as many int lanes as long long ones: in a build for
// generic x86-64 (SSE2) the pass is bound by its instructions, not by
// memory (MLP 784-2048-2048-10, 5.8 M gradients: 7.6% of a bf16 step).
// simd_count runs it 16 int lanes wide where the CPU has AVX-512.
template <class Exec, class V>
double count_nonfinite(Exec const& exec, V const& v, std::size_t lo, std::size_t hi) {
  constexpr std::size_t block = std::size_t(1) << 30;
  double bad = 0;
  for (std::size_t b = lo, e = 0; b < hi; b = e) {
    e = b + std::min(block, hi - b);
    bad += double(simd_count<int>(
        "telar::count_nonfinite", exec, b, e, KOKKOS_LAMBDA(std::size_t i, int& a) {
          auto const x = v(i);
          a += (x - x == decltype(x)(0)) ? 0 : 1;
        }));
  }
  return bad;
}

// Non-finite values of every tensor (by TensorIndex id): this rank's pieces
// of `grads`, summed over the ranks that hold pieces by `sum(v, n)`.
template <class Exec, class V, class Sum>
std::vector<double> tensor_nonfinite(Exec const& exec, V const& grads, TensorIndex const& index,
                                     TensorIndex::Pieces const& pieces, Sum&& sum) {
  std::vector<double> all(index.names().size(), 0.0);
  for (std::size_t s = 0; s < pieces.segments.size(); ++s) {
    auto const& seg = pieces.segments[s];
    all[pieces.tensor_ids[s]] +=
        count_nonfinite(exec, grads, seg.offset, seg.offset + seg.size) / double(seg.replicas);
  }
  if (!all.empty())
    sum(all.data(), all.size());
  return all;
}

// A loss for messages: "nan" (never "-nan", whatever the sign bit), "inf".
TELAR_DECL std::string loss_text(double loss);

// Who reports a non-finite step, and the setting that skips such steps.
struct NonFiniteSource {
  char const* who = "telar::Trainer::step";
  char const* setting = "TrainerOptions::nonfinite";
  bool has_loss = true; // false: the verdict saw the gradients only (no loss named)
};

// "<who>: step 7: the gradient of layer2.weight has 12 values that are NaN
// or infinite (the first such tensor in model order; the loss is nan)".
TELAR_DECL std::string nonfinite_message(long long step, double loss,
                                         std::vector<std::string> const& names,
                                         std::vector<double> const& counts,
                                         NonFiniteSource const& source = {});

// The verdict of one step. `bad` is the non-finite count of every rank's
// gradient shard, summed, and `loss` the reduced loss: the same on every
// rank, so every rank decides alike. Returns true when the step must skip its
// update; throws NonFiniteError under NonFinite::stop.
template <class Exec, class V, class Sum>
bool skip_nonfinite(NonFinite mode, long long step, double loss, double bad, Exec const& exec,
                    V const& grads, TensorIndex const& index, Sum&& sum,
                    NonFiniteSource const& source = {}) {
  if (std::isfinite(loss) && !(bad > 0))
    return false;
  if (mode == NonFinite::skip)
    return true;
  auto const counts = tensor_nonfinite(exec, grads, index, index.shard(), sum);
  throw NonFiniteError(nonfinite_message(step, loss, index.names(), counts, source));
}

} // namespace telar::detail

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/parallel/detail/nonfinite.ipp>
#endif
