#pragma once
/*! \file
 *  \brief The Optimizer concept: how a user writes an optimizer that runs in
 *  every parallel mode, sharded (ZeRO) or not.
 *
 *  Telar stores parameters, gradients and optimizer state as flat arrays and
 *  calls the optimizer once per element of the range a rank owns, from device
 *  code. An optimizer therefore never sees tensors, shards or ranks; what it
 *  needs from beyond its element (the global gradient norm, a tensor's norm)
 *  it declares, and Telar computes it across all shards before calling it.
 *
 *  An element-wise optimizer (SGD, Adam, Lion):
 *  \code
 *  template <class T>
 *  struct Lion {
 *    using value_type = T;
 *    static constexpr int state_size = 1;        // momentum, per element
 *    T beta1 = 0.9, beta2 = 0.99, weight_decay = 0;
 *    KOKKOS_FUNCTION void update(T& w, T g, telar::OptimizerState<T> s,
 *                                telar::StepInfo<T> const& info) const {
 *      T const c = beta1 * s[0] + (1 - beta1) * g;
 *      w -= info.lr * ((c > 0) - (c < 0) + weight_decay * w);
 *      s[0] = beta2 * s[0] + (1 - beta2) * g;
 *    }
 *  };
 *  \endcode
 *  A layer-wise optimizer (LAMB, LARS) splits the update in two and declares
 *  `static constexpr bool layerwise = true`: `T direction(T w, T g, state,
 *  info)` updates the state and returns the update u; then Telar reduces
 *  ||w|| and ||u|| per tensor over all shards and calls `void apply(T& w, T u,
 *  TensorNorms<T> const&, info)`.
 *
 *  Optional members: `void begin_step(StepInfo<T> const&)` is called on the
 *  host before each step (precompute bias corrections and the like);
 *  `static constexpr bool needs_grad_norm = true` makes StepInfo::grad_norm
 *  the global L2 norm of the gradient; `static constexpr char const* name()`.
 *  The optimizer object is copied into kernels, so it must be trivially
 *  copyable.
 */
#include <telar/core/detail/type_traits.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <type_traits>

