#pragma once
// Which of a stage's activations its backward reads: the stage runner keeps
// those per micro-batch in flight and gives the others buffers shared by the
// micro-batches; the memory plan counts the same.
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

// kept[k] for k in [first, last]: whether layer k's input (the stage output
// at last) is kept per micro-batch until backward. The stage's ends always
// are (received, sent, read by the loss); in between, a buffer is kept when
// layer k - 1 reads its output or layer k its input in backward
// (layer_traits::backward_reads). A model whose units pass tensors along
// keeps every one: a skip reads an earlier unit's output in a later forward.
template <class Model>
std::vector<bool> kept_activations(Model const& model, std::size_t first, std::size_t last) {
  std::vector<bool> kept(last + 1, true);
  if constexpr (!is_detected_v<stage_boundaries_t, Model>) {
    for (std::size_t k = first + 1; k < last; ++k)
      kept[k] = false;
    model.for_each_layer([&](auto index, auto const& layer) {
      constexpr BackwardReads reads = layer_traits<std::decay_t<decltype(layer)>>::backward_reads;
      std::size_t const k = index;
      if (k < first || k >= last)
        return;
      if (reads_input(reads))
        kept[k] = true;
      if (reads_output(reads))
        kept[k + 1] = true;
    });
  }
  return kept;
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
