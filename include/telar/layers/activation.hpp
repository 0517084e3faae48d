#pragma once
/*! \file
 *  \brief Element-wise activation layers: ReLU, ReLU6, Clip, LeakyReLU, ELU,
 *  GELU (exact), GELUTanh, SiLU (Swish), HardSwish, HardSigmoid, Sigmoid,
 *  Tanh, Scale (by a constant) and MathFunction (exp, sqrt, erf, pow). */
#include <telar/core/detail/elementwise.hpp>
#include <telar/core/detail/fast_math.hpp>
#include <telar/core/detail/host_simd.hpp>
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/detail/math.hpp>
#include <telar/core/detail/sign_bits.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/detail/bf16_saved_input.hpp>

#include <cstdint>
#include <cstring>
#include <string>

namespace telar {

namespace detail {
// Shared body of element-wise layers: an Op provides value(x) and slope(k),
// the derivative given the kept tensor k (the input x or the output y, per
// KeepInput: ReLU needs only y, GELU needs x). Ops are held by value so that
// parameterised ones (LeakyReLU's slope, Clip's bounds) carry their settings
// into kernels; parameterless ones are empty and cost nothing.
template <class Op, class T, class MemorySpace, bool KeepInput>
struct Elementwise : public ShapePreservingLayerTypes<T, MemorySpace> {
  static constexpr BackwardReads backward_reads =
      KeepInput ? BackwardReads::input : BackwardReads::output;
  struct saved_type {
    ConstMatrix<T, MemorySpace> kept; // x or y, per KeepInput
  };

