#pragma once
/*! \file
 *  \brief Adam and AdamW. */
#include <telar/core/detail/math.hpp>
#include <telar/optim/optimizer.hpp>

#include <cmath>

namespace telar {

namespace detail {
template <class T, bool Decoupled>
struct AdamBase {
  using value_type = T;
  static constexpr int state_size = 2; // m, v

  T beta1 = T(0.9);
  T beta2 = T(0.999);
  T eps = T(1e-8);
  T weight_decay = 0;
  T bias_correction1 = 1; // 1 - beta1^t, set by begin_step
  T bias_correction2 = 1; // 1 - beta2^t

  void begin_step(StepInfo<T> const& info) {
    bias_correction1 = T(1) - T(std::pow(double(beta1), double(info.step)));
    bias_correction2 = T(1) - T(std::pow(double(beta2), double(info.step)));
  }

  KOKKOS_INLINE_FUNCTION void update(T& w, T g, OptimizerState<T> s,
                                     StepInfo<T> const& info) const {
    if constexpr (Decoupled)
      w -= info.lr * weight_decay * w;
    else
      g += weight_decay * w;
    T const m = beta1 * s[0] + (T(1) - beta1) * g;
    T const v = beta2 * s[1] + (T(1) - beta2) * g * g;
    s[0] = m;
    s[1] = v;
    // PyTorch's form: lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps).
    T const denom = detail::sqrt(v) / detail::sqrt(bias_correction2) + eps;
    w -= info.lr / bias_correction1 * m / denom;
  }
};
} // namespace detail

/*! \brief Adam (Kingma & Ba) with L2 weight decay added to the gradient, as
 *  torch.optim.Adam. \tparam T value type */
template <class T = float>
struct Adam : detail::AdamBase<T, false> {
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "adam"; }
};

/*! \brief AdamW (Loshchilov & Hutter): decoupled weight decay w -= lr wd w,
 *  as torch.optim.AdamW. \tparam T value type */
template <class T = float>
struct AdamW : detail::AdamBase<T, true> {
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "adamw"; }
  /*! \brief AdamW with PyTorch's default decay 0.01. */
  AdamW() { this->weight_decay = T(0.01); }
};

} // namespace telar
