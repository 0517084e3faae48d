#pragma once
/*! \file
 *  \brief telar::Upsample: nearest (integer factors) and linear (bilinear in
 *  2-D, trilinear in 3-D) resampling of samples [C, L], [C, H, W] or
 *  [C, D, H, W], with PyTorch's align_corners, matching F.interpolate.
 *  \code
 *  telar::Upsample<float> up({2, 2});                                // nearest, x2
 *  telar::Upsample<float> bi({2, 2}, telar::UpsampleMode::linear);   // bilinear
 *  auto to = telar::Upsample<float>::to_size({7, 9}, telar::UpsampleMode::linear, true);
 *  \endcode
 *  Each output is a weighted sum of at most 2 input elements per dimension,
 *  described per dimension by tables built once in build(); backward gathers
 *  through the inverse tables (no atomics).
 */
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/detail/spatial_row.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace telar {

/*! \brief How telar::Upsample interpolates. */
enum class UpsampleMode {
  nearest, //!< copies the nearest input (PyTorch's 'nearest'), integer factors only
  linear   //!< linear along each dimension: bilinear in 2-D, trilinear in 3-D
};

namespace detail {

// Output o along one dimension reads inputs i0 and i1 with weights 1 - lam
// and lam; input i is read by outputs [lo, hi). Dimensions are padded to
// three (D, H, W) with unit extents; each table holds the three dimensions
// one after another, from offsets ooff (per output) and ioff (per input).
template <class T, class MemorySpace>
struct ResampleTables {
  int in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int ooff[3] = {0, 0, 0}, ioff[3] = {0, 0, 0};
  Kokkos::View<int*, MemorySpace> i0, i1, lo, hi;
  Kokkos::View<T*, MemorySpace> lam;

  KOKKOS_INLINE_FUNCTION T weight(int a, int o, int i) const {
    int const k = ooff[a] + o;
    return (i0(k) == i ? T(1) - lam(k) : T(0)) + (i1(k) == i ? lam(k) : T(0));
  }
  KOKKOS_INLINE_FUNCTION std::size_t in_plane() const {
    return std::size_t(in[0]) * std::size_t(in[1]) * std::size_t(in[2]);
  }
  KOKKOS_INLINE_FUNCTION std::size_t out_plane() const {
    return std::size_t(out[0]) * std::size_t(out[1]) * std::size_t(out[2]);
  }
};

// Source coordinate of output o, PyTorch's area_pixel_compute_source_index.
inline double resample_source(std::size_t in, std::size_t out, std::size_t o, bool align_corners) {
  if (align_corners)
    return out > 1 ? double(o) * double(in - 1) / double(out - 1) : 0.0;
  double const src = (double(o) + 0.5) * double(in) / double(out) - 0.5;
  return src < 0 ? 0.0 : src;
}

// Inputs i0, i1 and weight lam of i1 that output o reads along a dimension
// of `in` inputs and `out` outputs.
inline void resample_index(int in, int out, int o, UpsampleMode mode, bool align_corners, int& i0,
                           int& i1, double& lam) {
  if (mode == UpsampleMode::nearest) {
    i0 = i1 = o / (out / in);
    lam = 0;
    return;
  }
  double const src =
      resample_source(std::size_t(in), std::size_t(out), std::size_t(o), align_corners);
  i0 = int(src);
  i1 = i0 + (i0 < in - 1 ? 1 : 0);
  lam = src - i0;
}

// Part of one dimension a slab holds (spatial parallelism): outputs
// [out_begin, out_end) reading inputs [in_begin, in_end) of the whole extent.
struct ResampleRange {
  int axis = -1; // none
  int out_begin = 0, out_end = 0, in_begin = 0, in_end = 0;
};

// Tables of every dimension (nearest: out is a multiple of in), restricted
// along range.axis to the slab's rows.
template <class T, class MemorySpace>
ResampleTables<T, MemorySpace> resample_tables(int const (&in)[3], int const (&out)[3],
                                               UpsampleMode mode, bool align_corners,
                                               ResampleRange const& range = {}) {
  ResampleTables<T, MemorySpace> t;
  std::size_t nout = 0, nin = 0;
  int ob[3], ib[3];
  for (int a = 0; a < 3; ++a) {
    bool const part = a == range.axis;
    ob[a] = part ? range.out_begin : 0;
    ib[a] = part ? range.in_begin : 0;
    t.in[a] = part ? range.in_end - range.in_begin : in[a];
    t.out[a] = part ? range.out_end - range.out_begin : out[a];
    t.ooff[a] = int(nout);
    t.ioff[a] = int(nin);
    nout += std::size_t(t.out[a]);
    nin += std::size_t(t.in[a]);
  }
  using Ints = Kokkos::View<int*, Kokkos::HostSpace>;
  Ints i0("telar::Upsample::i0", nout), i1("telar::Upsample::i1", nout);
  Ints lo("telar::Upsample::lo", nin), hi("telar::Upsample::hi", nin);
  Kokkos::View<T*, Kokkos::HostSpace> lam("telar::Upsample::lam", nout);
  for (int a = 0; a < 3; ++a) {
    for (int i = 0; i < t.in[a]; ++i)
      lo(t.ioff[a] + i) = t.out[a], hi(t.ioff[a] + i) = 0;
    for (int o = 0; o < t.out[a]; ++o) {
      int const k = t.ooff[a] + o;
      double l = 0;
      resample_index(in[a], out[a], ob[a] + o, mode, align_corners, i0(k), i1(k), l);
      i0(k) -= ib[a], i1(k) -= ib[a];
      lam(k) = T(l);
      for (int i : {i0(k), i1(k)}) {
        lo(t.ioff[a] + i) = std::min(lo(t.ioff[a] + i), o);
        hi(t.ioff[a] + i) = std::max(hi(t.ioff[a] + i), o + 1);
      }
    }
  }
  t.i0 = Kokkos::create_mirror_view_and_copy(MemorySpace{}, i0);
  t.i1 = Kokkos::create_mirror_view_and_copy(MemorySpace{}, i1);
  t.lo = Kokkos::create_mirror_view_and_copy(MemorySpace{}, lo);
  t.hi = Kokkos::create_mirror_view_and_copy(MemorySpace{}, hi);
  t.lam = Kokkos::create_mirror_view_and_copy(MemorySpace{}, lam);
  return t;
}

// y(o) = sum over the (up to) 8 corners of weight products times x.
template <class Exec, class Tables, class X, class Y>
void resample_forward(Exec const& exec, Tables const t, std::size_t planes, X const& x,
                      Y const& y) {
  using T = typename Y::non_const_value_type;
  Kokkos::parallel_for(
      "telar::Upsample::forward",
      Kokkos::RangePolicy<Exec>(exec, 0, planes * std::size_t(t.out[0] * t.out[1])),
      KOKKOS_LAMBDA(std::size_t r) {
        SpatialRow const o(r, t.out[0], t.out[1]);
        auto const* in = x.data() + o.plane * t.in_plane();
        T* out = y.data() + r * std::size_t(t.out[2]);
        int const kd = t.ooff[0] + o.d, kh = t.ooff[1] + o.h;
        int const ds[2] = {t.i0(kd), t.i1(kd)}, hs[2] = {t.i0(kh), t.i1(kh)};
        T const dw[2] = {T(1) - t.lam(kd), t.lam(kd)}, hw[2] = {T(1) - t.lam(kh), t.lam(kh)};
        for (int ow = 0; ow < t.out[2]; ++ow) {
          int const kw = t.ooff[2] + ow;
          int const ws[2] = {t.i0(kw), t.i1(kw)};
          T const ww[2] = {T(1) - t.lam(kw), t.lam(kw)};
          T acc = 0;
          for (int a = 0; a < 2; ++a)
            for (int b = 0; b < 2; ++b)
              for (int c = 0; c < 2; ++c)
                acc += dw[a] * hw[b] * ww[c] * in[(ds[a] * t.in[1] + hs[b]) * t.in[2] + ws[c]];
          out[ow] = acc;
        }
      });
}

// dx(i) = sum over the outputs that read i of dy times their weight on i.
template <class Exec, class Tables, class DY, class DX>
void resample_backward(Exec const& exec, Tables const t, std::size_t planes, DY const& dy,
                       DX const& dx) {
  using T = typename DX::non_const_value_type;
  Kokkos::parallel_for(
      "telar::Upsample::backward_input",
      Kokkos::RangePolicy<Exec>(exec, 0, planes * std::size_t(t.in[0] * t.in[1])),
      KOKKOS_LAMBDA(std::size_t r) {
        SpatialRow const i(r, t.in[0], t.in[1]);
        auto const* src = dy.data() + i.plane * t.out_plane();
        T* out = dx.data() + r * std::size_t(t.in[2]);
        int const jd = t.ioff[0] + i.d, jh = t.ioff[1] + i.h;
        for (int w = 0; w < t.in[2]; ++w) {
          int const jw = t.ioff[2] + w;
          T acc = 0;
          for (int od = t.lo(jd); od < t.hi(jd); ++od)
            for (int oh = t.lo(jh); oh < t.hi(jh); ++oh) {
              T const dh = t.weight(0, od, i.d) * t.weight(1, oh, i.h);
              for (int ow = t.lo(jw); ow < t.hi(jw); ++ow)
                acc += dh * t.weight(2, ow, w) * src[(od * t.out[1] + oh) * t.out[2] + ow];
            }
          out[w] = acc;
        }
      });
}

} // namespace detail

/*! \brief Upsampling of samples [C, L], [C, H, W] or [C, D, H, W] by integer
 *  factors or to an output size, as PyTorch's F.interpolate: nearest, or
 *  linear along each dimension (bilinear, trilinear) with or without
 *  align_corners. Nearest takes only integer factors (an output size must be
 *  a multiple of the input's): for other ratios PyTorch's 'nearest' and
 *  ONNX's Resize rounding disagree. Keeps nothing for backward.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
class Upsample : public detail::LayerTypes<T, MemorySpace> {
public:
  /*! \brief Upsampling by integer factors.
   *  \param scale one factor per spatial dimension (H, W or D, H, W)
   *  \param mode nearest or linear \param align_corners PyTorch's
   *  align_corners (linear mode only)
   *  \throws Error for a zero factor or align_corners with nearest */
  explicit Upsample(std::vector<std::size_t> scale, UpsampleMode mode = UpsampleMode::nearest,
                    bool align_corners = false)
      : scale_(std::move(scale)), mode_(mode), align_(align_corners) {
    validate();
  }
  /*! \brief Upsampling to a fixed output size. \param size one extent per
   *  spatial dimension \param mode nearest or linear \param align_corners
   *  PyTorch's align_corners (linear mode only) \return the layer
   *  \throws Error for a zero extent or align_corners with nearest */
  static Upsample to_size(std::vector<std::size_t> size, UpsampleMode mode = UpsampleMode::nearest,
                          bool align_corners = false) {
    Upsample u(mode, align_corners);
    u.size_ = std::move(size);
    u.validate();
    return u;
  }

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "Upsample"; }
  /*! \brief The interpolation mode. */
  UpsampleMode mode() const { return mode_; }
  /*! \brief Whether corners are aligned (linear mode). */
  bool align_corners() const { return align_; }
  /*! \brief [C, spatial extents times the factors, or the output size].
   *  \param in input shape
   *  \throws ShapeError for a rank that does not match the factors or size,
   *  or (nearest) an output size that is not a multiple of the input's */
  Shape output_shape(Shape const& in) const {
    std::vector<std::size_t> const out = out_extents(in);
    Shape s = in;
    for (std::size_t a = 0; a < out.size(); ++a)
      s.dims[a + 1] = out[a];
    return s;
  }
  /*! \brief Builds the interpolation tables. \param in input shape */
  void build(Shape const& in) { make_tables(in, {}); }
  /*! \brief Input rows [first, last) of the first spatial axis that output
   *  rows [out_begin, out_end) read (spatial parallelism).
   *  \param in the whole input shape \param out_begin first output row
   *  \param out_end one past the last output row \return {first, last}
   *  \throws ShapeError as output_shape */
  std::array<std::size_t, 2> input_rows(Shape const& in, std::size_t out_begin,
                                        std::size_t out_end) const {
    int const n = int(in[1]), m = int(out_extents(in)[0]);
    int first = n, last = 0;
    for (int o = int(out_begin); o < int(out_end); ++o) {
      int i0 = 0, i1 = 0;
      double lam = 0;
      detail::resample_index(n, m, o, mode_, align_, i0, i1, lam);
      first = std::min(first, i0), last = std::max(last, i1 + 1);
    }
    return {std::size_t(first), std::size_t(std::max(first, last))};
  }
  /*! \brief Builds for one slab of the whole input \p in split along its
   *  first spatial axis: output rows [out_begin, out_end) from the input rows
   *  [in_begin, in_end) the slab holds with its halo (see input_rows).
   *  \param in the whole input shape \param out_begin first output row
   *  \param out_end one past the last \param in_begin first input row held
   *  \param in_end one past the last \throws ShapeError as output_shape */
  void build_slab(Shape const& in, std::size_t out_begin, std::size_t out_end, std::size_t in_begin,
                  std::size_t in_end) {
    make_tables(in, {0, int(out_begin), int(out_end), int(in_begin), int(in_end)});
  }
  /*! \brief A copy per output (nearest), or 2 per corner (linear).
   *  \param samples batch size \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    double const outputs = double(samples) * double(output_shape(in).size());
    return mode_ == UpsampleMode::nearest ? outputs : outputs * 2.0 * double(1 << (in.rank - 1));
  }
  /*! \brief 0: nothing is kept. */
  std::size_t saved_bytes(std::size_t, Shape const&) const { return 0; }
  /*! \brief y = interpolated x. \param exec execution space instance
   *  \param x input [n, C * spatial] \param y output [n, C * output spatial] */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               NoSaved&) const {
    check("forward", x.extent(0), x.extent(1), y.extent(0), y.extent(1));
    detail::resample_forward(exec, t_, x.extent(0) * channels_, x, y);
  }
  /*! \brief dx = the transpose of the interpolation applied to dy.
   *  \param exec execution space instance \param dy gradient of the output
   *  \param dx gradient of the input */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      NoSaved const&) const {
    check("backward_input", dx.extent(0), dx.extent(1), dy.extent(0), dy.extent(1));
    detail::resample_backward(exec, t_, dx.extent(0) * channels_, dy, dx);
  }