  Elementwise() = default;
  explicit Elementwise(Op op) : op_(op) {}

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
    Op const op = op_;
    detail::simd_for(
        "telar::activation::forward", exec, fx.extent(0),
        KOKKOS_LAMBDA(std::size_t i) { fy(i) = op.value(fx(i)); });
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
    Op const op = op_;
    detail::simd_for(
        "telar::activation::backward_input", exec, fdy.extent(0), KOKKOS_LAMBDA(std::size_t i) {
          // The slope in a statement of its own: folded into the product, a
          // 0-or-1 slope becomes a branch on every value (GCC 12).
          T const slope = op.slope(fk(i));
          fdx(i) = fdy(i) * slope;
        });
  }

protected:
  Op op_{};
};

// The piecewise ops below select without a branch (zero_unless, select): a
// network's activations fall on either side of a kink at random.
struct ReluOp {
  template <class T>
  KOKKOS_INLINE_FUNCTION static T value(T x) {
    return detail::zero_unless(x > T(0), x);
  }
  // Called with the output y: y > 0 exactly where x > 0.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T slope(T y) {
    return detail::zero_unless(y > T(0), T(1));
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
struct Relu6Op {
  template <class T>
  KOKKOS_INLINE_FUNCTION static T value(T x) {
    return detail::select(x < T(0), T(0), detail::select(x > T(6), T(6), x));
  }
  // Called with the output y: 1 strictly inside (0, 6), as PyTorch's hardtanh.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T slope(T y) {
    return detail::zero_unless((y > T(0)) & (y < T(6)), T(1));
  }
};
template <class T>
struct ClipOp {
  T lo, hi;
  KOKKOS_INLINE_FUNCTION T value(T x) const {
    return detail::select(x < lo, lo, detail::select(x > hi, hi, x));
  }
  // Called with the input x: 1 on the closed [lo, hi], as torch.clamp.
  KOKKOS_INLINE_FUNCTION T slope(T x) const {
    return detail::zero_unless((x >= lo) & (x <= hi), T(1));
  }
};
template <class T>
struct ScaleOp {
  T factor;
  KOKKOS_INLINE_FUNCTION T value(T x) const { return factor * x; }
  KOKKOS_INLINE_FUNCTION T slope(T) const { return factor; }
};
template <class T>
struct LeakyReluOp {
  T negative_slope;
  KOKKOS_INLINE_FUNCTION T value(T x) const {
    return detail::select(x > T(0), x, negative_slope * x);
  }
  // Called with the input x (a negative slope would make y's sign ambiguous).
  KOKKOS_INLINE_FUNCTION T slope(T x) const {
    return detail::select(x > T(0), T(1), negative_slope);
  }
};
template <class T>
struct EluOp {
  T alpha;
  KOKKOS_INLINE_FUNCTION T value(T x) const {
    return detail::select(x > T(0), x, alpha * (detail::exp(x) - T(1)));
  }
  // Called with the input x: alpha exp(x) at and below 0, as PyTorch.
  KOKKOS_INLINE_FUNCTION T slope(T x) const {
    return detail::select(x > T(0), T(1), alpha * detail::exp(x));
  }
};
struct SiluOp {
  template <class T>
  KOKKOS_INLINE_FUNCTION static T value(T x) {
    return x / (T(1) + detail::exp(-x));
  }
  // Called with the input x: s (1 + x (1 - s)), s = sigmoid(x).
  template <class T>
  KOKKOS_INLINE_FUNCTION static T slope(T x) {
    T const s = T(1) / (T(1) + detail::exp(-x));
    return s * (T(1) + x * (T(1) - s));
  }
};
struct HardSwishOp {
  template <class T>
  KOKKOS_INLINE_FUNCTION static T value(T x) {
    return detail::select(x <= T(-3), T(0), detail::select(x >= T(3), x, x * (x + T(3)) / T(6)));
  }
  // Called with the input x; at the kinks PyTorch 1.13's choice: x / 3 + 1/2
  // on [-3, 3), so -1/2 at -3 and 1 at 3.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T slope(T x) {
    return detail::select(x < T(-3), T(0), detail::select(x < T(3), x / T(3) + T(0.5), T(1)));
  }
};
// One of exp, sqrt, erf or x^p, chosen when the layer is made (ONNX's Exp,
// Sqrt, Erf and Pow by a constant): a switch on a value every lane shares,
// so one kernel serves the four without a branch on the data.
enum class MathFnKind { exp, sqrt, erf, pow };
template <class T>
struct MathFnOp {
  MathFnKind kind;
  T p; // the exponent of pow
  KOKKOS_INLINE_FUNCTION T value(T x) const {
    switch (kind) {
    case MathFnKind::exp: // the library's: fast_exp stops at 87 (exp(88) is a float)
      return detail::exp(x);
    case MathFnKind::sqrt:
      return detail::sqrt(x);
    case MathFnKind::erf:
      return detail::fast_erf(x);
    default:
      return detail::pow(x, p);
    }
  }
  // Called with the input x. pow: p x^(p-1), and 0 for p = 0 (as PyTorch,
  // where 0 * x^-1 would be NaN at 0); sqrt: 1 / (2 sqrt(x)), inf at 0.
  KOKKOS_INLINE_FUNCTION T slope(T x) const {
    switch (kind) {
    case MathFnKind::exp:
      return detail::exp(x);
    case MathFnKind::sqrt:
      return T(0.5) / detail::sqrt(x);
    case MathFnKind::erf:
      return T(1.12837916709551257390) * detail::fast_exp(-x * x);
    default:
      return p == T(0) ? T(0) : p * detail::pow(x, p - T(1));
    }
  }
};
template <class T>
struct HardSigmoidOp {
  T alpha, beta;
  KOKKOS_INLINE_FUNCTION T value(T x) const {
    T const v = alpha * x + beta;
    return detail::select(v < T(0), T(0), detail::select(v > T(1), T(1), v));
  }
  // Called with the output y: alpha strictly inside (0, 1), as PyTorch.
  KOKKOS_INLINE_FUNCTION T slope(T y) const {
    return detail::zero_unless((y > T(0)) & (y < T(1)), alpha);
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

/*! \brief Rectified linear unit, y = max(x, 0). Keeps y for backward, or,
 *  where no neighbour's backward reads y (the stage runner sets
 *  saved_type::compact), y's signs: one bit a value instead of a tensor.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct ReLU : detail::Elementwise<detail::ReluOp, T, MemorySpace, false> {
  /*! \brief The element-wise layer a ReLU extends with its compact copy. */
  using Base = detail::Elementwise<detail::ReluOp, T, MemorySpace, false>;
  /*! \brief The output (a view), or its signs. */
  struct saved_type : Base::saved_type {
    bool compact = false;                            //!< keep the signs (the stage runner's)
    Kokkos::View<std::uint32_t*, MemorySpace> signs; //!< bit i % 32 of word i / 32: y_i > 0
  };
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "ReLU"; }
  /*! \brief The signs of \p samples outputs, in 32-bit words. */
  std::size_t compact_bytes(std::size_t samples, Shape const& in) const {
    return detail::view_bytes<std::uint32_t>(words(samples * in.size()));
  }

