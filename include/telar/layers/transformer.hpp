#pragma once
/*! \file
 *  \brief telar::TransformerBlock: a pre-norm transformer block (GPT-2's)
 *  built from Telar's blocks, so it is one unit for pipeline partitioning
 *  (a stage boundary falls between blocks), recomputation and naming.
 *
 *  x = x + attention(norm1(x)); x = x + fc2(act(fc1(norm2(x)))), with
 *  fc1: hidden -> 4 hidden and fc2: 4 hidden -> hidden, over [seq, hidden]
 *  samples. Parameters are named by position, as PyTorch's nn.Sequential:
 *  "0.0.weight" (norm1), "0.1.query.weight" (attention), "1.0.weight"
 *  (norm2), "1.1.weight" (fc1), "1.3.weight" (fc2).
 *  \code
 *  using Block = telar::TransformerBlock<float>;
 *  using Gpt = telar::Sequential<telar::Embedding<float>, telar::PositionalEmbedding<float>,
 *                                Block, Block, telar::LayerNorm<float>, telar::Dense<float>>;
 *  Gpt gpt(telar::Embedding<float>(vocab, 64), telar::PositionalEmbedding<float>(128, 64),
 *          telar::make_transformer_block<float>(64, 4), telar::make_transformer_block<float>(64,
 * 4), telar::LayerNorm<float>(64), telar::Dense<float>(64, vocab)); \endcode
 */
#include <telar/core/residual.hpp>
#include <telar/core/sequential.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/attention.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/normalization.hpp>

#include <cstddef>

namespace telar {

/*! \brief norm -> attention -> + x. \tparam T value type \tparam MemorySpace memory space
 *  \tparam Norm telar::LayerNorm or telar::RMSNorm */
template <class T = float, class MemorySpace = DefaultMemorySpace,
          class Norm = LayerNorm<T, MemorySpace>>
using AttentionSublayer = Residual<Norm, CausalSelfAttention<T, MemorySpace>>;

/*! \brief norm -> Dense(h, 4h) -> activation -> Dense(4h, h) -> + x.
 *  \tparam T value type \tparam MemorySpace memory space
 *  \tparam Norm telar::LayerNorm or telar::RMSNorm \tparam Act telar::GELU or telar::GELUTanh */
template <class T = float, class MemorySpace = DefaultMemorySpace,
          class Norm = LayerNorm<T, MemorySpace>, class Act = GELU<T, MemorySpace>>
using MlpSublayer = Residual<Norm, Dense<T, MemorySpace>, Act, Dense<T, MemorySpace>>;

/*! \brief Pre-norm transformer block: the attention sublayer, then the MLP
 *  sublayer (see the file's notes); build one with make_transformer_block.
 *  \tparam T value type \tparam MemorySpace memory space
 *  \tparam Norm telar::LayerNorm (GPT-2) or telar::RMSNorm
 *  \tparam Act telar::GELU (exact) or telar::GELUTanh (GPT-2's approximation) */
template <class T = float, class MemorySpace = DefaultMemorySpace,
          class Norm = LayerNorm<T, MemorySpace>, class Act = GELU<T, MemorySpace>>
using TransformerBlock =
    Sequential<AttentionSublayer<T, MemorySpace, Norm>, MlpSublayer<T, MemorySpace, Norm, Act>>;

/*! \brief A configured TransformerBlock.
 *  \tparam T value type \tparam MemorySpace memory space \tparam Norm norm layer
 *  \tparam Act activation \param hidden model width \param heads attention heads
 *  \param eps the norms' epsilon \param mlp_ratio MLP width / hidden (4 in GPT-2)
 *  \throws Error when heads does not divide hidden */
template <class T = float, class MemorySpace = DefaultMemorySpace,
          class Norm = LayerNorm<T, MemorySpace>, class Act = GELU<T, MemorySpace>>
TransformerBlock<T, MemorySpace, Norm, Act>
make_transformer_block(std::size_t hidden, std::size_t heads, double eps = 1e-5,
                       std::size_t mlp_ratio = 4) {
  using Attn = AttentionSublayer<T, MemorySpace, Norm>;
  using Mlp = MlpSublayer<T, MemorySpace, Norm, Act>;
  return TransformerBlock<T, MemorySpace, Norm, Act>(
      Attn(Norm(hidden, eps), CausalSelfAttention<T, MemorySpace>(hidden, heads)),
      Mlp(Norm(hidden, eps), Dense<T, MemorySpace>(hidden, mlp_ratio * hidden), Act{},
          Dense<T, MemorySpace>(mlp_ratio * hidden, hidden)));
}

} // namespace telar
