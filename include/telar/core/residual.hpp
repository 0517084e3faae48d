#pragma once
/*! \file
 *  \brief Residual blocks: y = body(x) + x, or body(x) + projection(x) when
 *  the body changes the shape. A residual block is the sum of two branches
 *  (telar::Add), with the names and messages of a residual. */
#include <telar/core/detail/branch_block.hpp>
#include <telar/core/identity.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/sequential.hpp>

#include <type_traits>
#include <utility>

namespace telar {

namespace detail {
/*! \brief The shortcut of a plain residual block: x itself. */
struct IdentityShortcut {};
template <class P, class Body>
struct shortcut_layer {
  using type = P;
};
template <class Body>
struct shortcut_layer<IdentityShortcut, Body> {
  using type = Identity<typename Body::value_type, typename Body::memory_space>;
};
template <class Projection, class... Layers>
using residual_base =
    BranchBlock<ResidualKind<!std::is_same_v<Projection, IdentityShortcut>>, Sequential<Layers...>,
                typename shortcut_layer<Projection, Sequential<Layers...>>::type>;
} // namespace detail

/*! \brief A residual block y = body(x) + shortcut(x), where body is the chain
 *  \p Layers... and shortcut is \p Projection (a layer, e.g. a 1x1
 *  convolution or a Dense, when the body changes the shape) or x itself.
 *
 *  One unit for pipeline partitioning, tensor-parallel context injection and
 *  parameter naming: the body's parameters are "<i>.<name>" (layer i of the
 *  body), the projection's "shortcut.<name>". The walk over the two branches
 *  is the one telar::Add, telar::Mul and telar::Concat use
 *  (telar/core/branches.hpp): the body is branch 0 (seed stream 0), the
 *  shortcut branch 1 (stream 1).
 *  Use telar::Residual<Layers...> or telar::ProjectedResidual<Projection, Layers...>.
 *  \tparam Projection the shortcut layer, or detail::IdentityShortcut
 *  \tparam Layers the body's layers */
template <class Projection, class... Layers>
class ResidualBlock : public detail::residual_base<Projection, Layers...> {
  static constexpr bool projected = !std::is_same_v<Projection, detail::IdentityShortcut>;
  using Base = detail::residual_base<Projection, Layers...>;
  using Body = Sequential<Layers...>;

public:
  /*! \brief Default-constructed layers. */
  ResidualBlock() = default;
  /*! \brief A plain block. \param layers the body's layers */
  template <bool P = projected, class = std::enable_if_t<!P>>
  explicit ResidualBlock(Layers... layers) : Base(Body(std::move(layers)...), {}) {}
  /*! \brief A projected block. \param projection the shortcut \param layers the body */
  template <bool P = projected, class = std::enable_if_t<P>>
  ResidualBlock(Projection projection, Layers... layers)
      : Base(Body(std::move(layers)...), std::move(projection)) {}

  /*! \brief The body. */
  Body& body() { return this->template branch<0>(); }
  /*! \brief The body. */
  Body const& body() const { return this->template branch<0>(); }
  /*! \brief The shortcut layer (projected blocks only). */
  template <bool P = projected, class = std::enable_if_t<P>>
  Projection& projection() {
    return this->template branch<1>();
  }
  /*! \brief The shortcut layer (projected blocks only). */
  template <bool P = projected, class = std::enable_if_t<P>>
  Projection const& projection() const {
    return this->template branch<1>();
  }
};

/*! \brief y = body(x) + x. \tparam Layers the body's layers (their output
 *  shape must equal their input shape) */
template <class... Layers>
using Residual = ResidualBlock<detail::IdentityShortcut, Layers...>;

/*! \brief y = body(x) + projection(x). \tparam Projection the shortcut layer
 *  \tparam Layers the body's layers */
template <class Projection, class... Layers>
using ProjectedResidual = ResidualBlock<Projection, Layers...>;

} // namespace telar
