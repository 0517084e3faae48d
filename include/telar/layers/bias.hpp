#pragma once
/*! \file
 *  \brief telar::Bias: a trainable table added to (or subtracted from) every
 *  sample, broadcast as NumPy and ONNX broadcast (an imported ONNX Add or
 *  Sub of a tensor and a constant: `x + self.bias`, `x - self.shift`). */
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

/*! \brief y = s_x x + s_b b, b a trainable table broadcast over each sample
 *  (its axes right-aligned with the sample's, each extent equal or 1: [C, 1,
 *  1] per channel of [C, H, W], [W] along its last axis, [1] one value).
 *  The signs give x + b (1, 1), x - b (1, -1) and b - x (-1, 1).
 *  Backward: dx = s_x dy; db = s_b times the sum of dy over the samples and
 *  the positions reading each entry, in order (deterministic). Parameter
 *  "bias" (the table, row-major) starts at zero. A fixed table (\p trained
 *  false: an ONNX Constant node, a literal in PyTorch's forward) is the
 *  buffer "bias" instead: checkpointed and exported, never updated.
 *  \code
 *  telar::Bias<float> b(Shape{8, 4, 4}, Shape{8, 1, 1}); // one value per channel
 *  \endcode
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
class Bias : public detail::BroadcastTable<Bias<T, MemorySpace>, T, MemorySpace> {
  using Base = detail::BroadcastTable<Bias, T, MemorySpace>;
  using Base::in_;
  using Base::index_;
  using Base::table_;
  using Base::trained_;

public:
  /*! \brief An empty layer; assign a configured one before use. */
  Bias() = default;
  /*! \brief \param in the sample shape \param table the table's shape
   *  \param bias_sign s_b \param input_sign s_x \param trained whether the
   *  table is a parameter (else a buffer)
   *  \throws ShapeError naming both shapes when the table does not broadcast */
  Bias(Shape const& in, Shape const& table, T bias_sign = T(1), T input_sign = T(1),
       bool trained = true)
      : Base(in, table, trained), sb_(bias_sign), sx_(input_sign) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "Bias"; }
  /*! \brief Allocates the table, zero (no seed: nothing is drawn). */
  void initialize(std::uint64_t /*seed*/) {
    bias = Vector<T, MemorySpace>("telar::Bias::bias", table_.size());
    if (trained_)
      bias_grad = Vector<T, MemorySpace>("telar::Bias::bias_grad", table_.size());
  }
  /*! \brief Visits ("bias", table) when trained.
   *  \param f callable as f(char const*, View&, View&) */
  template <class F>
  void parameters(F&& f) {
    if (trained_)
      f("bias", bias, bias_grad);
  }
  /*! \brief Visits ("bias", table) when fixed. \param f callable as f(char const*, View&) */
  template <class F>
  void buffers(F&& f) {
    if (!trained_)
      f("bias", bias);
  }

  /*! \brief y = s_x x + s_b b. \param exec execution space instance
   *  \param x input \param y output */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               NoSaved&) const {
    check("forward", x, y);
    auto const b = bias;
    auto const ix = index_;
    T const sb = sb_, sx = sx_;
    Kokkos::parallel_for(
        "telar::Bias::forward",
        Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {y.extent(0), y.extent(1)}),
        KOKKOS_LAMBDA(std::size_t n, std::size_t e) {
          y(n, e) = sx * x(n, e) + sb * b(ix.entry(e));
        });
  }
  /*! \brief dx = s_x dy. \param exec execution space instance
   *  \param dy gradient of the output \param dx gradient of the input */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      NoSaved const&) const {
    check("backward_input", dy, dx);
    T const sx = sx_;
    Kokkos::parallel_for(
        "telar::Bias::backward_input",
        Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {dx.extent(0), dx.extent(1)}),
        KOKKOS_LAMBDA(std::size_t n, std::size_t e) { dx(n, e) = sx * dy(n, e); });
  }
  /*! \brief db += s_b times dy summed over the samples and each entry's
   *  positions (nothing for a fixed table). \param exec execution space
   *  instance \param dy output gradient */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<T, MemorySpace> dy, NoSaved const&) const {
    check("backward_weight", dy, dy);
    if (!trained_)
      return;
    std::size_t const repeats = in_.size() / table_.size();
    T const sb = sb_;
    detail::broadcast_sum(
        exec, "telar::Bias::backward_weight", index_, dy.extent(0), repeats, bias_grad,
        KOKKOS_LAMBDA(std::size_t n, std::size_t e) { return dy(n, e); },
        KOKKOS_LAMBDA(std::size_t, T s) { return sb * s; });
  }

  Vector<T, MemorySpace> bias;      //!< the table, row-major
  Vector<T, MemorySpace> bias_grad; //!< dL/dtable (empty for a fixed table)

private:
  template <class A, class B>
  void check(char const* what, A const& a, B const& b) const {
    Base::check(what, a, b, bias.extent(0));
  }

  T sb_ = T(1), sx_ = T(1);
};

} // namespace telar
