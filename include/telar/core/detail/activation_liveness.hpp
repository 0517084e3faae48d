#pragma once
// Which of a stage's activations its backward reads: the stage runner keeps
// those per micro-batch in flight and gives the others buffers shared by the
// micro-batches; the memory plan counts the same. A nested chain asks the
// same of its own layers (telar::Sequential with a shared pool).
#include <telar/core/detail/type_traits.hpp>
#include <telar/core/layer.hpp>

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

namespace telar::detail {

// Models whose units pass tensors along (telar::GraphChain) are told the
// stage cuts, where alone they copy them.
template <class M>
using stage_boundaries_t = decltype(std::declval<M&>().set_stage_boundaries(
    std::declval<std::vector<std::size_t> const&>()));

// Which tensors of layers [first, last) a stage keeps per micro-batch, and
// which layers keep a compact copy instead (layer_traits::has_compact_copy).
struct Liveness {
  std::vector<bool> kept; // kept[k], k in [first, last]: layer k's input (the stage output at last)
  std::vector<bool> compact; // compact[k], k in [first, last): layer k keeps its own copy
};

// The stage's ends are always kept (received, sent, read by the loss); in
// between, a tensor is kept when layer k - 1 reads its output or layer k its
// input in backward (layer_traits::backward_reads) through a view. A layer
// that can keep a compact copy of what it reads does so where no view-reading
// neighbour keeps that tensor anyway; then the tensor is not kept for it. A
// model whose units pass tensors along keeps every one: a skip reads an
// earlier unit's output in a later forward.
template <class Model>
Liveness activation_liveness(Model const& model, std::size_t first, std::size_t last) {
  Liveness l{std::vector<bool>(last + 1, true), std::vector<bool>(last + 1, false)};
  if constexpr (!is_detected_v<stage_boundaries_t, Model>) {
    for (std::size_t k = first + 1; k < last; ++k)
      l.kept[k] = false;
    auto reads = [&](auto const& layer, bool compacting) {
      using L = std::decay_t<decltype(layer)>;
      return layer_traits<L>::has_compact_copy == compacting ? layer_traits<L>::backward_reads
                                                             : BackwardReads::nothing;
    };
    model.for_each_layer([&](auto index, auto const& layer) { // views first
      std::size_t const k = index;
      if (k >= first && k < last) {
        BackwardReads const r = reads(layer, false);
        l.kept[k] = l.kept[k] || reads_input(r);
        l.kept[k + 1] = l.kept[k + 1] || reads_output(r);
      }
    });
    model.for_each_layer([&](auto index, auto const& layer) { // then copies where needed
      std::size_t const k = index;
      if (k >= first && k < last) {
        BackwardReads const r = reads(layer, true);
        l.compact[k] = (reads_input(r) && !l.kept[k]) || (reads_output(r) && !l.kept[k + 1]);
      }
    });
  }
  return l;
}

// The largest of `sizes[k]` over the k in (first, last) of each parity where
// `shared(k)`: what the two alternating shared buffers must hold (a layer's
// input and output never share one).
template <class Shared>
std::pair<std::size_t, std::size_t> shared_extents(std::vector<std::size_t> const& sizes,
                                                   std::size_t first, std::size_t last,
                                                   Shared shared) {
  std::size_t most[2] = {0, 0};
  for (std::size_t k = first + 1; k < last; ++k)
    if (shared(k))
      most[k % 2] = std::max(most[k % 2], sizes[k]);
  return {most[0], most[1]};
}

} // namespace telar::detail