  /*! \brief y = max(x, 0); keeps y or its signs. \param exec execution space
   *  instance \param x input \param y output \param saved what backward reads */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type& saved) const {
    if (!saved.compact)
      return Base::forward(exec, x, y, saved);
    auto fx = detail::flat(x, "telar::ReLU::forward");
    auto fy = detail::flat(y, "telar::ReLU::forward");
    if (fx.extent(0) != fy.extent(0))
      throw ShapeError("telar::activation::forward: input and output sizes differ");
    std::size_t const n = fx.extent(0);
    saved.kept = {};
    if (saved.signs.extent(0) != words(n))
      saved.signs = Kokkos::View<std::uint32_t*, MemorySpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::ReLU::signs"), words(n));
    auto signs = saved.signs;
    T const* const xp = fx.data();
    T* const yp = fy.data();
    Kokkos::parallel_for( // a word's 32 values in one thread: no two write a word
        "telar::ReLU::forward_signs", Kokkos::RangePolicy<Exec>(exec, 0, words(n)),
        KOKKOS_LAMBDA(std::size_t w) {
          std::size_t const first = w * 32, count = n - first < 32 ? n - first : 32;
          signs(w) = detail::relu_signs(xp + first, yp + first, count);
        });
  }
  /*! \brief dx = dy where y > 0, else 0. \param exec execution space instance
   *  \param dy gradient of the output \param dx gradient of the input
   *  \param saved y or its signs */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      saved_type const& saved) const {
    if (!saved.compact)
      return Base::backward_input(exec, dy, dx, saved);
    auto fdy = detail::flat(dy, "telar::ReLU::backward_input");
    auto fdx = detail::flat(dx, "telar::ReLU::backward_input");
    auto signs = saved.signs;
    T const* const dyp = fdy.data();
    T* const dxp = fdx.data();
    std::size_t const n = fdy.extent(0);
    Kokkos::parallel_for(
        "telar::ReLU::backward_signs", Kokkos::RangePolicy<Exec>(exec, 0, words(n)),
        KOKKOS_LAMBDA(std::size_t w) {
          std::size_t const first = w * 32, count = n - first < 32 ? n - first : 32;
          detail::relu_signs_backward(signs(w), dyp + first, dxp + first, count);
        });
  }

private:
  static constexpr std::size_t words(std::size_t values) { return (values + 31) / 32; }
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

/*! \brief ReLU6, y = min(max(x, 0), 6) (MobileNet's). Keeps y for backward;
 *  the slope is 1 strictly inside (0, 6), as PyTorch.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct ReLU6 : detail::Elementwise<detail::Relu6Op, T, MemorySpace, false> {
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "ReLU6"; }
};

/*! \brief Clip (ONNX Clip, torch.clamp), y = min(max(x, lo), hi). Keeps x for
 *  backward; the slope is 1 on the closed [lo, hi], as torch.clamp.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct Clip : detail::Elementwise<detail::ClipOp<T>, T, MemorySpace, true> {
  /*! \brief Clips to [lo, hi]. \param lo lower bound \param hi upper bound
   *  \throws Error when lo > hi */
  Clip(T lo, T hi) : Clip::Elementwise(check({lo, hi})) {}
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "Clip"; }
  /*! \brief The lower bound. */
  T min() const { return this->op_.lo; }
  /*! \brief The upper bound. */
  T max() const { return this->op_.hi; }

private:
  static detail::ClipOp<T> check(detail::ClipOp<T> op) {
    if (!(op.lo <= op.hi))
      throw Error("telar::Clip: min (" + std::to_string(op.lo) + ") must not exceed max (" +
                  std::to_string(op.hi) + ")");
    return op;
  }
};

