#pragma once
/*! \file
 *  \brief telar::Softmax: a softmax over one axis of each sample, as an inner
 *  layer (attention weights, squeeze-excitation gates); the loss's final
 *  softmax is fused into telar::SoftmaxCrossEntropy instead.
 *  \code
 *  telar::Softmax<float> over_channels(0);   // [C, H, W]: softmax over C
 *  telar::Softmax<float> over_last;          // axis -1, the last one
 *  \endcode
 */
#include <telar/core/detail/elementwise.hpp>
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/detail/math.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>

namespace telar {

namespace detail {

// A row-major sample seen as [outer, len, inner]: the softmax runs along len,
// so line (o, i) starts at o * len * inner + i with stride inner.
struct SoftmaxLines {
  std::size_t outer = 1, len = 1, inner = 1;
  KOKKOS_INLINE_FUNCTION std::size_t start(std::size_t line) const {
    return (line / inner) * len * inner + line % inner;
  }
};

// y = exp(x - max) / sum exp(x - max) along every line of every sample.
template <class Exec, class X, class Y>
void softmax_lines_forward(Exec const& exec, SoftmaxLines const g, std::size_t samples, X const& x,
                           Y const& y) {
  using T = typename Y::non_const_value_type;
  Kokkos::parallel_for(
      "telar::Softmax::forward", Kokkos::RangePolicy<Exec>(exec, 0, samples * g.outer * g.inner),
      KOKKOS_LAMBDA(std::size_t line) {
        auto const* in = x.data() + g.start(line);
        T* out = y.data() + g.start(line);
        T m = in[0];
        for (std::size_t j = 1; j < g.len; ++j)
          m = detail::max(m, T(in[j * g.inner]));
        T sum = 0;
        for (std::size_t j = 0; j < g.len; ++j)
          sum += out[j * g.inner] = detail::exp(in[j * g.inner] - m);
        T const scale = T(1) / sum;
        for (std::size_t j = 0; j < g.len; ++j)
          out[j * g.inner] *= scale;
      });
}

// dx = y (dy - sum(dy y)) along every line.
template <class Exec, class DY, class Y, class DX>
void softmax_lines_backward(Exec const& exec, SoftmaxLines const g, std::size_t samples,
                            DY const& dy, Y const& y, DX const& dx) {
  using T = typename DX::non_const_value_type;
  Kokkos::parallel_for(
      "telar::Softmax::backward_input",
      Kokkos::RangePolicy<Exec>(exec, 0, samples * g.outer * g.inner),
      KOKKOS_LAMBDA(std::size_t line) {
        std::size_t const s = g.start(line);
        T dot = 0;
        for (std::size_t j = 0; j < g.len; ++j)
          dot += dy.data()[s + j * g.inner] * y.data()[s + j * g.inner];
        for (std::size_t j = 0; j < g.len; ++j)
          dx.data()[s + j * g.inner] =
              y.data()[s + j * g.inner] * (dy.data()[s + j * g.inner] - dot);
      });
}

} // namespace detail

/*! \brief Softmax over one axis of samples of rank 1 to 4; keeps its output
 *  (a view) for backward.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
class Softmax : public detail::ShapePreservingLayerTypes<T, MemorySpace> {
public:
  /*! \brief Backward reads the output (the saved view), never the input. */
  static constexpr BackwardReads backward_reads = BackwardReads::output;
  /*! \brief The output y, backward's only need. */
  struct saved_type {
    ConstMatrix<T, MemorySpace> y; //!< [n, shape.size()]
  };

  /*! \brief \param axis the axis of the sample (batch excluded, as PyTorch's
   *  dim - 1); negative counts from the last, -1 is the last */
  explicit Softmax(int axis = -1) : axis_(axis) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "Softmax"; }
  /*! \brief The axis as given at construction. */
  int axis() const { return axis_; }
  /*! \brief The input shape. \param in input shape
   *  \throws ShapeError for an unknown shape or an axis outside it */
  Shape output_shape(Shape const& in) const {
    (void)lines(in);
    return in;
  }
  /*! \brief Remembers how the axis splits the input. \param in input shape */
  void build(Shape const& in) {
    g_ = lines(in);
    built_ = true;
  }
  /*! \brief Max, exp, sum and scale per element. \param samples batch size \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    return 5.0 * double(samples) * double(in.size());
  }
  /*! \brief 0: the output is kept as a view. */
  std::size_t saved_bytes(std::size_t, Shape const&) const { return 0; }
  /*! \brief y = softmax(x) along the axis. \param exec execution space instance
   *  \param x input [n, size] \param y output [n, size] \param saved keeps y */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type& saved) const {
    check("forward", x.extent(0), x.extent(1), y.extent(0), y.extent(1));
    detail::softmax_lines_forward(exec, g_, x.extent(0), detail::flat(x, "telar::Softmax::forward"),
                                  detail::flat(y, "telar::Softmax::forward"));
    saved.y = y;
  }
  /*! \brief dx = y (dy - sum(dy y)) along the axis. \param exec execution space instance
   *  \param dy gradient of the output \param dx gradient of the input \param saved y */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      saved_type const& saved) const {
    check("backward_input", dx.extent(0), dx.extent(1), dy.extent(0), dy.extent(1));
    char const* api = "telar::Softmax::backward_input";
    detail::softmax_lines_backward(exec, g_, dy.extent(0), detail::flat(dy, api),
                                   detail::flat(saved.y, api), detail::flat(dx, api));
  }

private:
  detail::SoftmaxLines lines(Shape const& in) const {
    if (!in.known() || in.size() == 0)
      throw ShapeError("Softmax expects a known, non-empty input shape of rank 1 to 4, got " +
                       in.str());
    int const a = axis_ < 0 ? axis_ + in.rank : axis_;
    if (a < 0 || a >= in.rank)
      throw ShapeError("Softmax: axis " + std::to_string(axis_) + " is outside input " + in.str() +
                       " (expected -" + std::to_string(in.rank) + " to " +
                       std::to_string(in.rank - 1) + ", the batch excluded)");
    detail::SoftmaxLines g;
    for (int i = 0; i < a; ++i)
      g.outer *= in[i];
    g.len = in[a];
    for (int i = a + 1; i < in.rank; ++i)
      g.inner *= in[i];
    return g;
  }
  void check(char const* what, std::size_t xn, std::size_t xf, std::size_t yn,
             std::size_t yf) const {
    std::size_t const size = g_.outer * g_.len * g_.inner;
    detail::check_layer_call("Softmax", what, built_, size, size, xn, xf, yn, yf);
  }

  int axis_ = -1;
  detail::SoftmaxLines g_{};
  bool built_ = false;
};

} // namespace telar
