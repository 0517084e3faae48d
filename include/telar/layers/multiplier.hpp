#pragma once
/*! \file
 *  \brief telar::Multiplier: every sample multiplied (or divided) by a
 *  trainable table broadcast as NumPy and ONNX broadcast (an imported ONNX Mul
 *  or Div of a tensor by a constant tensor: `x * self.gamma`, `x / self.std`),
 *  the multiplying sibling of telar::Bias. */
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/detail/broadcast_table.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace telar {

/*! \brief y = x * w, or y = x / w (\p divide), w a trainable table broadcast
 *  over each sample (its axes right-aligned with the sample's, each extent
 *  equal or 1: [C, 1, 1] per channel of [C, H, W], [W] along the last axis).
 *  A divisor is kept as the divisor, not its reciprocal, so that it trains as
 *  PyTorch trains `x / p` and goes back to ONNX unchanged in meaning.
 *  Backward: dx = dy w (dy / w); dw = the sum of dy x (-dy x / w^2) over the
 *  samples and the positions reading each entry, in order (deterministic).
 *  Parameter "weight" (the table, row-major) starts at one. A fixed table
 *  (\p trained false: an ONNX Constant node, a literal in PyTorch's forward)
 *  is the buffer "weight" instead: checkpointed and exported, never updated.
 *  \code
 *  telar::Multiplier<float> m(Shape{8, 4, 4}, Shape{8, 1, 1}); // one factor per channel
 *  \endcode
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
class Multiplier : public detail::BroadcastTable<Multiplier<T, MemorySpace>, T, MemorySpace> {
  using Base = detail::BroadcastTable<Multiplier, T, MemorySpace>;
  using Base::in_;
  using Base::index_;
  using Base::table_;
  using Base::trained_;

public:
  /*! \brief Backward reads the input (the saved view), never the output. */
  static constexpr BackwardReads backward_reads = BackwardReads::input;
  /*! \brief The input, a view kept for the table's gradient. */
  struct saved_type {
    ConstMatrix<T, MemorySpace> x; //!< the forward's input
  };

  /*! \brief An empty layer; assign a configured one before use. */
  Multiplier() = default;
  /*! \brief \param in the sample shape \param table the table's shape
   *  \param divide y = x / w rather than x * w \param trained whether the
   *  table is a parameter (else a buffer)
   *  \throws ShapeError naming both shapes when the table does not broadcast */
  Multiplier(Shape const& in, Shape const& table, bool divide = false, bool trained = true)
      : Base(in, table, trained), divide_(divide) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "Multiplier"; }
  /*! \brief Whether the layer divides by its table. */
  bool divides() const { return divide_; }
  /*! \brief Nothing allocated per micro-batch: the input is kept as a view. */
  std::size_t saved_bytes(std::size_t, Shape const&) const { return 0; }

  /*! \brief Allocates the table, one (no seed: nothing is drawn). */
  void initialize(std::uint64_t /*seed*/) {
    weight = Vector<T, MemorySpace>("telar::Multiplier::weight", table_.size());
    if (trained_)
      weight_grad = Vector<T, MemorySpace>("telar::Multiplier::weight_grad", table_.size());
    Kokkos::deep_copy(weight, T(1));
  }
  /*! \brief Visits ("weight", table) when trained.
   *  \param f callable as f(char const*, View&, View&) */
  template <class F>
  void parameters(F&& f) {
    if (trained_)
      f("weight", weight, weight_grad);
  }
  /*! \brief Visits ("weight", table) when fixed. \param f callable as f(char const*, View&) */
  template <class F>
  void buffers(F&& f) {
    if (!trained_)
      f("weight", weight);
  }

  /*! \brief y = x w (x / w). \param exec execution space instance
   *  \param x input \param y output \param saved keeps x */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type& saved) const {
    check("forward", x, y);
    scaled(exec, "telar::Multiplier::forward", x, y);
    saved.x = x;
  }
  /*! \brief dx = dy w (dy / w). \param exec execution space instance
   *  \param dy gradient of the output \param dx gradient of the input */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      saved_type const&) const {
    check("backward_input", dy, dx);
    scaled(exec, "telar::Multiplier::backward_input", dy, dx);
  }
  /*! \brief dw += dy x (-dy x / w^2) summed over the samples and each entry's
   *  positions (nothing for a fixed table). \param exec execution space
   *  instance \param dy output gradient \param saved the forward's input */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<T, MemorySpace> dy,
                       saved_type const& saved) const {
    check("backward_weight", dy, saved.x);
    if (!trained_)
      return;
    auto const x = saved.x;
    auto const w = weight;
    bool const div = divide_;
    detail::broadcast_sum(
        exec, "telar::Multiplier::backward_weight", index_, dy.extent(0),
        in_.size() / table_.size(), weight_grad,
        KOKKOS_LAMBDA(std::size_t n, std::size_t e) { return dy(n, e) * x(n, e); },
        KOKKOS_LAMBDA(std::size_t t, T s) { return div ? -s / (w(t) * w(t)) : s; });
  }

  Vector<T, MemorySpace> weight;      //!< the table, row-major
  Vector<T, MemorySpace> weight_grad; //!< dL/dtable (empty for a fixed table)

  // Public only because nvcc refuses an extended lambda (KOKKOS_LAMBDA) in a
  // private or protected member function; not part of the interface.
  /// \cond TELAR_INTERNAL
  // b = a w, or a / w: the forward and the input gradient alike.
  template <class Exec>
  void scaled(Exec const& exec, char const* label, ConstMatrix<T, MemorySpace> a,
              Matrix<T, MemorySpace> b) const {
    auto const w = weight;
    auto const ix = index_;
    bool const div = divide_;
    Kokkos::parallel_for(
        label,
        Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {b.extent(0), b.extent(1)}),
        KOKKOS_LAMBDA(std::size_t n, std::size_t e) {
          T const f = w(ix.entry(e));
          b(n, e) = div ? a(n, e) / f : a(n, e) * f;
        });
  }
  /// \endcond

private:
  template <class A, class B>
  void check(char const* what, A const& a, B const& b) const {
    Base::check(what, a, b, weight.extent(0));
  }

  bool divide_ = false;
};

} // namespace telar
