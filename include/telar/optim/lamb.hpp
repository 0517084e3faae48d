#pragma once
/*! \file
 *  \brief LAMB: Adam directions scaled per tensor by a trust ratio. */
#include <telar/core/detail/math.hpp>
#include <telar/optim/optimizer.hpp>

#include <cmath>

namespace telar {

/*! \brief LAMB (You et al., "Large Batch Optimization for Deep Learning"):
 *  u = m_hat / (sqrt(v_hat) + eps) + wd w, w -= lr (||w|| / ||u||) u, the
 *  ratio taken as 1 when either norm is zero. The norms are over the whole
 *  tensor, across every shard that holds part of it.
 *  \tparam T value type */
template <class T = float>
struct LAMB {
  /*! \brief Scalar type. */
  using value_type = T;
  /*! \brief Slots m and v. */
  static constexpr int state_size = 2;
  /*! \brief Two-phase update with tensor norms. */
  static constexpr bool layerwise = true;
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "lamb"; }

  T beta1 = T(0.9);         //!< first-moment decay
  T beta2 = T(0.999);       //!< second-moment decay
  T eps = T(1e-6);          //!< denominator guard
  T weight_decay = T(0.01); //!< decoupled decay inside the direction
  T bias_correction1 = 1;   //!< 1 - beta1^t (begin_step)
  T bias_correction2 = 1;   //!< 1 - beta2^t (begin_step)

  /*! \brief Bias corrections of this step. \param info step information */
  void begin_step(StepInfo<T> const& info) {
    bias_correction1 = T(1) - T(std::pow(double(beta1), double(info.step)));
    bias_correction2 = T(1) - T(std::pow(double(beta2), double(info.step)));
  }
  /*! \brief Updates m, v and returns the direction u.
   *  \param w parameter \param g gradient \param s state \param info step information */
  KOKKOS_INLINE_FUNCTION T direction(T w, T g, OptimizerState<T> s, StepInfo<T> const& info) const {
    (void)info;
    T const m = beta1 * s[0] + (T(1) - beta1) * g;
    T const v = beta2 * s[1] + (T(1) - beta2) * g * g;
    s[0] = m;
    s[1] = v;
    return (m / bias_correction1) / (detail::sqrt(v / bias_correction2) + eps) + weight_decay * w;
  }
  /*! \brief w -= lr * trust * u. \param w parameter \param u direction
   *  \param n tensor norms \param info step information */
  KOKKOS_INLINE_FUNCTION void apply(T& w, T u, TensorNorms<T> const& n,
                                    StepInfo<T> const& info) const {
    T const trust =
        (n.param_norm > T(0) && n.update_norm > T(0)) ? n.param_norm / n.update_norm : T(1);
    w -= info.lr * trust * u;
  }
};

} // namespace telar
