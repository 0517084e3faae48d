#pragma once
/*! \file
 *  \brief How spatial parallelism splits a sample: an extent over sp parts
 *  (telar::split_extent), and per rank the rows a convolution reads, its
 *  padding at the volume's faces and its halo (telar::conv_slab). Plain
 *  integers, no MPI: a slab reader, the run layout and the memory plan can
 *  compute them for any rank.
 *
 *  Every activation is split along its first spatial axis (depth in 3-D,
 *  height in 2-D) by the same rule, so a layer's output slabs are the next
 *  layer's input slabs. See docs/spatial.md.
 */
#include <telar/comm/halo_plan.hpp>
#include <telar/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <string>

namespace telar {

/*! \brief Rows [begin, end) of a split axis. */
struct Slab {
  std::size_t begin = 0; //!< first row
  std::size_t end = 0;   //!< one past the last row
  /*! \brief Rows in the slab. */
  std::size_t size() const { return end - begin; }
};

/*! \brief Part \p part of \p extent rows split over \p parts: the first
 *  `extent % parts` parts get one row more than the others (an uneven split
 *  differs by at most one row). \param extent rows \param parts sp
 *  \param part rank in the spatial group, 0 <= part < parts */
inline Slab split_extent(std::size_t extent, int parts, int part) {
  std::size_t const P = std::size_t(parts), p = std::size_t(part);
  std::size_t const base = extent / P, extra = extent % P;
  std::size_t const begin = p * base + std::min(p, extra);
  return {begin, begin + base + (p < extra ? 1 : 0)};
}

/*! \brief Kernel, stride, zero padding and dilation of a convolution along
 *  the split axis. */
struct ConvAxis {
  std::size_t kernel = 1;   //!< kernel extent
  std::size_t stride = 1;   //!< stride
  std::size_t padding = 0;  //!< zero padding on each face of the volume
  std::size_t dilation = 1; //!< dilation
};

/*! \brief What one rank of a split convolution reads: global input rows
 *  [begin, end), with `pad_front` zero rows before them (at the volume's
 *  first face) and `pad_back` after (at its last face); a slab reader reads
 *  exactly these rows. */
struct SlabWindow {
  std::size_t begin = 0;     //!< first input row read
  std::size_t end = 0;       //!< one past the last input row read
  std::size_t pad_front = 0; //!< zero rows before `begin` (nonzero on the first rank only)
  std::size_t pad_back = 0;  //!< zero rows after `end` (nonzero on the last rank only)
};

/*! \brief One rank's part of a convolution split along its first spatial
 *  axis: its input and output slabs, the input rows it reads, and its halo
 *  exchange with the neighbours. */
struct SpatialSlab {
  Slab in;           //!< input rows the rank holds
  Slab out;          //!< output rows it computes
  SlabWindow window; //!< input rows it reads (its own and the halo)
  HaloPlan halo;     //!< rows it exchanges with rank - 1 and rank + 1
};

namespace detail {

// Output extent of a convolution along one axis (0 when the kernel does not
// fit the padded input).
inline std::size_t conv_axis_out(std::size_t in, ConvAxis const& a) {
  std::size_t const span = a.dilation * (a.kernel - 1) + 1;
  if (in + 2 * a.padding < span || a.stride == 0)
    return 0;
  return (in + 2 * a.padding - span) / a.stride + 1;
}

// The input rows output rows `out` read, clipped to [0, in).
inline SlabWindow conv_window(Slab out, std::size_t in, ConvAxis const& a) {
  long const lo = long(out.begin * a.stride) - long(a.padding);
  long const hi =
      long((out.end - 1) * a.stride + a.dilation * (a.kernel - 1) + 1) - long(a.padding);
  long const b = std::max(lo, 0L), e = std::min(hi, long(in));
  return {std::size_t(b), std::size_t(std::max(b, e)), std::size_t(b - lo),
          std::size_t(hi - std::max(b, e))};
}

inline std::string spatial_where(char const* layer, std::size_t extent, int parts) {
  return std::string("telar::SpatialParallel: ") + layer + " with split extent " +
         std::to_string(extent) + " over sp = " + std::to_string(parts);
}

// ShapeError unless every part of `extent` (the input's or the output's
// rows of a layer whose input has `in` rows) over `parts` is non-empty.
inline void check_split(char const* layer, std::size_t in, char const* what, std::size_t extent,
                        int parts) {
  if (parts < 1 || extent < std::size_t(parts))
    throw ShapeError(
        spatial_where(layer, in, parts) + ": the " + what + " (" + std::to_string(extent) +
        " rows) leaves rank " + std::to_string(std::max(parts - 1, 0)) +
        " an empty slab (every rank needs at least one row: sp <= " + std::to_string(extent) + ")");
}

// ShapeError when part p reads rows beyond its neighbours' slabs (a slab
// thinner than the halo) or none of its own.
inline void check_halo(char const* layer, std::size_t in, int parts, int p, SpatialSlab const& s,
                       SpatialSlab const* left, SpatialSlab const* right) {
  std::string const where = spatial_where(layer, in, parts) + ": rank " + std::to_string(p);
  if (s.window.end <= s.in.begin || s.window.begin >= s.in.end)
    throw ShapeError(where + " reads input rows [" + std::to_string(s.window.begin) + ", " +
                     std::to_string(s.window.end) + ") but holds [" + std::to_string(s.in.begin) +
                     ", " + std::to_string(s.in.end) + ") (use a smaller sp)");
  auto thin = [&](std::size_t need, SpatialSlab const* n, int q) {
    if (n && need > n->in.size())
      throw ShapeError(where + " needs " + std::to_string(need) + " halo rows from rank " +
                       std::to_string(q) + ", whose slab has " + std::to_string(n->in.size()) +
                       " (a slab thinner than the halo: use a smaller sp)");
  };
  thin(s.in.begin > s.window.begin ? s.in.begin - s.window.begin : 0, left, p - 1);
  thin(s.window.end > s.in.end ? s.window.end - s.in.end : 0, right, p + 1);
}

} // namespace detail

/*! \brief Rank \p part's share of a layer whose output rows [ob, oe) read
 *  the input rows \p window gives, with input and output extents split over
 *  \p parts ranks by telar::split_extent. Every rank checks every part, so a
 *  refusal is the same text on every rank.
 *  \param layer layer name for messages \param in input extent along the
 *  split axis \param out output extent \param parts sp \param part rank in
 *  the spatial group \param window callable as window(Slab out) returning
 *  the telar::SlabWindow those outputs read
 *  \throws ShapeError when a rank's input or output slab would be empty, or
 *  a rank needs more halo rows than its neighbour holds */
template <class Window>
SpatialSlab spatial_slab(char const* layer, std::size_t in, std::size_t out, int parts, int part,
                         Window&& window) {
  detail::check_split(layer, in, "input", in, parts);
  detail::check_split(layer, in, "output", out, parts);
  auto slabs = [&](int p) {
    SpatialSlab s;
    s.in = split_extent(in, parts, p);
    s.out = split_extent(out, parts, p);
    s.window = window(s.out);
    return s;
  };
  SpatialSlab mine{};
  SpatialSlab prev{}, cur = slabs(0);
  for (int p = 0; p < parts; ++p) {
    SpatialSlab next = p + 1 < parts ? slabs(p + 1) : cur;
    detail::check_halo(layer, in, parts, p, cur, p > 0 ? &prev : nullptr,
                       p + 1 < parts ? &next : nullptr);
    if (p == part) {
      mine = cur;
      HaloPlan& h = mine.halo;
      h.rows = cur.in.size();
      h.own_begin = std::max(cur.window.begin, cur.in.begin) - cur.in.begin;
      h.own_end = std::min(cur.window.end, cur.in.end) - cur.in.begin;
      h.recv_lo = cur.in.begin - std::min(cur.window.begin, cur.in.begin);
      h.recv_hi = std::max(cur.window.end, cur.in.end) - cur.in.end;
      h.send_lo = p > 0 && prev.window.end > cur.in.begin ? prev.window.end - cur.in.begin : 0;
      h.send_hi =
          p + 1 < parts && next.window.begin < cur.in.end ? cur.in.end - next.window.begin : 0;
    }
    prev = cur, cur = next;
  }
  return mine;
}

/*! \brief Rank \p part's share of a convolution (or pooling) whose input
 *  extent \p in along the split axis is split over \p parts ranks, the
 *  output extent by the same rule (telar::spatial_slab with the window of
 *  the kernel, stride, padding and dilation).
 *  \param layer layer name for messages \param in input extent along the
 *  split axis \param axis the convolution along it \param parts sp
 *  \param part rank in the spatial group
 *  \throws ShapeError when a rank's input or output slab would be empty, or
 *  a rank needs more halo rows than its neighbour holds */
inline SpatialSlab conv_slab(char const* layer, std::size_t in, ConvAxis const& axis, int parts,
                             int part) {
  return spatial_slab(layer, in, detail::conv_axis_out(in, axis), parts, part,
                      [&](Slab out) { return detail::conv_window(out, in, axis); });
}

} // namespace telar
