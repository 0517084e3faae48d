#pragma once
/*! \file
 *  \brief telar::MaskedFill: a constant replaces the values a fixed mask
 *  marks (PyTorch's masked_fill with a constant mask, an imported ONNX
 *  Where: a GPT's causal mask before its softmax). */
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace telar {

/*! \brief y(n, j) = value where mask(j % m) is set, x(n, j) elsewhere: the
 *  mask covers the last axes of each sample (m values) and repeats over the
 *  axes before them (the heads of attention scores [heads, seq, seq] under a
 *  [seq, seq] mask). Backward: dx = dy where the mask is clear, 0 where set.
 *  The value may be -infinity (a softmax after it then gives those entries 0).
 *  \code
 *  std::vector<bool> causal(16 * 16);   // j > i set
 *  telar::MaskedFill<float> f(Shape{4, 16, 16}, causal, -INFINITY);
 *  \endcode
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
class MaskedFill : public detail::LayerTypes<T, MemorySpace> {
public:
  /*! \brief An empty layer; assign a configured one before use. */
  MaskedFill() = default;
  /*! \brief \param in the sample shape \param mask the mask of its last axes,
   *  row-major (its size divides in.size()) \param value what masked entries become
   *  \throws ShapeError when the mask's size does not divide the sample's */
  MaskedFill(Shape const& in, std::vector<bool> const& mask, T value)
      : in_(in), value_(value), mask_("telar::MaskedFill::mask", mask.size()) {
    if (!in.known() || mask.empty() || in.size() % mask.size() != 0)
      throw ShapeError("telar::MaskedFill: a mask of " + std::to_string(mask.size()) +
                       " values does not tile samples " + in.str());
    auto h = Kokkos::create_mirror_view(mask_);
    for (std::size_t j = 0; j < mask.size(); ++j)
      h(j) = mask[j] ? 1 : 0;
    Kokkos::deep_copy(mask_, h);
  }

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "MaskedFill"; }
  /*! \brief The input shape. \param in the shape it was made for
   *  \throws ShapeError for another input shape */
  Shape output_shape(Shape const& in) const {
    if (in != in_)
      throw ShapeError("telar::MaskedFill expects inputs " + in_.str() + ", got " + in.str());
    return in;
  }
  /*! \brief The fill value. */
  T value() const { return value_; }
  /*! \brief One select per value. */
  double flops(std::size_t samples, Shape const& in) const { return double(samples) * in.size(); }
  /*! \brief y = mask ? value : x. \param exec execution space instance
   *  \param x input \param y output */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               NoSaved&) const {
    check("forward", x, y);
    auto const mask = mask_;
    std::size_t const m = mask_.extent(0);
    T const v = value_;
    Kokkos::parallel_for(
        "telar::MaskedFill::forward",
        Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {y.extent(0), y.extent(1)}),
        KOKKOS_LAMBDA(std::size_t n, std::size_t j) { y(n, j) = mask(j % m) ? v : x(n, j); });
  }
  /*! \brief dx = mask ? 0 : dy. \param exec execution space instance
   *  \param dy gradient of the output \param dx gradient of the input */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      NoSaved const&) const {
    check("backward_input", dy, dx);
    auto const mask = mask_;
    std::size_t const m = mask_.extent(0);
    Kokkos::parallel_for(
        "telar::MaskedFill::backward_input",
        Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {dx.extent(0), dx.extent(1)}),
        KOKKOS_LAMBDA(std::size_t n, std::size_t j) { dx(n, j) = mask(j % m) ? T(0) : dy(n, j); });
  }

private:
  template <class A, class B>
  void check(char const* what, A const& a, B const& b) const {
    if (a.extent(0) != b.extent(0) || a.extent(1) != in_.size() || b.extent(1) != in_.size())
      throw ShapeError(std::string("telar::MaskedFill::") + what + ": expected [n, " +
                       std::to_string(in_.size()) + "], got [" + std::to_string(a.extent(0)) +
                       ", " + std::to_string(a.extent(1)) + "] -> [" + std::to_string(b.extent(0)) +
                       ", " + std::to_string(b.extent(1)) + "]");
  }

  Shape in_;
  T value_ = T(0);
  Kokkos::View<unsigned char*, MemorySpace> mask_;
};

} // namespace telar
