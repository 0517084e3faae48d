#pragma once
/*! \file
 *  \brief telar::Identity: y = x, the skip branch of the joins in
 *  telar/core/branches.hpp and of telar::Residual. */
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace telar {

/*! \brief y = x (PyTorch's nn.Identity). No parameters, no saved state.
 *
 *  As a branch of a join (telar::Add, telar::Mul, telar::Concat) or the
 *  shortcut of telar::Residual, the block reads x itself instead of running
 *  the copy, so it costs nothing there.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct Identity : public detail::ShapePreservingLayerTypes<T, MemorySpace> {
  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "Identity"; }
  /*! \brief \p in itself. \param in input shape */
  Shape output_shape(Shape const& in) const { return in; }
  /*! \brief No arithmetic. */
  double flops(std::size_t, Shape const&) const { return 0; }
  /*! \brief y = x. \param exec execution space instance \param x input \param y output */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               NoSaved&) const {
    Kokkos::deep_copy(exec, y, x);
  }
  /*! \brief dx = dy. \param exec execution space instance \param dy output gradient
   *  \param dx input gradient */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      NoSaved const&) const {
    Kokkos::deep_copy(exec, dx, dy);
  }
};

namespace detail {
template <class L>
inline constexpr bool is_identity_v = false;
template <class T, class M>
inline constexpr bool is_identity_v<Identity<T, M>> = true;
} // namespace detail

} // namespace telar
