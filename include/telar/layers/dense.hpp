#pragma once
/*! \file
 *  \brief Fully connected layer y = x W^T + b. */
#include <telar/core/detail/column_sums.hpp>
#include <telar/core/detail/counter_rng.hpp>
#include <telar/core/detail/host_simd.hpp>
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/detail/math.hpp>
#include <telar/core/detail/uniform_fill.hpp>
#include <telar/core/detail/zeroed_grads.hpp>
#include <telar/core/error.hpp>
#include <telar/core/gemm.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/detail/bf16_saved_input.hpp>

#include <cstdint>
#include <string>
#include <type_traits>

namespace telar {

namespace detail {
// Draws the block of a full [out, full_in] W (and the matching entries of b)
// whose first element is (row0, col0).
template <class W, class B>
void dense_fill_block(W const& w, B const& b, std::uint64_t seed, std::size_t full_in,
                      std::size_t row0, std::size_t col0) {
  uniform_fill_block("telar::Dense", w, b, seed, full_in, row0, col0);
}
} // namespace detail

/*! \brief Fully connected layer: y = x W^T + b, W of shape [out, in].
 *
 *  Parameters are allocated by initialize(seed) with PyTorch's default
 *  nn.Linear initialisation (uniform in ±1/sqrt(in) for W and b), drawn from
 *  a counter-based generator so a shard of W gets exactly the serial values.
 *  \tparam T value type (float or double)
 *  \tparam MemorySpace where parameters and activations live
 *  \tparam Gemm GEMM policy (see telar/core/gemm.hpp)
 */
template <class T, class MemorySpace = DefaultMemorySpace, class Gemm = AutoGemm>
class Dense : public detail::LayerTypes<T, MemorySpace> {
public:
  /*! \brief What backward needs from forward: the input. */
  struct saved_type {
    ConstMatrix<T, MemorySpace> x; //!< the forward input (a view; empty when compact)
    bool compact = false;          //!< bf16: keep the input rounded instead (the stage runner's)
    detail::saved_input_t<MemorySpace, detail::onednn_bf16_v<Gemm, T, MemorySpace>>
        kept; //!< the compact copy
  };
  /*! \brief Backward reads the input (the saved view), never the output. */
  static constexpr BackwardReads backward_reads = BackwardReads::input;

  /*! \brief An empty layer (0 x 0); assign a configured one before use. */
  Dense() = default;
  /*! \brief \param in input features \param out output features \param bias add a bias */
  Dense(std::size_t in, std::size_t out, bool bias = true) : in_(in), out_(out), use_bias_(bias) {}
  /*! \brief The same layer (configuration and parameter views) under another
   *  GEMM policy: what telar::Precision's rebind of a model makes.
   *  \tparam G the other policy \param o the layer */
  template <class G, class = std::enable_if_t<!std::is_same_v<G, Gemm>>>
  explicit Dense(Dense<T, MemorySpace, G> const& o)
      : weight(o.weight), weight_grad(o.weight_grad), bias(o.bias), bias_grad(o.bias_grad),
        in_(o.in_), out_(o.out_), use_bias_(o.use_bias_) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "Dense"; }
  /*! \brief [..., out] for an input [..., in]: applied to every position of
   *  a [sequence, in] sample. \param in the input shape
   *  \throws ShapeError when the last extent is not in */
  Shape output_shape(Shape const& in) const {
    if (in.back() != in_)
      throw ShapeError("Dense expects inputs [..., " + std::to_string(in_) + "]");
    return in.with_back(out_);
  }
  /*! \brief Input features (the last extent of the input). */
  std::size_t in_features() const { return in_; }
  /*! \brief Output features. */
  std::size_t out_features() const { return out_; }
  /*! \brief Whether the layer adds a bias. */
  bool has_bias() const { return use_bias_; }
  /*! \brief Multiply-add count of forward for \p samples samples, times 2. */
  double flops(std::size_t samples, Shape const& in) const {
    return 2.0 * double(samples) * double(in.size()) * double(out_);
  }

  /*! \brief Values of W and b. */
  std::size_t parameter_count() const { return out_ * in_ + (use_bias_ ? out_ : 0); }
  /*! \brief Keeps a view of x only: 0. */
  std::size_t saved_bytes(std::size_t, Shape const&) const { return 0; }
#if TELAR_HAVE_ONEDNN
  /*! \brief Under telar::Bf16Gemm, the input kept in bf16 when the stage
   *  runner asks (saved_type::compact; fp32 where bf16 falls back): the
   *  bytes of \p samples inputs \p in. */
  template <class G = Gemm, class = std::enable_if_t<detail::onednn_bf16_v<G, T, MemorySpace>>>
  std::size_t compact_bytes(std::size_t samples, Shape const& in) const {
    return detail::Bf16SavedInput<MemorySpace>::bytes(samples * in.size());
  }
#endif

  /*! \brief Allocates W, b and their gradients and draws W and b.
   *  \param seed stream seed (telar::Sequential derives one per layer) */
  void initialize(std::uint64_t seed) {
    allocate(out_, in_, use_bias_);
    fill_block(seed, 0, 0);
  }

