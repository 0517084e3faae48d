#pragma once
/*! \file
 *  \brief Tensor parallelism for transformer blocks: telar::HeadParallel
 *  splits telar::CausalSelfAttention by heads over the tensor-parallel
 *  group, and telar::TensorParallelTransformerBlock is the pre-norm block
 *  with that attention and a ColumnParallel/RowParallel MLP (Megatron-LM's
 *  layout).
 *
 *  Per sub-block, one allreduce in forward and one in backward:
 *  attention: query, key and value projections column-parallel by heads
 *  (rank r holds heads [r H / p, (r + 1) H / p), the matching rows of Wq,
 *  Wk, Wv and bq, bk, bv), the heads computed locally, and the output
 *  projection row-parallel (the matching columns of Wo, all of bo): forward
 *  sums y over the group, backward sums dx (the three projections' partial
 *  dx added up first). MLP: ColumnParallel<Dense>(h, 4h), the activation on
 *  the shard, RowParallel<Dense>(4h, h). Norms and residuals are replicated.
 *  \code
 *  using Block = telar::TensorParallelTransformerBlock<float>;
 *  Block b = telar::make_tensor_parallel_transformer_block<float>(768, 12);
 *  telar::set_tensor_parallel(model, telar::TensorParallelContext(grid.tp()));
 *  \endcode
 */
#include <telar/core/error.hpp>
#include <telar/core/residual.hpp>
#include <telar/core/sequential.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/attention.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/normalization.hpp>
#include <telar/parallel/tensor_parallel.hpp>

#include <cstdint>
#include <string>

namespace telar {

/*! \brief Splits a layer by attention heads over the tensor-parallel group;
 *  only telar::CausalSelfAttention has this split.
 *  \tparam L the layer to split */
template <class L>
class HeadParallel {
  static_assert(detail::dependent_false<L>,
                "telar::HeadParallel: only telar::CausalSelfAttention is split by heads");
};

/*! \brief CausalSelfAttention split by heads (see the file's notes).
 *
 *  With a group of one it computes exactly what CausalSelfAttention does.
 *  Parameters keep CausalSelfAttention's names; "proj.bias" is replicated
 *  (parameter_replicas gives the group size), every other tensor is a shard.
 *  Parameters are drawn as the serial layer with the same seed draws them at
 *  the same global indices.
 *  \tparam T value type \tparam MemorySpace memory space \tparam Gemm GEMM policy */
template <class T, class MemorySpace, class Gemm>
class HeadParallel<CausalSelfAttention<T, MemorySpace, Gemm>>
    : public CausalSelfAttention<T, MemorySpace, Gemm> {
  using Base = CausalSelfAttention<T, MemorySpace, Gemm>;
  using Proj = Dense<T, MemorySpace, Gemm>;

public:
  /*! \brief The wrapped layer type. */
  using layer_type = Base;
  /*! \brief What backward needs (CausalSelfAttention's, for this rank's heads). */
  using saved_type = typename Base::saved_type;

  /*! \brief An empty layer; assign a configured one before use. */
  HeadParallel() = default;
  /*! \brief Sizes of the full (serial) layer. \param hidden model width
   *  \param heads all heads \param bias biases in the projections */
  HeadParallel(std::size_t hidden, std::size_t heads, bool bias = true)
      : Base(hidden, heads, bias), bias_(bias) {}
  /*! \brief The same layer under another GEMM policy (telar::Precision).
   *  \tparam G the other policy \param o the layer */
  template <class G, class = std::enable_if_t<!std::is_same_v<G, Gemm>>>
  explicit HeadParallel(HeadParallel<CausalSelfAttention<T, MemorySpace, G>> const& o)
      : Base(static_cast<CausalSelfAttention<T, MemorySpace, G> const&>(o)), ctx_(o.ctx_),
        bias_(o.bias_), initialized_(o.initialized_) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "HeadParallel<CausalSelfAttention>"; }
  /*! \brief One allreduce of y in forward, one of dx in backward. */
  static constexpr TensorParallelSums tensor_parallel_sums{1, 1};

  /*! \brief Joins a tensor-parallel group; call before initialize().
   *  \param ctx the group
   *  \throws telar::Error when the heads do not split evenly over the group,
   *  when \p ctx is invalid, or after initialize() with another split */
  void set_tensor_parallel(TensorParallelContext const& ctx) {
    std::string const where = std::string("telar::") + name() + "::set_tensor_parallel";
    ctx.validate(where);
    if (this->heads_ % std::size_t(ctx.size) != 0)
      throw Error(where + ": " + std::to_string(this->heads_) +
                  " heads cannot be split evenly over tp = " + std::to_string(ctx.size) +
                  " ranks (make heads a multiple of tp)");
    if (initialized_ && ctx.size != ctx_.size)
      throw Error(where + ": the layer was initialised for tp = " + std::to_string(ctx_.size) +
                  "; set the context before initialize()");
    ctx_ = ctx;
    this->heads_local_ = this->heads_ / std::size_t(ctx.size);
  }
  /*! \brief The group this layer belongs to. */
  TensorParallelContext const& tensor_parallel() const { return ctx_; }
  /*! \brief First head this rank computes. */
  std::size_t first_head() const { return this->heads_local_ * std::size_t(ctx_.rank); }
  /*! \brief Heads this rank computes. */
  std::size_t local_heads() const { return this->heads_local_; }
  /*! \brief "proj.bias" is replicated (the group size); the rest are shards (1).
   *  \param name parameter name */
  int parameter_replicas(std::string const& name) const {
    return name == "proj.bias" ? ctx_.size : 1;
  }
  /*! \brief This rank's heads: rows of the query, key and value weights
   *  [hidden, hidden] and biases, columns of proj.weight; all of proj.bias.
   *  \param name parameter name \param local the local tensor's extents */
  TensorBlock parameter_block(std::string const& name,
                              std::vector<std::size_t> const& local) const {
    TensorBlock b{local, std::vector<std::size_t>(local.size(), 0)};
    std::size_t const row0 = first_head() * (this->hidden_ / this->heads_);
    std::size_t const dim = name == "proj.weight" ? 1 : 0; // proj: columns, the rest: rows
    if (name != "proj.bias" && dim < local.size()) {
      b.shape[dim] = this->hidden_;
      b.offset[dim] = row0;
    }
    return b;
  }

