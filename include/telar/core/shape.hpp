#pragma once
/*! \file
 *  \brief telar::Shape, the per-sample shape of an activation, and views that
 *  index a batch of samples by their natural indices.
 *
 *  Between layers, a batch is stored as a row-major matrix [samples,
 *  shape.size()] (so pipeline messages, gradient buckets and sharding see one
 *  contiguous block per sample); a layer reads it as [n, C, H, W] with
 *  telar::as_tensor:
 *  \code
 *  auto xi = telar::as_tensor<3>(x, in_shape);   // View<const T****>: xi(n, c, h, w)
 *  \endcode
 */
#include <Kokkos_Core.hpp>
#include <telar/core/detail/decl.hpp>

#include <array>
#include <cstddef>
#include <initializer_list>
#include <string>

namespace telar {

/*! \brief Per-sample shape of rank 1 to 4: features; sequence x hidden;
 *  channels x height x width; channels x depth x height x width. Rank 0 means
 *  "not known" (a layer that accepts any shape). */
struct Shape {
  /*! \brief The largest rank. */
  static constexpr int max_rank = 4;

  int rank = 0;                             //!< number of dimensions (0: unknown)
  std::array<std::size_t, max_rank> dims{}; //!< extents, outermost first

  /*! \brief Unknown shape. */
  constexpr Shape() = default;
  /*! \brief Rank 1: \p features. Implicit, so a feature count reads as a shape. */
  constexpr Shape(std::size_t features) : rank(1), dims{features, 0, 0, 0} {}
  /*! \brief Extents outermost first, e.g. Shape{1, 28, 28}. \param d 1 to 4 extents */
  constexpr Shape(std::initializer_list<std::size_t> d) : rank(int(d.size())), dims{} {
    int i = 0;
    for (std::size_t v : d)
      if (i < max_rank)
        dims[std::size_t(i++)] = v;
    if (rank > max_rank)
      rank = max_rank + 1; // rejected by valid()
  }

  /*! \brief Extent \p i. */
  constexpr std::size_t operator[](int i) const { return dims[std::size_t(i)]; }
  /*! \brief Elements per sample (product of the extents; 0 if unknown). */
  constexpr std::size_t size() const {
    if (rank <= 0)
      return 0;
    std::size_t s = 1;
    for (int i = 0; i < rank && i < max_rank; ++i)
      s *= dims[std::size_t(i)];
    return s;
  }
  /*! \brief The last extent (features, hidden size, width). */
  constexpr std::size_t back() const { return rank > 0 ? dims[std::size_t(rank - 1)] : 0; }
  /*! \brief True for a known shape of rank 1 to 4. */
  constexpr bool known() const { return rank >= 1 && rank <= max_rank; }
  /*! \brief The same shape with the last extent replaced. \param last new last extent */
  constexpr Shape with_back(std::size_t last) const {
    Shape s = *this;
    if (s.rank > 0)
      s.dims[std::size_t(s.rank - 1)] = last;
    return s;
  }

  /*! \brief Equal rank and extents. */
  friend constexpr bool operator==(Shape const& a, Shape const& b) {
    if (a.rank != b.rank)
      return false;
    for (int i = 0; i < a.rank && i < max_rank; ++i)
      if (a.dims[std::size_t(i)] != b.dims[std::size_t(i)])
        return false;
    return true;
  }
  /*! \brief Not equal. */
  friend constexpr bool operator!=(Shape const& a, Shape const& b) { return !(a == b); }

  /*! \brief "[1, 28, 28]", or "[?]" when unknown. */
  TELAR_DECL std::string str() const;
};

namespace detail {
// A layer call's checks, one message for every built-in: build() ran, and x
// [xn, xf] -> y [yn, yf] is [n, in] -> [n, out]. The message names
// "telar::<layer>::<what>" ("telar::Softmax::forward"), built only on a
// failure: the check runs at every call of a training step.
TELAR_DECL void check_layer_call(char const* layer, char const* what, bool built, std::size_t in,
                                 std::size_t out, std::size_t xn, std::size_t xf, std::size_t yn,
                                 std::size_t yf);

template <class T, int Rank>
struct add_pointers {
  using type = typename add_pointers<T*, Rank - 1>::type;
};
template <class T>
struct add_pointers<T, 0> {
  using type = T;
};
} // namespace detail

/*! \brief A batch stored as [n, shape.size()] seen as [n, d0, ..., d(R-1)],
 *  without copying (an unmanaged view: keep the original alive).
 *  \tparam R the sample rank (1 to 4; must equal shape.rank)
 *  \param m the batch, row-major [n, shape.size()] \param shape per-sample shape */
template <int R, class T, class... P>
auto as_tensor(Kokkos::View<T**, P...> const& m, Shape const& shape) {
  static_assert(R >= 1 && R <= Shape::max_rank, "telar::as_tensor: sample rank must be 1 to 4");
  using V = Kokkos::View<T**, P...>;
  using Out = Kokkos::View<typename detail::add_pointers<T, R + 1>::type, Kokkos::LayoutRight,
                           typename V::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  std::size_t const n = m.extent(0);
  auto* p = m.data();
  if constexpr (R == 1)
    return Out(p, n, shape[0]);
  else if constexpr (R == 2)
    return Out(p, n, shape[0], shape[1]);
  else if constexpr (R == 3)
    return Out(p, n, shape[0], shape[1], shape[2]);
  else
    return Out(p, n, shape[0], shape[1], shape[2], shape[3]);
}

/*! \brief A contiguous [n, k] batch seen as [rows, cols] (rows * cols = n * k):
 *  e.g. the positions of [sequence, hidden] samples as rows of a matrix, for
 *  position-wise layers. \param m the batch \param rows new rows \param cols new columns */
template <class T, class... P>
auto as_rows(Kokkos::View<T**, P...> const& m, std::size_t rows, std::size_t cols) {
  using V = Kokkos::View<T**, P...>;
  using Out = Kokkos::View<T**, Kokkos::LayoutRight, typename V::memory_space,
                           Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  return Out(m.data(), rows, cols);
}

} // namespace telar

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/core/shape.ipp>
#endif