  /*! \brief Visits (name, value, gradient) of each parameter.
   *  \param f callable as f(char const*, View&, View&) */
  template <class F>
  void parameters(F&& f) {
    f("weight", weight, weight_grad);
    if (use_bias_)
      f("bias", bias, bias_grad);
  }

  /*! \brief y = x W^T + b. \param exec execution space instance
   *  \param x input [n, in] \param y output [n, out] \param saved keeps x */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type& saved) const {
    check_shapes("forward", x.extent(0), x.extent(1), y.extent(0), y.extent(1));
    std::size_t const r = positions(x, y);
    auto const xr = as_rows(x, r, weight.extent(1));
    auto const yr = as_rows(y, r, weight.extent(0));
    T beta = 0;
    if (use_bias_) {
      auto b = bias;
      auto y = yr;
      if constexpr (detail::runs_on_host_v<Exec>) // a row per call, vectorised
        detail::simd_for(
            "telar::Dense::forward_bias", exec, y.extent(0),
            [=](std::size_t i) {
              for (std::size_t j = 0; j < y.extent(1); ++j)
                y(i, j) = b(j);
            },
            1);
      else
        Kokkos::parallel_for(
            "telar::Dense::forward_bias",
            Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {y.extent(0), y.extent(1)}),
            KOKKOS_LAMBDA(std::size_t i, std::size_t j) { y(i, j) = b(j); });
      beta = 1;
    }
    forward_product(exec, x, xr, yr, beta, saved);
  }

  /*! \brief dx = dy W (the saved input is not needed). \param exec execution space instance
   *  \param dy gradient of the output \param dx gradient of the input */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      saved_type const&) const {
    check_shapes("backward_input", dx.extent(0), dx.extent(1), dy.extent(0), dy.extent(1));
    std::size_t const r = positions(dx, dy);
    gemm(Gemm{}, exec, 'N', 'N', T(1), as_rows(dy, r, weight.extent(0)), weight, T(0),
         as_rows(dx, r, weight.extent(1)));
  }

  /*! \brief dW += dy^T x, db += column sums of dy.
   *  \param exec execution space instance \param dy gradient of the output
   *  \param saved the input of the matching forward */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<T, MemorySpace> dy,
                       saved_type const& saved) const {
    // Compact: x is not a view, dy alone says how many rows.
    std::size_t const r = saved.compact ? output_positions(dy) : positions(saved.x, dy);
    auto const dyr = as_rows(dy, r, weight.extent(0));
    weight_product(exec, dyr, r, saved);
    if (use_bias_) {
      auto dy = dyr;
      detail::add_column_sums(
          "telar::Dense::backward_bias", exec, dy.extent(0), dy.extent(1),
          KOKKOS_LAMBDA(std::size_t i, std::size_t j) { return dy(i, j); }, bias_grad);
    }
  }

  Matrix<T, MemorySpace> weight;      //!< W [out, in]
  Matrix<T, MemorySpace> weight_grad; //!< dL/dW [out, in]
  Vector<T, MemorySpace> bias;        //!< b [out] (empty without bias)
  Vector<T, MemorySpace> bias_grad;   //!< dL/db [out]

