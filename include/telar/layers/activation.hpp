#pragma once
/*! \file
 *  \brief Element-wise activation layers: ReLU, GELU (exact), GELUTanh,
 *  Sigmoid and Tanh. */
#include <telar/core/detail/elementwise.hpp>
#include <telar/core/detail/fast_math.hpp>
#include <telar/core/detail/math.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/tensor.hpp>

namespace telar {

namespace detail {
// Shared body of element-wise layers: Op provides value(x) and slope(x, y),
// the derivative given the input x and output y; Saved picks which of the two
// backward keeps (ReLU needs only y, GELU needs x).
template <class Op, class T, class MemorySpace, bool KeepInput>
struct Elementwise {
  using value_type = T;
  using memory_space = MemorySpace;
  static constexpr bool preserves_shape = true; // lets Sequential see through it
  struct saved_type {
    ConstMatrix<T, MemorySpace> kept; // x or y, per KeepInput
  };

  Shape output_shape(Shape const& in) const { return in; }
  double flops(std::size_t samples, Shape const& in) const { return double(samples) * in.size(); }
  std::size_t saved_bytes(std::size_t, Shape const&) const { return 0; } // a view

  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type& saved) const {
    auto fx = flat(x, "telar::activation::forward");
    auto fy = flat(y, "telar::activation::forward");
    if (fx.extent(0) != fy.extent(0))
      throw ShapeError("telar::activation::forward: input and output sizes differ");
    Kokkos::parallel_for(
        "telar::activation::forward", Kokkos::RangePolicy<Exec>(exec, 0, fx.extent(0)),
        KOKKOS_LAMBDA(std::size_t i) { fy(i) = Op::value(fx(i)); });
    if constexpr (KeepInput)
      saved.kept = x;
    else
      saved.kept = y;
  }

  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      saved_type const& saved) const {
    auto fdy = flat(dy, "telar::activation::backward_input");
    auto fdx = flat(dx, "telar::activation::backward_input");
    auto fk = flat(saved.kept, "telar::activation::backward_input");
    Kokkos::parallel_for(
        "telar::activation::backward_input", Kokkos::RangePolicy<Exec>(exec, 0, fdy.extent(0)),
        KOKKOS_LAMBDA(std::size_t i) { fdx(i) = fdy(i) * Op::slope(fk(i)); });
  }
};

struct ReluOp {
  template <class T>
  KOKKOS_INLINE_FUNCTION static T value(T x) {
    return x > T(0) ? x : T(0);
  }
  // Called with the output y: y > 0 exactly where x > 0.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T slope(T y) {
    return y > T(0) ? T(1) : T(0);
  }
};

struct GeluOp {
  // Exact GELU, x Phi(x), as PyTorch's default.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T value(T x) {
    return T(0.5) * x * (T(1) + detail::fast_erf(x * T(0.70710678118654752440)));
  }
  // Called with the input x: Phi(x) + x phi(x).
  template <class T>
  KOKKOS_INLINE_FUNCTION static T slope(T x) {
    T const cdf = T(0.5) * (T(1) + detail::fast_erf(x * T(0.70710678118654752440)));
    T const pdf = T(0.39894228040143267794) * detail::fast_exp(T(-0.5) * x * x);
    return cdf + x * pdf;
  }
};
struct GeluTanhOp {
  // 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3): GPT-2's form.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T value(T x) {
    T const u = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
    return T(0.5) * x * (T(1) + detail::tanh(u));
  }
  // Called with the input x.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T slope(T x) {
    T const u = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
    T const t = detail::tanh(u);
    T const du = T(0.79788456080286535588) * (T(1) + T(3 * 0.044715) * x * x);
    return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du;
  }
};
struct SigmoidOp {
  template <class T>
  KOKKOS_INLINE_FUNCTION static T value(T x) {
    return T(1) / (T(1) + detail::exp(-x));
  }
  // Called with the output y: y (1 - y).
  template <class T>
  KOKKOS_INLINE_FUNCTION static T slope(T y) {
    return y * (T(1) - y);
  }
};
struct TanhOp {
  template <class T>
  KOKKOS_INLINE_FUNCTION static T value(T x) {
    return detail::tanh(x);
  }
  // Called with the output y: 1 - y^2.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T slope(T y) {
    return T(1) - y * y;
  }
};
} // namespace detail

/*! \brief Logistic sigmoid, y = 1 / (1 + exp(-x)). Keeps y for backward.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct Sigmoid : detail::Elementwise<detail::SigmoidOp, T, MemorySpace, false> {
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "Sigmoid"; }
};

/*! \brief Hyperbolic tangent, y = tanh(x). Keeps y for backward.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct Tanh : detail::Elementwise<detail::TanhOp, T, MemorySpace, false> {
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "Tanh"; }
};

/*! \brief Rectified linear unit, y = max(x, 0). Keeps y for backward.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct ReLU : detail::Elementwise<detail::ReluOp, T, MemorySpace, false> {
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "ReLU"; }
};

/*! \brief Gaussian error linear unit, y = x Phi(x) (exact, erf form). Keeps x
 *  for backward. \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct GELU : detail::Elementwise<detail::GeluOp, T, MemorySpace, true> {
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "GELU"; }
};

/*! \brief GELU with the tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x +
 *  0.044715 x^3))), as GPT-2 and PyTorch's `nn.GELU(approximate='tanh')`.
 *  Keeps x for backward. telar::GELU is the exact (erf) form.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct GELUTanh : detail::Elementwise<detail::GeluTanhOp, T, MemorySpace, true> {
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "GELUTanh"; }
};

} // namespace telar