  /*! \brief Allocates this rank's shards and draws the serial values there.
   *  \param seed the same seed the serial layer gets */
  void initialize(std::uint64_t seed) {
    std::size_t const h = this->hidden_, local = this->heads_local_ * (h / this->heads_);
    std::size_t const row0 = first_head() * (h / this->heads_);
    Proj* qkv[] = {&this->q_, &this->k_, &this->v_};
    for (std::uint64_t i = 0; i < 3; ++i) {
      *qkv[i] = Proj(h, local, bias_);
      qkv[i]->initialize(seed); // allocates [local, h]; redrawn below at the global rows
      detail::dense_fill_block(qkv[i]->weight, qkv[i]->bias, detail::mix_seed(seed, i), h, row0, 0);
    }
    this->proj_ = Proj(local, h, bias_);
    this->proj_.initialize(seed);
    detail::dense_fill_block(this->proj_.weight, this->proj_.bias, detail::mix_seed(seed, 3), h, 0,
                             row0);
    initialized_ = true;
  }

  /*! \brief y = attention of this rank's heads, summed over the group (one
   *  allreduce of y), + bo. \param exec execution space instance
   *  \param x replicated input [n, seq * hidden] \param y replicated output
   *  \param saved this rank's Q, K, V, O and log-sum-exp */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type& saved) const {
    detail::ScopedRegion region("telar::HeadParallel::forward");
    auto const& ctx = ctx_;
    this->forward_impl(exec, x, y, saved, [&](auto const& v) { ctx.allreduce_sum(exec, v); });
  }
  /*! \brief dx summed over the group (one allreduce of dx); keeps this rank's
   *  inner gradients for backward_weight. \param exec execution space instance
   *  \param dy replicated output gradient \param dx replicated input gradient
   *  \param saved state of the matching forward */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      saved_type const& saved) const {
    detail::ScopedRegion region("telar::HeadParallel::backward_input");
    auto const& ctx = ctx_;
    this->backward_input_impl(exec, dy, dx, saved,
                              [&](auto const& v) { ctx.allreduce_sum(exec, v); });
  }

private:
  template <class>
  friend class HeadParallel; // the converting constructor reads another policy's layer

  TensorParallelContext ctx_;
  bool bias_ = true;
  bool initialized_ = false;
};

/*! \brief The pre-norm block of telar::TransformerBlock with head-parallel
 *  attention and a ColumnParallel/RowParallel MLP; at tp = 1 it computes
 *  what TransformerBlock computes, and its parameters have the same names.
 *  \tparam T value type \tparam MemorySpace memory space
 *  \tparam Norm telar::LayerNorm or telar::RMSNorm \tparam Act telar::GELU or telar::GELUTanh */
template <class T = float, class MemorySpace = DefaultMemorySpace,
          class Norm = LayerNorm<T, MemorySpace>, class Act = GELU<T, MemorySpace>>
using TensorParallelTransformerBlock = Sequential<
    Residual<Norm, HeadParallel<CausalSelfAttention<T, MemorySpace>>>,
    Residual<Norm, ColumnParallel<Dense<T, MemorySpace>>, Act, RowParallel<Dense<T, MemorySpace>>>>;

/*! \brief A configured TensorParallelTransformerBlock (full sizes; join a
 *  group with telar::set_tensor_parallel before initialize).
 *  \tparam T value type \tparam MemorySpace memory space \tparam Norm norm layer
 *  \tparam Act activation \param hidden model width \param heads all heads
 *  \param eps the norms' epsilon \param mlp_ratio MLP width / hidden */
template <class T = float, class MemorySpace = DefaultMemorySpace,
          class Norm = LayerNorm<T, MemorySpace>, class Act = GELU<T, MemorySpace>>
TensorParallelTransformerBlock<T, MemorySpace, Norm, Act>
make_tensor_parallel_transformer_block(std::size_t hidden, std::size_t heads, double eps = 1e-5,
                                       std::size_t mlp_ratio = 4) {
  using Attn = HeadParallel<CausalSelfAttention<T, MemorySpace>>;
  using Col = ColumnParallel<Dense<T, MemorySpace>>;
  using Row = RowParallel<Dense<T, MemorySpace>>;
  return TensorParallelTransformerBlock<T, MemorySpace, Norm, Act>(
      Residual<Norm, Attn>(Norm(hidden, eps), Attn(hidden, heads)),
      Residual<Norm, Col, Act, Row>(Norm(hidden, eps), Col(hidden, mlp_ratio * hidden), Act{},
                                    Row(mlp_ratio * hidden, hidden)));
}

} // namespace telar