protected:
  /*! \brief Allocates parameters of a (possibly sharded) shape. */
  void allocate(std::size_t rows, std::size_t cols, bool with_bias) {
    weight = Matrix<T, MemorySpace>("telar::Dense::weight", rows, cols);
    weight_grad = Matrix<T, MemorySpace>("telar::Dense::weight_grad", rows, cols);
    if (with_bias) {
      bias = Vector<T, MemorySpace>("telar::Dense::bias", rows);
      bias_grad = Vector<T, MemorySpace>("telar::Dense::bias_grad", rows);
    }
  }
  /*! \brief Draws the block of the full [out_, in_] W whose first row is
   *  \p row0 and first column \p col0 (a shard, or all of it), and the
   *  matching rows of b.
   *  \param seed stream seed \param row0 first global row \param col0 first global column */
  void fill_block(std::uint64_t seed, std::size_t row0, std::size_t col0) {
    detail::dense_fill_block(weight, bias, seed, in_, row0, col0);
  }
  /*! \brief Rows of the GEMM for an input-like x and an output-like y:
   *  samples times positions per sample ([n, p * in] against [n, p * out]). */
  template <class X, class Y>
  std::size_t positions(X const& x, Y const& y) const {
    std::size_t const in = weight.extent(1), out = weight.extent(0);
    std::size_t const p = in > 0 ? x.extent(1) / in : out > 0 ? y.extent(1) / out : 1;
    return x.extent(0) * p;
  }
  /*! \brief The same from an output-like y alone ([n, p * out]). */
  template <class Y>
  std::size_t output_positions(Y const& y) const {
    std::size_t const out = weight.extent(0);
    return y.extent(0) * (out > 0 ? y.extent(1) / out : 1);
  }
  /*! \brief Throws ShapeError unless x is [n, p * in] and y is [n, p * out]. */
  void check_shapes(char const* what, std::size_t xn, std::size_t xf, std::size_t yn,
                    std::size_t yf) const {
    std::size_t const in = weight.extent(1), out = weight.extent(0);
    std::size_t const p = in > 0 ? xf / in : out > 0 ? yf / out : 1;
    bool const ok = xf == p * in && yf == p * out && (in > 0 || out > 0);
    if (!ok || xn != yn)
      throw ShapeError(std::string("telar::Dense::") + what + ": expected [n, " +
                       std::to_string(weight.extent(1)) + "] -> [n, " +
                       std::to_string(weight.extent(0)) + "], got [" + std::to_string(xn) + ", " +
                       std::to_string(xf) + "] -> [" + std::to_string(yn) + ", " +
                       std::to_string(yf) + "]" +
                       (weight.extent(0) == 0 ? " (layer not initialised)" : ""));
  }

  template <class, class, class>
  friend class Dense; // the converting constructor reads another policy's layer

  /*! \brief yr = xr W^T + beta yr (x, xr: the input and its rows); keeps x
   *  as \p saved asks: a view, or (compact) the copy both products read. */
  template <class Exec, class XR, class YR>
  void forward_product(Exec const& exec, ConstMatrix<T, MemorySpace> x, XR const& xr, YR const& yr,
                       T beta, saved_type& saved) const {
    saved.x = saved.compact ? ConstMatrix<T, MemorySpace>() : x;
#if TELAR_HAVE_ONEDNN
    if constexpr (detail::onednn_bf16_v<Gemm, T, MemorySpace>)
      if (saved.compact) {
        bool const bf16 = detail::bf16_check_isa("telar::Dense (telar::Bf16Gemm)");
        saved.kept.keep(exec, xr, bf16);
        if (bf16) // the product reads the words just made: x converted once
          return detail::bf16_matmul(exec, 'N', 'T', T(1), xr, saved.kept.words(), weight, nullptr,
                                     beta, yr);
      }
#endif
    gemm(Gemm{}, exec, 'N', 'T', T(1), xr, weight, beta, yr);
  }

  /*! \brief dW += dy^T x, x the view or the compact copy (dW = dy^T x for
   *  the first product into gradients a step zeroed: core/detail/zeroed_grads.hpp). */
  template <class Exec, class DY>
  void weight_product(Exec const& exec, DY const& dyr, std::size_t r,
                      saved_type const& saved) const {
    T const beta = detail::zeroed_grads().take(weight_grad.data(), weight_grad.size() * sizeof(T))
                       ? T(0)
                       : T(1);
#if TELAR_HAVE_ONEDNN
    if constexpr (detail::onednn_bf16_v<Gemm, T, MemorySpace>)
      if (saved.compact) {
        if (saved.kept.rounded())
          return detail::bf16_matmul(exec, 'T', 'N', T(1), dyr, nullptr, saved.kept.shape(),
                                     saved.kept.words(), beta, weight_grad);
        return gemm(Gemm{}, exec, 'T', 'N', T(1), dyr, saved.kept.values(), beta, weight_grad);
      }
#endif
    gemm(Gemm{}, exec, 'T', 'N', T(1), dyr, as_rows(saved.x, r, weight.extent(1)), beta,
         weight_grad);
  }

  std::size_t in_ = 0;   //!< input features of the full layer
  std::size_t out_ = 0;  //!< output features of the full layer
  bool use_bias_ = true; //!< whether b is used
};

/*! \brief Dense with feature counts fixed at compile time, so telar::Sequential
 *  rejects a mismatch with its neighbours when the model type is formed.
 *  \tparam T value type \tparam In input features \tparam Out output features
 *  \tparam MemorySpace memory space \tparam Gemm GEMM policy */
template <class T, std::size_t In, std::size_t Out, class MemorySpace = DefaultMemorySpace,
          class Gemm = AutoGemm>
class StaticDense : public Dense<T, MemorySpace, Gemm> {
public:
  static constexpr Shape static_input_shape = Shape(In);   //!< input shape [In]
  static constexpr Shape static_output_shape = Shape(Out); //!< output shape [Out]
  /*! \brief With a bias; not explicit, so `{}` makes one inside a
   *  Sequential's constructor call. */
  StaticDense() : StaticDense(true) {}
  /*! \brief \param bias add a bias */
  explicit StaticDense(bool bias) : Dense<T, MemorySpace, Gemm>(In, Out, bias) {}
  /*! \brief The same layer under another GEMM policy (telar::Precision).
   *  \tparam G the other policy \param o the layer */
  template <class G, class = std::enable_if_t<!std::is_same_v<G, Gemm>>>
  explicit StaticDense(StaticDense<T, In, Out, MemorySpace, G> const& o)
      : Dense<T, MemorySpace, Gemm>(static_cast<Dense<T, MemorySpace, G> const&>(o)) {}
};

} // namespace telar