/*! \brief y = factor * x with a constant factor (an imported Mul or Div by
 *  a constant scalar: attention's 1 / sqrt(head size)).
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct Scale : detail::Elementwise<detail::ScaleOp<T>, T, MemorySpace, false> {
  /*! \brief \param factor the constant */
  explicit Scale(T factor = T(1)) : Scale::Elementwise({factor}) {}
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "Scale"; }
  /*! \brief The constant. */
  T factor() const { return this->op_.factor; }
};

/*! \brief Leaky ReLU, y = x for x > 0, negative_slope x otherwise. Keeps x
 *  for backward. \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct LeakyReLU : detail::Elementwise<detail::LeakyReluOp<T>, T, MemorySpace, true> {
  /*! \brief \param negative_slope slope for x <= 0 (PyTorch's default 0.01) */
  explicit LeakyReLU(T negative_slope = T(0.01)) : LeakyReLU::Elementwise({negative_slope}) {}
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "LeakyReLU"; }
  /*! \brief The slope for x <= 0. */
  T negative_slope() const { return this->op_.negative_slope; }
};

/*! \brief Exponential linear unit, y = x for x > 0, alpha (exp(x) - 1)
 *  otherwise. Keeps x for backward.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct ELU : detail::Elementwise<detail::EluOp<T>, T, MemorySpace, true> {
  /*! \brief \param alpha scale of the negative part (default 1) */
  explicit ELU(T alpha = T(1)) : ELU::Elementwise({alpha}) {}
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "ELU"; }
  /*! \brief The scale of the negative part. */
  T alpha() const { return this->op_.alpha; }
};

/*! \brief SiLU (Swish), y = x sigmoid(x). Keeps x for backward.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct SiLU : detail::Elementwise<detail::SiluOp, T, MemorySpace, true> {
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "SiLU"; }
};

/*! \brief Swish is another name of telar::SiLU (beta = 1). */
template <class T = float, class MemorySpace = DefaultMemorySpace>
using Swish = SiLU<T, MemorySpace>;

/*! \brief Hard swish, y = x relu6(x + 3) / 6 (MobileNetV3, PyTorch's
 *  Hardswish). Keeps x for backward.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct HardSwish : detail::Elementwise<detail::HardSwishOp, T, MemorySpace, true> {
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "HardSwish"; }
};

/*! \brief Hard sigmoid, y = max(0, min(1, alpha x + beta)). The defaults are
 *  PyTorch's (relu6(x + 3) / 6); ONNX's HardSigmoid defaults are alpha = 0.2,
 *  beta = 0.5. Keeps y for backward.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct HardSigmoid : detail::Elementwise<detail::HardSigmoidOp<T>, T, MemorySpace, false> {
  /*! \brief \param alpha slope (default 1/6) \param beta offset (default 1/2) */
  explicit HardSigmoid(T alpha = T(1) / T(6), T beta = T(0.5))
      : HardSigmoid::Elementwise({alpha, beta}) {}
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "HardSigmoid"; }
  /*! \brief The slope. */
  T alpha() const { return this->op_.alpha; }
  /*! \brief The offset. */
  T beta() const { return this->op_.beta; }
};

/*! \brief Which function a telar::MathFunction applies. */
using MathFn = detail::MathFnKind;

/*! \brief An element-wise function of the input: exp(x), sqrt(x), erf(x) or
 *  x^p for a constant p (ONNX's Exp, Sqrt, Erf and Pow by a constant; the
 *  imports of a graph that computes with them outside the GELU and
 *  LayerNorm patterns). Keeps x for backward. Outside the domain (sqrt of a
 *  negative value, a fractional power of a negative value) the value and the gradient
 *  are NaN, as in PyTorch.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct MathFunction : detail::Elementwise<detail::MathFnOp<T>, T, MemorySpace, true> {
  /*! \brief \param kind the function \param exponent p of MathFn::pow (ignored otherwise) */
  explicit MathFunction(MathFn kind = MathFn::exp, T exponent = T(1))
      : MathFunction::Elementwise({kind, exponent}) {}
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "MathFunction"; }
  /*! \brief The function. */
  MathFn kind() const { return this->op_.kind; }
  /*! \brief The exponent of MathFn::pow. */
  T exponent() const { return this->op_.p; }
  /*! \brief "exp", "sqrt", "erf" or "pow". */
  char const* function_name() const {
    char const* const names[] = {"exp", "sqrt", "erf", "pow"};
    return names[int(this->op_.kind)];
  }
};

