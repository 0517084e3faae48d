#pragma once
/*! \file
 *  \brief telar::Rearrange: moves the values of each sample without
 *  arithmetic (a transpose of its axes, a slice of one axis, a reshape), the
 *  shape-only nodes of an imported graph (ONNX Transpose, Slice, Reshape). */
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace telar {

/*! \brief y(n, j) = x(n, source(j)) for a fixed one-to-one map of each
 *  sample's positions, built once from the input shape: the batch axis never
 *  moves. Backward scatters dy back (positions a slice drops get 0).
 *  \code
 *  auto t = telar::Rearrange<float>::transpose(Shape{6, 4, 8}, {1, 0, 2}); // [4, 6, 8]
 *  auto s = telar::Rearrange<float>::slice(Shape{6, 96}, 1, 32, 64);        // [6, 32]
 *  \endcode
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
class Rearrange : public detail::LayerTypes<T, MemorySpace> {
public:
  /*! \brief An empty layer; assign one made by a factory before use. */
  Rearrange() = default;

  /*! \brief Axes of \p in permuted: output axis d is input axis perm[d].
   *  \throws ShapeError unless perm is a permutation of in's axes */
  static Rearrange transpose(Shape const& in, std::vector<int> const& perm) {
    if (!in.known() || int(perm.size()) != in.rank)
      throw ShapeError("telar::Rearrange::transpose: " + std::to_string(perm.size()) +
                       " axes for an input " + in.str());
    Shape out = in;
    std::vector<bool> seen(perm.size(), false);
    for (std::size_t d = 0; d < perm.size(); ++d) {
      if (perm[d] < 0 || perm[d] >= in.rank || seen[std::size_t(perm[d])])
        throw ShapeError("telar::Rearrange::transpose: the axes are not a permutation of " +
                         in.str());
      seen[std::size_t(perm[d])] = true;
      out.dims[d] = in[perm[d]];
    }
    auto const is = strides(in);
    return Rearrange(in, out, [&](std::array<std::size_t, Shape::max_rank> const& o) {
      std::size_t k = 0;
      for (std::size_t d = 0; d < perm.size(); ++d)
        k += o[d] * is[std::size_t(perm[d])];
      return k;
    });
  }
  /*! \brief Positions [begin, end) of axis \p axis of \p in.
   *  \throws ShapeError for an empty or out-of-range slice */
  static Rearrange slice(Shape const& in, int axis, std::size_t begin, std::size_t end) {
    if (!in.known() || axis < 0 || axis >= in.rank || begin >= end || end > in[axis])
      throw ShapeError("telar::Rearrange::slice: [" + std::to_string(begin) + ", " +
                       std::to_string(end) + ") of axis " + std::to_string(axis) + " of " +
                       in.str());
    Shape out = in;
    out.dims[std::size_t(axis)] = end - begin;
    auto const is = strides(in);
    return Rearrange(in, out, [&](std::array<std::size_t, Shape::max_rank> const& o) {
      std::size_t k = 0;
      for (int d = 0; d < in.rank; ++d)
        k += (o[std::size_t(d)] + (d == axis ? begin : 0)) * is[std::size_t(d)];
      return k;
    });
  }
  /*! \brief The same values read as \p out (equal sizes).
   *  \throws ShapeError when the sizes differ */
  static Rearrange reshape(Shape const& in, Shape const& out) {
    if (!in.known() || !out.known() || in.size() != out.size())
      throw ShapeError("telar::Rearrange::reshape: " + in.str() + " and " + out.str() +
                       " differ in size");
    auto const os = strides(out);
    return Rearrange(in, out, [&](std::array<std::size_t, Shape::max_rank> const& o) {
      std::size_t k = 0;
      for (int d = 0; d < out.rank; ++d)
        k += o[std::size_t(d)] * os[std::size_t(d)];
      return k;
    });
  }

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "Rearrange"; }
  /*! \brief The shape the factory computed. \param in the shape it was made for
   *  \throws ShapeError for another input shape */
  Shape output_shape(Shape const& in) const {
    if (in != in_)
      throw ShapeError("telar::Rearrange expects inputs " + in_.str() + ", got " + in.str());
    return out_;
  }
  /*! \brief No arithmetic: values only move. */
  double flops(std::size_t, Shape const&) const { return 0; }
  /*! \brief y(n, j) = x(n, source(j)). \param exec execution space instance
   *  \param x input \param y output */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               NoSaved&) const {
    check("forward", x, y, in_.size(), out_.size());
    auto const src = source_;
    Kokkos::parallel_for(
        "telar::Rearrange::forward",
        Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {y.extent(0), y.extent(1)}),
        KOKKOS_LAMBDA(std::size_t n, std::size_t j) { y(n, j) = x(n, src(j)); });
  }
  /*! \brief dx(n, source(j)) = dy(n, j), 0 elsewhere. \param exec execution
   *  space instance \param dy gradient of the output \param dx gradient of the input */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      NoSaved const&) const {
    check("backward_input", dy, dx, out_.size(), in_.size());
    if (out_.size() != in_.size()) // a slice: the dropped positions get no gradient
      Kokkos::deep_copy(exec, dx, T(0));
    auto const src = source_;
    Kokkos::parallel_for(
        "telar::Rearrange::backward_input",
        Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {dy.extent(0), dy.extent(1)}),
        KOKKOS_LAMBDA(std::size_t n, std::size_t j) { dx(n, src(j)) = dy(n, j); });
  }

private:
  using Index = Kokkos::View<std::size_t*, MemorySpace>;

  static std::array<std::size_t, Shape::max_rank> strides(Shape const& s) {
    std::array<std::size_t, Shape::max_rank> st{};
    std::size_t k = 1;
    for (int d = s.rank - 1; d >= 0; --d)
      st[std::size_t(d)] = k, k *= s[d];
    return st;
  }
  // Tabulates source(output position) once, on the host.
  template <class F>
  Rearrange(Shape const& in, Shape const& out, F&& source)
      : in_(in), out_(out), source_("telar::Rearrange::source", out.size()) {
    auto h = Kokkos::create_mirror_view(source_);
    std::array<std::size_t, Shape::max_rank> o{};
    for (std::size_t j = 0; j < out.size(); ++j) {
      h(j) = source(o);
      for (int d = out.rank - 1; d >= 0; --d) { // odometer over the output's axes
        if (++o[std::size_t(d)] < out[d])
          break;
        o[std::size_t(d)] = 0;
      }
    }
    Kokkos::deep_copy(source_, h);
  }
  template <class A, class B>
  static void check(char const* what, A const& a, B const& b, std::size_t wa, std::size_t wb) {
    if (a.extent(0) != b.extent(0) || a.extent(1) != wa || b.extent(1) != wb)
      throw ShapeError(std::string("telar::Rearrange::") + what + ": expected [n, " +
                       std::to_string(wa) + "] -> [n, " + std::to_string(wb) + "], got [" +
                       std::to_string(a.extent(0)) + ", " + std::to_string(a.extent(1)) + "] -> [" +
                       std::to_string(b.extent(0)) + ", " + std::to_string(b.extent(1)) + "]");
  }

  Shape in_, out_;
  Index source_;
};

} // namespace telar
