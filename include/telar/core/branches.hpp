#pragma once
/*! \file
 *  \brief Blocks whose branches all read the block's input and whose outputs
 *  are joined: telar::Concat (along channels), telar::DenseConcat (x and
 *  body(x) along channels), telar::Add (sum) and telar::Mul (element-wise
 *  product). With telar::Residual they share one walk over their branches.
 *
 *  Each block is a layer: one unit for pipeline partitioning, nestable in a
 *  telar::Sequential and in each other. A branch is a layer or a
 *  telar::Sequential. Branch i's parameters are named "<i>.<name>", as
 *  PyTorch names a module that keeps its branches in an nn.ModuleList or an
 *  nn.Sequential-like container (a Concat whose branch 1 is a chain names
 *  the weight of that chain's layer 0 "1.0.weight"); branch i's seed stream
 *  is mix_seed(seed, i). `block.branch<I>()` is branch I;
 *  `block.for_each_branch(f)` calls f(std::integral_constant<std::size_t, I>,
 *  branch) for each, first to last.
 *  \code
 *  using C = telar::Conv2D<float>;
 *  // Inception-like: three branches on one input, channels concatenated.
 *  using Inception = telar::Concat<C, telar::Sequential<C, telar::ReLU<float>, C>,
 *                                  telar::Sequential<telar::MaxPool2D<float>, C>>;
 *  // Squeeze-excitation: x times per-channel weights in (0, 1).
 *  using SE = telar::Mul<telar::Identity<float>,
 *                        telar::Sequential<telar::GlobalAvgPool<float>, telar::Dense<float>,
 *                                          telar::ReLU<float>, telar::Dense<float>,
 *                                          telar::Sigmoid<float>>>;
 *  \endcode
 */
#include <telar/core/detail/branch_block.hpp>
#include <telar/core/identity.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/sequential.hpp>

#include <utility>

namespace telar {

/*! \brief y = the branches' outputs concatenated along channels (the first
 *  dimension of the per-sample shape), as torch.cat(..., dim=1). Every other
 *  dimension must agree; a ShapeError names the block, the branch and both
 *  shapes otherwise. An Inception module.
 *  \tparam Branches layers or telar::Sequential chains, each fed the input */
template <class... Branches>
using Concat = detail::BranchBlock<detail::ConcatKind, Branches...>;

/*! \brief y = the sum of the branches' outputs. A branch may give one value
 *  per channel ([C] or [C, 1, 1] against [C, H, W]), spread over the channel
 *  as PyTorch broadcasts; any other mismatch is a ShapeError naming the
 *  block, the branch and both shapes.
 *  \tparam Branches layers or telar::Sequential chains, each fed the input */
template <class... Branches>
using Add = detail::BranchBlock<detail::AddKind, Branches...>;

/*! \brief y = the element-wise product of the branches' outputs, with the
 *  broadcasting of telar::Add. Squeeze-excitation is
 *  Mul<Identity, Sequential<GlobalAvgPool, Dense, ReLU, Dense, Sigmoid>>.
 *  \tparam Branches layers or telar::Sequential chains, each fed the input */
template <class... Branches>
using Mul = detail::BranchBlock<detail::MulKind, Branches...>;

/*! \brief y = concat(x, body(x)) along channels, body the chain
 *  \p Layers...: a DenseNet layer, or a U-Net skip around a chain. The body
 *  must keep every dimension but the first.
 *
 *  Parameters are named as the body's, "<i>.<name>" for body layer i (as
 *  telar::Residual's body, and as a PyTorch module whose forward is
 *  torch.cat([x, self.body(x)], 1) with the body's layers as its children).
 *  \tparam Layers the body's layers */
template <class... Layers>
class DenseConcat
    : public detail::BranchBlock<detail::DenseConcatKind,
                                 Identity<typename Sequential<Layers...>::value_type,
                                          typename Sequential<Layers...>::memory_space>,
                                 Sequential<Layers...>> {
  using Body = Sequential<Layers...>;
  using Base =
      detail::BranchBlock<detail::DenseConcatKind,
                          Identity<typename Body::value_type, typename Body::memory_space>, Body>;

public:
  /*! \brief Default-constructed layers. */
  DenseConcat() = default;
  /*! \brief \param layers the body's layers */
  explicit DenseConcat(Layers... layers) : Base({}, Body(std::move(layers)...)) {}

  /*! \brief The body. */
  Body& body() { return this->template branch<1>(); }
  /*! \brief The body. */
  Body const& body() const { return this->template branch<1>(); }
};

} // namespace telar