#if TELAR_HAVE_ONEDNN
/*! \brief An element-wise activation whose backward reads its input (GELU,
 *  GELUTanh, SiLU) keeping that input rounded to bf16 where the stage runner
 *  asks (saved_type::compact: no neighbour's backward reads the tensor):
 *  what telar::Precision<telar::bf16, float> makes of those layers. The
 *  output is the fp32 layer's, bit for bit; the backward takes the slope at
 *  the rounded input (relative error of the input at most 2^-9), as the bf16
 *  Dense after it already multiplies by the rounded output. Where bf16
 *  falls back to fp32 (TELAR_BF16_FALLBACK=fp32) the copy is the fp32 input,
 *  exact. Without `compact` it is the layer it wraps.
 *  \tparam Act the activation (its name, shapes and costs are Act's) */
template <class Act>
struct KeptInBf16 : Act {
  static_assert(Act::backward_reads == BackwardReads::input,
                "telar::KeptInBf16: the activation's backward must read its input");
  /*! \brief Value type (float). */
  using T = typename Act::value_type;
  /*! \brief Memory space (host). */
  using M = typename Act::memory_space;
  /*! \brief The input (a view), or its bf16 copy. */
  struct saved_type : Act::saved_type {
    bool compact = false;                //!< keep the rounded copy (the stage runner's)
    detail::Bf16SavedInput<M> rounded{}; //!< the compact copy of the input
  };
  KeptInBf16() = default;
  /*! \brief The same activation, its settings kept. \param a the layer */
  explicit KeptInBf16(Act const& a) : Act(a) {}
  /*! \brief Name for messages, traces and export: the activation's. */
  static constexpr char const* name() { return Act::name(); }
  /*! \brief Bytes of the copy of \p samples inputs \p in (2 a value; 4 where
   *  bf16 falls back). */
  std::size_t compact_bytes(std::size_t samples, Shape const& in) const {
    return detail::Bf16SavedInput<M>::bytes(samples * in.size());
  }
  /*! \brief y = f(x); keeps x or its copy. \param exec execution space
   *  instance \param x input \param y output \param saved what backward reads */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, M> x, Matrix<T, M> y, saved_type& saved) const {
    Act::forward(exec, x, y, saved);
    if (!saved.compact)
      return;
    saved.kept = {};
    saved.rounded.keep(exec, x, detail::bf16_check_isa("telar::KeptInBf16"));
  }
  /*! \brief dx = dy f'(x), x the view or the rounded copy. \param exec
   *  execution space instance \param dy gradient of the output \param dx
   *  gradient of the input \param saved x or its copy */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, M> dy, Matrix<T, M> dx,
                      saved_type const& saved) const {
    if (!saved.compact || !saved.rounded.rounded()) {
      typename Act::saved_type plain = saved;
      if (saved.compact) // the fp32 copy where bf16 falls back
        plain.kept = saved.rounded.values();
      return Act::backward_input(exec, dy, dx, plain);
    }
    auto fdy = detail::flat(dy, "telar::KeptInBf16::backward_input");
    auto fdx = detail::flat(dx, "telar::KeptInBf16::backward_input");
    std::uint16_t const* const words = saved.rounded.words();
    auto const op = this->op_;
    Kokkos::parallel_for(
        "telar::KeptInBf16::backward_input", Kokkos::RangePolicy<Exec>(exec, 0, fdy.extent(0)),
        KOKKOS_LAMBDA(std::size_t i) {
          std::uint32_t const bits = std::uint32_t(words[i]) << 16; // bf16: a float's top half
          float x;
          std::memcpy(&x, &bits, sizeof x);
          T const slope = op.slope(T(x));
          fdx(i) = fdy(i) * slope;
        });
  }
};
#endif

} // namespace telar
