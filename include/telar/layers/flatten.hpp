#pragma once
/*! \file
 *  \brief telar::Flatten: [C, H, W] (any shape) -> [C * H * W].
 *
 *  A batch is already stored as [n, shape.size()], so flattening changes only
 *  the shape the next layer sees; the values are copied unless the two
 *  buffers are the same. */
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <string>

namespace telar {

/*! \brief Flattens each sample to rank 1: [d0, ..., dk] -> [d0 * ... * dk].
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct Flatten : public detail::LayerTypes<T, MemorySpace> {
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "Flatten"; }
  /*! \brief [in.size()]. \param in input shape \throws ShapeError for an unknown shape */
  Shape output_shape(Shape const& in) const {
    if (!in.known())
      throw ShapeError("Flatten expects a known input shape of rank 1 to 4, got " + in.str());
    return Shape(in.size());
  }
  /*! \brief No arithmetic. */
  double flops(std::size_t, Shape const&) const { return 0; }
  /*! \brief y = x. \param exec execution space instance \param x input \param y output */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               NoSaved&) const {
    copy(exec, x, y, "forward");
  }
  /*! \brief dx = dy. \param exec execution space instance
   *  \param dy gradient of the output \param dx gradient of the input */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      NoSaved const&) const {
    copy(exec, dy, dx, "backward_input");
  }

private:
  template <class Exec>
  static void copy(Exec const& exec, ConstMatrix<T, MemorySpace> const& from,
                   Matrix<T, MemorySpace> const& to, char const* what) {
    if (from.extent(0) != to.extent(0) || from.extent(1) != to.extent(1))
      throw ShapeError(std::string("telar::Flatten::") + what + ": sizes differ ([" +
                       std::to_string(from.extent(0)) + ", " + std::to_string(from.extent(1)) +
                       "] -> [" + std::to_string(to.extent(0)) + ", " +
                       std::to_string(to.extent(1)) + "])");
    if (from.data() != to.data())
      Kokkos::deep_copy(exec, to, from);
  }
};

} // namespace telar
