#pragma once
/*! \file
 *  \brief Stochastic gradient descent with momentum, Nesterov and weight decay. */
#include <telar/optim/optimizer.hpp>

namespace telar {

/*! \brief SGD as in PyTorch's torch.optim.SGD (dampening 0):
 *  g += wd w; b = mu b + g; w -= lr (nesterov ? g + mu b : b).
 *  \tparam T value type */
template <class T = float>
struct SGD {
  /*! \brief Scalar type. */
  using value_type = T;
  /*! \brief One slot: the momentum buffer. */
  static constexpr int state_size = 1;
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "sgd"; }

  T momentum = 0;        //!< mu
  T weight_decay = 0;    //!< L2 penalty added to the gradient
  bool nesterov = false; //!< Nesterov momentum

  /*! \brief Updates one element. \param w parameter \param g gradient
   *  \param s state \param info step information */
  KOKKOS_INLINE_FUNCTION void update(T& w, T g, OptimizerState<T> s,
                                     StepInfo<T> const& info) const {
    g += weight_decay * w;
    if (momentum != T(0)) {
      // b starts at 0, so the first step gives b = g, as PyTorch's clone(g).
      T const b = momentum * s[0] + g;
      s[0] = b;
      g = nesterov ? g + momentum * b : b;
    }
    w -= info.lr * g;
  }
};

} // namespace telar