namespace telar {

/*! \brief What every element's update sees about the current step.
 *  \tparam T value type */
template <class T>
struct StepInfo {
  T lr = 0;           //!< learning rate of this step (from the LR schedule)
  long long step = 1; //!< 1-based step count
  T grad_scale = 1;   //!< factor Telar already applied to g (gradient clipping)
  T grad_norm = 0;    //!< global L2 norm of the unclipped gradient, if requested
};

/*! \brief Norms of the tensor an element belongs to, over all its shards.
 *  \tparam T value type */
template <class T>
struct TensorNorms {
  T param_norm = 0;  //!< ||w|| of the tensor
  T update_norm = 0; //!< ||u|| of the tensor's update direction
};

/*! \brief An element's optimizer state: slot k is s[k].
 *  \tparam T value type */
template <class T>
struct OptimizerState {
  T* base;            //!< slot 0 of this element
  std::size_t stride; //!< distance between slots
  /*! \brief Slot \p k. \param k slot index */
  KOKKOS_INLINE_FUNCTION T& operator[](int k) const { return base[k * stride]; }
};

namespace detail {
template <class O>
using opt_value_type_t = typename O::value_type;
template <class O>
using opt_state_size_t = decltype(O::state_size);
template <class O>
using opt_update_t = decltype(std::declval<O const&>().update(
    std::declval<typename O::value_type&>(), std::declval<typename O::value_type>(),
    std::declval<OptimizerState<typename O::value_type>>(),
    std::declval<StepInfo<typename O::value_type> const&>()));
template <class O>
using opt_direction_t = decltype(typename O::value_type(std::declval<O const&>().direction(
    std::declval<typename O::value_type>(), std::declval<typename O::value_type>(),
    std::declval<OptimizerState<typename O::value_type>>(),
    std::declval<StepInfo<typename O::value_type> const&>())));
template <class O>
using opt_apply_t = decltype(std::declval<O const&>().apply(
    std::declval<typename O::value_type&>(), std::declval<typename O::value_type>(),
    std::declval<TensorNorms<typename O::value_type> const&>(),
    std::declval<StepInfo<typename O::value_type> const&>()));
template <class O>
using opt_layerwise_t = std::bool_constant<bool(O::layerwise)>;
template <class O>
using opt_needs_grad_norm_t = std::bool_constant<bool(O::needs_grad_norm)>;
template <class O>
using opt_begin_step_t = decltype(std::declval<O&>().begin_step(
    std::declval<StepInfo<typename O::value_type> const&>()));
template <class O>
using opt_name_t = decltype(O::name());

template <class O>
constexpr bool layerwise_flag() {
  return flag_v<opt_layerwise_t, O>;
}
} // namespace detail

/*! \brief What Telar knows about an optimizer type. \tparam O optimizer type */
template <class O>
struct optimizer_traits {
  /*! \brief Scalar type. */
  using value_type = typename O::value_type;
  /*! \brief State slots per element. */
  static constexpr int state_size = O::state_size;
  /*! \brief Two-phase (direction, then apply with tensor norms). */
  static constexpr bool layerwise = detail::layerwise_flag<O>();
  /*! \brief StepInfo::grad_norm must be filled. */
  static constexpr bool needs_grad_norm = detail::flag_v<detail::opt_needs_grad_norm_t, O>;
  /*! \brief Has a host-side begin_step hook. */
  static constexpr bool has_begin_step = detail::is_detected_v<detail::opt_begin_step_t, O>;
};

/*! \brief True when \p O satisfies the Optimizer concept. \tparam O a type */
template <class O>
inline constexpr bool is_optimizer_v = detail::is_detected_v<detail::opt_value_type_t, O>&&
                                           detail::is_detected_v<detail::opt_state_size_t, O> &&
                                       (detail::is_detected_v<detail::opt_update_t, O> ||
                                        (detail::is_detected_v<detail::opt_direction_t, O> &&
                                         detail::is_detected_v<detail::opt_apply_t, O>));

/*! \brief Name of an optimizer for logs: its name() or "custom". \tparam O optimizer type */
template <class O>
constexpr char const* optimizer_name() {
  if constexpr (detail::is_detected_v<detail::opt_name_t, O>)
    return O::name();
  else
    return "custom";
}

namespace detail {
// Checked where an optimizer enters the API (telar::Trainer, telar::Optimize).
template <class O>
constexpr bool check_optimizer() {
  static_assert(is_detected_v<opt_value_type_t, O>,
                "telar::Trainer: an optimizer must declare `using value_type = <float|double>;`");
  static_assert(is_detected_v<opt_state_size_t, O>,
                "telar::Trainer: an optimizer must declare `static constexpr int state_size = "
                "<state slots per element>;`");
  if constexpr (is_detected_v<opt_value_type_t, O> && is_detected_v<opt_state_size_t, O>) {
    static_assert(layerwise_flag<O>() || is_detected_v<opt_update_t, O>,
                  "telar::Trainer: an optimizer must provide `KOKKOS_FUNCTION void update(T& w, T "
                  "g, telar::OptimizerState<T> s, telar::StepInfo<T> const& info) const`");
    static_assert(!layerwise_flag<O>() ||
                      (is_detected_v<opt_direction_t, O> && is_detected_v<opt_apply_t, O>),
                  "telar::Trainer: a layerwise optimizer must provide `T direction(T w, T g, "
                  "OptimizerState<T>, StepInfo<T> const&) const` and `void apply(T& w, T u, "
                  "TensorNorms<T> const&, StepInfo<T> const&) const`");
  }
  static_assert(std::is_trivially_copyable_v<O>,
                "telar::Trainer: an optimizer is copied into kernels and must be trivially "
                "copyable (no std::vector, std::function or virtual members)");
  return true;
}
} // namespace detail

} // namespace telar