private:
  Upsample(UpsampleMode mode, bool align_corners) : mode_(mode), align_(align_corners) {}

  // The tables for input shape `in`; a range (axis >= 0) restricts the
  // first spatial axis to a slab.
  void make_tables(Shape const& in, detail::ResampleRange range) {
    std::vector<std::size_t> const out = out_extents(in);
    int ti[3] = {1, 1, 1}, to[3] = {1, 1, 1};
    int const first = 3 - int(out.size());
    for (std::size_t a = 0; a < out.size(); ++a) {
      ti[first + int(a)] = int(in[int(a) + 1]);
      to[first + int(a)] = int(out[a]);
    }
    if (range.axis >= 0)
      range.axis = first;
    t_ = detail::resample_tables<T, MemorySpace>(ti, to, mode_, align_, range);
    channels_ = in[0];
    built_ = true;
  }
  static std::string list(std::vector<std::size_t> const& v) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i)
      s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  }
  void validate() const {
    std::vector<std::size_t> const& v = scale_.empty() ? size_ : scale_;
    bool zero = v.empty() || v.size() > 3;
    for (std::size_t e : v)
      zero |= e == 0;
    if (zero)
      throw Error(std::string("telar::Upsample: ") + (scale_.empty() ? "sizes " : "factors ") +
                  list(v) + " must be 1 to 3 positive extents");
    if (align_ && mode_ == UpsampleMode::nearest)
      throw Error("telar::Upsample: align_corners applies to the linear mode only");
  }
  std::vector<std::size_t> out_extents(Shape const& in) const {
    std::size_t const dims = scale_.empty() ? size_.size() : scale_.size();
    if (!in.known() || std::size_t(in.rank) != dims + 1 || in.size() == 0)
      throw ShapeError("Upsample with " + std::to_string(dims) + " spatial " +
                       (scale_.empty() ? "sizes " + list(size_) : "factors " + list(scale_)) +
                       " expects inputs [C, " + std::to_string(dims) + " extents], got " +
                       in.str());
    std::vector<std::size_t> out(dims);
    for (std::size_t a = 0; a < dims; ++a) {
      out[a] = scale_.empty() ? size_[a] : in[int(a) + 1] * scale_[a];
      if (mode_ == UpsampleMode::nearest && out[a] % in[int(a) + 1] != 0)
        throw ShapeError("Upsample (nearest) takes integer factors only: output size " +
                         list(size_) + " is not a multiple of input " + in.str() +
                         "'s spatial extents");
    }
    return out;
  }
  void check(char const* what, std::size_t xn, std::size_t xf, std::size_t yn,
             std::size_t yf) const {
    detail::check_layer_call("Upsample", what, built_, channels_ * t_.in_plane(),
                             channels_ * t_.out_plane(), xn, xf, yn, yf);
  }

  std::vector<std::size_t> scale_, size_;
  UpsampleMode mode_ = UpsampleMode::nearest;
  bool align_ = false;
  detail::ResampleTables<T, MemorySpace> t_{};
  std::size_t channels_ = 0;
  bool built_ = false;
};

} // namespace telar
