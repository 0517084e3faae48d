#pragma once
/*! \file
 *  \brief 2-D and 3-D convolutions (telar::Conv2D, telar::Conv3D) over samples
 *  [C, H, W] and [C, D, H, W].
 *
 *  One implementation serves both: a 2-D convolution is a 3-D one of depth 1
 *  with a kernel of depth 1. The portable path lowers each sample to a matrix
 *  (im2col, a Kokkos kernel) and multiplies with the layer's GEMM policy:
 *  - forward: y_n [Cout, P] = W [Cout, K] col(x_n) [K, P] + b, with K = Cin
 *    times the kernel volume and P the output positions;
 *  - backward_input: dcol = W^T dy_n, then dx = col2im(dcol), a gather (every
 *    input element sums the columns that read it: no atomics);
 *  - backward_weight: dW += dy_n col(x_n)^T (col recomputed: only x is kept),
 *    db += sums of dy over positions.
 *  A 1x1 convolution with stride 1 and no padding skips im2col (col(x) = x).
 *  With groups, col(x) is the same; each group multiplies its own rows of W
 *  with its own rows of col(x) (one GEMM per group and sample).
 *
 *  The arithmetic lives in detail::ConvEngine, which telar::ConvTranspose2D/3D
 *  (telar/layers/conv_transpose.hpp) reuses with forward and input gradient
 *  swapped.
 *
 *  The convolution policy (telar/layers/conv_policy.hpp) may replace this
 *  path: telar::AutoConv runs oneDNN's convolution primitives for float on
 *  host memory when Telar was built with oneDNN (see docs/design.md).
 *  \code
 *  telar::Conv2D<float> conv(3, 16, 3, 1, 1);  // 3 -> 16 channels, 3x3, stride 1, padding 1
 *  \endcode
 */
#include <telar/core/detail/counter_rng.hpp>
#include <telar/core/detail/math.hpp>
#include <telar/core/detail/uniform_fill.hpp>
#include <telar/core/error.hpp>
#include <telar/core/gemm.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/conv_policy.hpp>
#include <telar/layers/detail/bf16_saved_input.hpp>
#include <telar/layers/detail/onednn_conv.hpp>
#include <telar/layers/detail/spatial_row.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace telar {

namespace detail {

// Sizes of one convolution over [C, D, H, W] samples (D = 1 in 2-D), passed
// by value to kernels.
struct ConvGeometry {
  int C = 0, D = 1, H = 0, W = 0; // input
  int Co = 0;                     // output channels
  int kd = 1, kh = 1, kw = 1;     // kernel
  int sd = 1, sh = 1, sw = 1;     // stride
  int pd = 0, ph = 0, pw = 0;     // padding
  int dd = 1, dh = 1, dw = 1;     // dilation
  int Do = 1, Ho = 0, Wo = 0;     // output
  int G = 1;                      // groups: channels [i C/G, (i+1) C/G) feed outputs of group i
  // Padding after the input along D and H where it differs from pd / ph (a
  // slab of a sample split over ranks pads only at the volume's faces); -1:
  // the same. im2col/col2im need none (rows past the input read as zero);
  // oneDNN is told it.
  int pd_end = -1, ph_end = -1;

  int pad_end_d() const { return pd_end < 0 ? pd : pd_end; }
  int pad_end_h() const { return ph_end < 0 ? ph : ph_end; }

  KOKKOS_INLINE_FUNCTION int kvol() const { return kd * kh * kw; }
  // Rows of col(x): every input channel times the kernel volume.
  KOKKOS_INLINE_FUNCTION int K() const { return C * kd * kh * kw; }
  // Columns of W [Co, C/G * kvol]: one group's channels times the kernel volume.
  int Kg() const { return K() / G; }
  int Cog() const { return Co / G; }
  KOKKOS_INLINE_FUNCTION int P() const { return Do * Ho * Wo; }
  KOKKOS_INLINE_FUNCTION int in_size() const { return C * D * H * W; }
  bool pointwise() const {
    return kd == 1 && kh == 1 && kw == 1 && sd == 1 && sh == 1 && sw == 1 && pd == 0 && ph == 0 &&
           pw == 0;
  }
};

// A new id for one forward call of a convolution layer (never 0), kept in
// the micro-batch's saved state: backward passes it so that oneDNN's cache
// can tell its own micro-batch's converted inputs from another's.
inline std::uint64_t next_conv_call() {
  static std::atomic<std::uint64_t> last{0};
  return ++last;
}

// Output extent of one dimension, or -1 when the kernel does not fit.
inline long conv_out_extent(long in, long k, long s, long p, long d) {
  long const span = d * (k - 1) + 1;
  if (in + 2 * p < span || s < 1)
    return -1;
  return (in + 2 * p - span) / s + 1;
}

// col[s][k][p] for samples s0 .. s0 + nb of x [n, C*D*H*W]: one work item per
// (sample, k, od, oh) row of Wo outputs.
template <class Exec, class X, class Col>
void conv_im2col(Exec const& exec, ConvGeometry const g, X const& x, std::size_t s0, int nb,
                 Col const& col) {
  using T = typename Col::non_const_value_type;
  int const K = g.K(), P = g.P();
  std::size_t const rows = std::size_t(nb) * std::size_t(K) * std::size_t(g.Do * g.Ho);
  Kokkos::parallel_for(
      "telar::Conv::im2col", Kokkos::RangePolicy<Exec>(exec, 0, rows),
      KOKKOS_LAMBDA(std::size_t r) {
        SpatialRow const row(r, g.Do, g.Ho); // plane = s K + k
        int const od = row.d, oh = row.h;
        int const k = int(row.plane % std::size_t(K)), s = int(row.plane / std::size_t(K));
        int const kx = k % g.kw, ky = (k / g.kw) % g.kh, kz = (k / (g.kw * g.kh)) % g.kd;
        int const c = k / g.kvol();
        int const id = od * g.sd - g.pd + kz * g.dd, ih = oh * g.sh - g.ph + ky * g.dh;
        T* out = col.data() + (std::size_t(s) * K + std::size_t(k)) * std::size_t(P) +
                 std::size_t(od * g.Ho + oh) * std::size_t(g.Wo);
        if (id < 0 || id >= g.D || ih < 0 || ih >= g.H) {
          for (int ow = 0; ow < g.Wo; ++ow)
            out[ow] = T(0);
          return;
        }
        std::size_t const base = (s0 + std::size_t(s)) * x.extent(1) +
                                 std::size_t((c * g.D + id) * g.H + ih) * std::size_t(g.W);
        auto const* in = x.data() + base;
        int const off = kx * g.dw - g.pw;
        for (int ow = 0; ow < g.Wo; ++ow) {
          int const iw = ow * g.sw + off;
          out[ow] = (iw >= 0 && iw < g.W) ? in[iw] : T(0);
        }
      });
}

// dx rows s0 .. s0 + nb = col2im(dcol), by gathering: every input element
// sums the entries of dcol that im2col copied it to.
template <class Exec, class Col, class DX>
void conv_col2im(Exec const& exec, ConvGeometry const g, Col const& dcol, std::size_t s0, int nb,
                 DX const& dx) {
  using T = typename DX::non_const_value_type;
  int const K = g.K(), P = g.P();
  std::size_t const rows = std::size_t(nb) * std::size_t(g.C * g.D * g.H);
  Kokkos::parallel_for(
      "telar::Conv::col2im", Kokkos::RangePolicy<Exec>(exec, 0, rows),
      KOKKOS_LAMBDA(std::size_t r) {
        SpatialRow const row(r, g.D, g.H); // plane = s C + c
        int const d = row.d, h = row.h;
        int const c = int(row.plane % std::size_t(g.C)), s = int(row.plane / std::size_t(g.C));
        T* out = dx.data() + (s0 + std::size_t(s)) * dx.extent(1) +
                 std::size_t((c * g.D + d) * g.H + h) * std::size_t(g.W);
        auto const* src = dcol.data() + std::size_t(s) * std::size_t(K) * std::size_t(P);
        for (int w = 0; w < g.W; ++w) {
          T acc = 0;
          for (int kz = 0; kz < g.kd; ++kz) {
            int const td = d + g.pd - kz * g.dd;
            if (td < 0 || (g.sd != 1 && td % g.sd != 0))
              continue;
            int const od = td / g.sd;
            if (od >= g.Do)
              continue;
            for (int ky = 0; ky < g.kh; ++ky) {
              int const th = h + g.ph - ky * g.dh;
              if (th < 0 || (g.sh != 1 && th % g.sh != 0))
                continue;
              int const oh = th / g.sh;
              if (oh >= g.Ho)
                continue;
              int const krow = ((c * g.kd + kz) * g.kh + ky) * g.kw;
              std::size_t const prow = std::size_t(od * g.Ho + oh) * std::size_t(g.Wo);
              for (int kx = 0; kx < g.kw; ++kx) {
                int const tw = w + g.pw - kx * g.dw;
                if (tw < 0 || (g.sw != 1 && tw % g.sw != 0))
                  continue;
                int const ow = tw / g.sw;
                if (ow >= g.Wo)
                  continue;
                acc += src[std::size_t(krow + kx) * std::size_t(P) + prow + std::size_t(ow)];
              }
            }
          }
          out[w] = acc;
        }
      });
}

// y(s, co * P + p) = b(co): one work item per (sample, channel) row of P.
template <class Exec, class Y, class B>
void conv_fill_bias(Exec const& exec, Y const& y, B const& b, int P) {
  std::size_t const Co = b.extent(0);
  auto* py = y.data();
  Kokkos::parallel_for(
      "telar::Conv::forward_bias", Kokkos::RangePolicy<Exec>(exec, 0, y.extent(0) * Co),
      KOKKOS_LAMBDA(std::size_t r) {
        auto const v = b(r % Co);
        auto* row = py + r * std::size_t(P);
        for (int q = 0; q < P; ++q)
          row[q] = v;
      });
}

// db(co) += sum over samples and positions of dy(s, co * P + p).
template <class Exec, class DY, class DB>
void conv_bias_grad(Exec const& exec, DY const& dy, DB const& db, int P) {
  using T = typename DB::non_const_value_type;
  std::size_t const n = dy.extent(0), per = dy.extent(1);
  auto const* p = dy.data();
  Kokkos::parallel_for(
      "telar::Conv::backward_bias", Kokkos::RangePolicy<Exec>(exec, 0, db.extent(0)),
      KOKKOS_LAMBDA(std::size_t co) {
        T acc = 0;
        for (std::size_t s = 0; s < n; ++s) {
          auto const* row = p + s * per + co * std::size_t(P);
          for (int q = 0; q < P; ++q)
            acc += row[q];
        }
        db(co) += acc;
      });
}

// W [Co, K] and b [Co] uniform in +-1/sqrt(K) (PyTorch's default for
// convolutions), entry i of each drawn from a counter-based stream.
template <class Wt, class B>
void conv_fill(Wt const& w, B const& b, std::uint64_t seed) {
  uniform_fill_block("telar::Conv", w, b, seed, w.extent(1), 0, 0);
}

// A [rows, cols] row-major matrix over a raw pointer (one sample's slice).
template <class T, class MemorySpace>
using ConvSlice =
    Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

// Sets dimension j (0 depth, 1 height, 2 width) of g: a kernel k with stride
// s, padding p and dilation d reading `in` positions into `out`.
inline void conv_set_dim(ConvGeometry& g, int j, int in, int k, int s, int p, int d, int out) {
  int* const ext[3] = {&g.D, &g.H, &g.W};
  int* const kern[3] = {&g.kd, &g.kh, &g.kw};
  int* const str[3] = {&g.sd, &g.sh, &g.sw};
  int* const pad[3] = {&g.pd, &g.ph, &g.pw};
  int* const dil[3] = {&g.dd, &g.dh, &g.dw};
  int* const o[3] = {&g.Do, &g.Ho, &g.Wo};
  *ext[j] = in, *kern[j] = k, *str[j] = s, *pad[j] = p, *dil[j] = d, *o[j] = out;
}

// True when every output extent of g is the one conv_out_extent gives (a
// transposed convolution's output_padding may add a row no kernel reaches),
// with the padding after the input where it differs (a slab).
inline bool conv_extents_consistent(ConvGeometry const& g) {
  auto fits = [](long in, long k, long s, long front, long back, long d, long out) {
    long const span = d * (k - 1) + 1;
    return front >= 0 && back >= 0 && in + front + back >= span &&
           (in + front + back - span) / s + 1 == out;
  };
  return fits(g.D, g.kd, g.sd, g.pd, g.pad_end_d(), g.dd, g.Do) &&
         fits(g.H, g.kh, g.sh, g.ph, g.pad_end_h(), g.dh, g.Ho) &&
         conv_out_extent(g.W, g.kw, g.sw, g.pw, g.dw) == g.Wo;
}

// The same value in every dimension, and the product of the extents.
template <std::size_t Dims>
constexpr std::array<std::size_t, Dims> conv_fill_extents(std::size_t v) {
  std::array<std::size_t, Dims> e{};
  for (auto& x : e)
    x = v;
  return e;
}
template <std::size_t Dims>
std::size_t conv_volume(std::array<std::size_t, Dims> const& e) {
  std::size_t v = 1;
  for (auto x : e)
    v *= x;
  return v;
}

// ShapeError unless kernel, stride and dilation are >= 1.
template <std::size_t Dims>
void conv_check_settings(char const* layer, std::array<std::size_t, Dims> const& kernel,
                         std::array<std::size_t, Dims> const& stride,
                         std::array<std::size_t, Dims> const& dilation) {
  for (std::size_t i = 0; i < Dims; ++i)
    if (kernel[i] < 1 || stride[i] < 1 || dilation[i] < 1)
      throw ShapeError(std::string(layer) + ": kernel, stride and dilation must be >= 1");
}

// ShapeError unless both channel counts are multiples of groups (>= 1).
inline void conv_check_groups(char const* layer, std::size_t in, std::size_t out,
                              std::size_t groups) {
  if (groups < 1 || in % groups != 0 || out % groups != 0)
    throw ShapeError(std::string(layer) + ": in_channels (" + std::to_string(in) +
                     ") and out_channels (" + std::to_string(out) +
                     ") must be divisible by groups (" + std::to_string(groups) + ")");
}

// The run-time checks of a layer call: built, initialised, [n, in] -> [n, out].
inline void conv_check_call(char const* layer, char const* what, bool built, bool initialised,
                            std::size_t in, std::size_t out, std::size_t xn, std::size_t xf,
                            std::size_t yn, std::size_t yf) {
  if (built && !initialised)
    throw Error(std::string("telar::") + layer + "::" + what + ": layer not initialised");
  check_layer_call(layer, what, built, in, out, xn, xf, yn, yf);
}

// The arithmetic of one convolution of geometry g with weights W [Co, C/G *
// kvol] (PyTorch's [Co, C/G, k...]): y = conv(x) + b, its transpose (the
// input gradient) and the weight gradient, by im2col + GEMM per group, or by
// oneDNN's primitives (OneDnn; in bf16 with Bf16). telar::Convolution calls them in order;
// telar::TransposedConvolution calls forward and backward_data the other
// way round. Holds the column workspace and oneDNN's primitives.
template <class T, class MemorySpace, class Gemm, bool OneDnn, bool Bf16 = false>
class ConvEngine {
public:
  // y = conv(x) + b (b empty: no bias).
  // `call` (next_conv_call()) names the micro-batch for oneDNN, which then
  // converts its inputs once per micro-batch (detail/onednn_conv.hpp); 0: none.
  // `keep`: where oneDNN copies x as its bf16 primitive reads it (a bf16
  // layer's compact copy; null: nowhere).
  template <class Exec>
  void forward(Exec const& exec, ConvGeometry const& g, ConstMatrix<T, MemorySpace> const& x,
               T const* w, Vector<T, MemorySpace> const& b, Matrix<T, MemorySpace> const& y,
               std::uint64_t call = 0, std::uint16_t* keep = nullptr) const {
    bool const bias = b.extent(0) > 0;
    if (via_onednn(exec, g, x.extent(0), [&](auto& dnn) {
          dnn.forward(g, x.extent(0), x.data(), w, bias ? b.data() : nullptr, y.data(), call, keep);
        }))
      return;
    if (bias)
      conv_fill_bias(exec, y, b, g.P());
    T const beta = bias ? T(1) : T(0);
    for_each_column(exec, g, x, [&](std::size_t s, T const* col) {
      grouped_gemm(exec, g.G, 'N', 'N', {w, g.Cog(), g.Kg()}, {col, g.Kg(), g.P()}, beta,
                   {y.data() + s * y.extent(1), g.Cog(), g.P()});
    });
  }

  // dx = conv^T(dy), overwritten: GEMMs W^T dy per group, then col2im.
  // `bias` (whether forward had one) only picks oneDNN's cached primitives.
  // `keep`: as forward's, for dy (a transposed convolution's input).
  template <class Exec>
  void backward_data(Exec const& exec, ConvGeometry const& g, ConstMatrix<T, MemorySpace> const& dy,
                     T const* w, Matrix<T, MemorySpace> const& dx, bool bias,
                     std::uint64_t call = 0, std::uint16_t* keep = nullptr) const {
    std::size_t const n = dy.extent(0);
    if (via_onednn(exec, g, n, [&](auto& dnn) {
          dnn.backward_data(g, n, dy.data(), w, dx.data(), bias, call, keep);
        }))
      return;
    auto product = [&](std::size_t s, T* dcol) {
      grouped_gemm(exec, g.G, 'T', 'N', {w, g.Cog(), g.Kg()},
                   {dy.data() + s * dy.extent(1), g.Cog(), g.P()}, T(0), {dcol, g.Kg(), g.P()});
    };
    if (g.pointwise()) {
      for (std::size_t s = 0; s < n; ++s)
        product(s, dx.data() + s * dx.extent(1));
      return;
    }
    in_column_chunks(g, n, [&](std::size_t s0, int nb, auto const& dcol, std::size_t KP) {
      for (int s = 0; s < nb; ++s)
        product(s0 + std::size_t(s), dcol.data() + std::size_t(s) * KP);
      conv_col2im(exec, g, dcol, s0, nb, dx);
    });
  }

  // dw += dy col(x)^T per group, db += sums of dy over positions (db empty:
  // no bias).
  template <class Exec>
  void backward_weights(Exec const& exec, ConvGeometry const& g,
                        ConstMatrix<T, MemorySpace> const& x, ConstMatrix<T, MemorySpace> const& dy,
                        T* dw, Vector<T, MemorySpace> const& db, std::uint64_t call = 0) const {
    bool const bias = db.extent(0) > 0;
    if (via_onednn(exec, g, x.extent(0), [&](auto& dnn) {
          dnn.backward_weights(g, x.extent(0), x.data(), dy.data(), dw, bias ? db.data() : nullptr,
                               call);
        }))
      return;
    if (bias)
      conv_bias_grad(exec, dy, db, g.P());
    for_each_column(exec, g, x, [&](std::size_t s, T const* col) {
      grouped_gemm(exec, g.G, 'N', 'T', {dy.data() + s * dy.extent(1), g.Cog(), g.P()},
                   {col, g.Kg(), g.P()}, T(1), {dw, g.Cog(), g.Kg()});
    });
  }

  // The same, n samples, where x or dy is a copy kept in bf16 (`keep`; X or
  // DY std::uint16_t, the other float): oneDNN's path only.
  template <class Exec, class X, class DY>
  void backward_weights(Exec const& exec, ConvGeometry const& g, std::size_t n, X const* x,
                        DY const* dy, T* dw, Vector<T, MemorySpace> const& db,
                        std::uint64_t call) const {
    bool const bias = db.extent(0) > 0;
    via_onednn(exec, g, n, [&](auto& dnn) {
      dnn.backward_weights(g, n, x, dy, dw, bias ? db.data() : nullptr, call);
    });
  }

  // Bytes of the column workspace the im2col path keeps for \p n samples
  // (none for a pointwise convolution, or where oneDNN runs instead).
  static std::size_t workspace_bytes(ConvGeometry const& g, std::size_t n) {
#if TELAR_HAVE_ONEDNN
    if (OneDnn && conv_extents_consistent(g))
      return 0;
#endif
    if (g.pointwise())
      return 0;
    std::size_t const KP = std::size_t(g.K()) * std::size_t(g.P());
    return view_bytes<T>(std::size_t(chunk_samples(g, n)) * KP);
  }

private:
  // `groups` matrices [rows, cols] one after the other: one operand per group.
  template <class P>
  struct Blocks {
    P* data;
    int rows, cols;
    ConvSlice<P, MemorySpace> block(int i) const {
      return ConvSlice<P, MemorySpace>(
          data + std::size_t(i) * std::size_t(rows) * std::size_t(cols), rows, cols);
    }
  };
  // c_i = op(a_i) op(b_i) + beta c_i for every group i.
  template <class Exec>
  static void grouped_gemm(Exec const& exec, int groups, char ta, char tb, Blocks<T const> a,
                           Blocks<T const> b, T beta, Blocks<T> c) {
    for (int i = 0; i < groups; ++i)
      gemm(Gemm{}, exec, ta, tb, T(1), a.block(i), b.block(i), beta, c.block(i));
  }

  // Calls f(oneDNN's primitives) for n samples when this engine hands these
  // extents to oneDNN, and says whether it did. (f is a generic lambda: its
  // body is compiled only where oneDNN is.)
  template <class Exec, class F>
  bool via_onednn(Exec const& exec, ConvGeometry const& g, std::size_t n, F&& f) const {
#if TELAR_HAVE_ONEDNN
    if constexpr (OneDnn) {
      if (conv_extents_consistent(g)) {
        exec.fence(); // oneDNN runs on the calling thread: earlier kernels must be done
        if (n > 0)
          f(onednn_);
        return true;
      }
    }
#endif
    (void)exec, (void)g, (void)n, (void)f;
    return false;
  }

  // Calls f(s, col) with col(x_s) [K, P] for every sample s (x_s itself when
  // the convolution is pointwise: no im2col).
  template <class Exec, class F>
  void for_each_column(Exec const& exec, ConvGeometry const& g,
                       ConstMatrix<T, MemorySpace> const& x, F&& f) const {
    std::size_t const n = x.extent(0);
    if (g.pointwise()) {
      for (std::size_t s = 0; s < n; ++s)
        f(s, x.data() + s * x.extent(1));
      return;
    }
    in_column_chunks(g, n, [&](std::size_t s0, int nb, auto const& col, std::size_t KP) {
      conv_im2col(exec, g, x, s0, nb, col);
      for (int s = 0; s < nb; ++s)
        f(s0 + std::size_t(s), static_cast<T const*>(col.data() + std::size_t(s) * KP));
    });
  }

  // The column workspace, chunk by chunk: f(s0, nb, cols, KP) for the nb
  // samples from s0, cols holding KP = K x P values per sample.
  template <class F>
  void in_column_chunks(ConvGeometry const& g, std::size_t n, F&& f) const {
    std::size_t const KP = std::size_t(g.K()) * std::size_t(g.P());
    int const chunk = chunk_samples(g, n);
    auto cols = workspace(std::size_t(chunk) * KP);
    for (std::size_t s0 = 0; s0 < n; s0 += std::size_t(chunk))
      f(s0, int(std::min<std::size_t>(std::size_t(chunk), n - s0)), cols, KP);
  }

  // Samples lowered at once: one on the host (the columns stay in cache for
  // the GEMM), up to 2^24 elements of columns on a device (fewer launches).
  static int chunk_samples(ConvGeometry const& g, std::size_t n) {
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible) {
      return 1;
    } else {
      std::size_t const per = std::size_t(g.K()) * std::size_t(g.P());
      std::size_t const c =
          std::max<std::size_t>(1, (std::size_t(1) << 24) / std::max<std::size_t>(per, 1));
      return int(std::min(c, std::max<std::size_t>(n, 1)));
    }
  }
  // Scratch for columns, kept between calls (one call at a time per layer).
  Kokkos::View<T*, MemorySpace> workspace(std::size_t size) const {
    if (ws_.extent(0) < size)
      ws_ = Kokkos::View<T*, MemorySpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::Conv::workspace"), size);
    return ws_;
  }

  mutable Kokkos::View<T*, MemorySpace> ws_;
#if TELAR_HAVE_ONEDNN
  // oneDNN primitives per batch size (empty unless OneDnn).
  mutable OneDnnConvCache onednn_{Bf16};
#endif
};

} // namespace detail

namespace detail {
/*! \brief What telar::Convolution and telar::TransposedConvolution share:
 *  their settings, parameters W [rows, K] and b [out], the engine and the
 *  geometry of the last build. \p Transposed swaps the roles of in and out in
 *  W (a transposed convolution stores the weight of its adjoint).
 *  \tparam Derived the layer (CRTP: name() and geometry(in))
 *  \tparam T value type \tparam Dims 2 or 3 \tparam MemorySpace memory space
 *  \tparam Gemm GEMM policy \tparam ConvPolicy convolution policy
 *  \tparam Transposed whether W is the adjoint's */
template <class Derived, class T, int Dims, class MemorySpace, class Gemm, class ConvPolicy,
          bool Transposed>
class ConvLayer {
  static_assert(Dims == 2 || Dims == 3,
                "telar::Convolution, telar::TransposedConvolution: Dims must be 2 or 3");
  static_assert(is_conv_policy_v<ConvPolicy>,
                "telar::Convolution, telar::TransposedConvolution: ConvPolicy must be a Telar "
                "convolution policy");
  static_assert(ConvPolicy::template supports<T, MemorySpace>(),
                "telar::Convolution, telar::TransposedConvolution: this convolution policy does "
                "not support the value type or memory space (use telar::AutoConv)");

public:
  /*! \brief Scalar type. */
  using value_type = T;
  /*! \brief Memory space of parameters and activations. */
  using memory_space = MemorySpace;
  /*! \brief Per-dimension settings (depth, height, width in 3-D; height, width in 2-D). */
  using Extents = std::array<std::size_t, Dims>;
  /*! \brief Backward reads the input (the saved view), never the output. */
  static constexpr BackwardReads backward_reads = BackwardReads::input;
  /*! \brief The concrete convolution policy (AutoConv resolved). */
  using conv_policy =
      std::conditional_t<std::is_same_v<ConvPolicy, AutoConv>,
                         typename AutoConv::template select<T, MemorySpace>, ConvPolicy>;
  /*! \brief What backward needs from forward: the input. */
  struct saved_type {
    ConstMatrix<T, MemorySpace> x; //!< the forward input (a view; empty when compact)
    /*! \brief Which forward call this is (detail::next_conv_call()): lets
     *  oneDNN's backward reuse the inputs it converted for this micro-batch. */
    std::uint64_t call = 0;
    /*! \brief A bf16 convolution: keep the input rounded instead (the stage runner's). */
    bool compact = false;
    /*! \brief The compact copy (under telar::OneDnnConvBf16). */
    detail::saved_input_t<MemorySpace, std::is_same_v<conv_policy, OneDnnConvBf16>> kept;
  };

  /*! \brief Input channels. */
  std::size_t in_channels() const { return in_; }
  /*! \brief Output channels. */
  std::size_t out_channels() const { return out_; }
  /*! \brief Channel groups (1: dense; in_channels(): depthwise). */
  std::size_t groups() const { return groups_; }
  /*! \brief Whether the layer adds a bias. */
  bool has_bias() const { return use_bias_; }
  /*! \brief Kernel extents. */
  Extents kernel() const { return kernel_; }
  /*! \brief Strides. */
  Extents stride() const { return stride_; }
  /*! \brief Zero padding on each side. */
  Extents padding() const { return padding_; }
  /*! \brief Dilations. */
  Extents dilation() const { return dilation_; }

  /*! \brief Remembers the input's spatial extents. \param in the input shape
   *  \throws ShapeError as output_shape */
  void build(Shape const& in) {
    g_ = self().geometry(in);
    built_ = true;
  }
  /*! \brief Multiply-add count of forward for \p samples samples, times 2
   *  (for a transposed convolution, that of its adjoint).
   *  \param samples batch size \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    ConvGeometry const g = self().geometry(in);
    return 2.0 * double(samples) * double(g.Co) * double(g.P()) * double(g.Kg());
  }
  /*! \brief Values of W and b. */
  std::size_t parameter_count() const { return rows() * cols() + (use_bias_ ? out_ : 0); }
  /*! \brief Keeps a view of x only (its column workspace is per layer): 0. */
  std::size_t saved_bytes(std::size_t, Shape const&) const { return 0; }
  /*! \brief The im2col columns of the samples lowered at once (none for a
   *  pointwise convolution or with oneDNN). \param samples rows \param in input shape */
  std::size_t workspace_bytes(std::size_t samples, Shape const& in) const {
    return decltype(engine_)::workspace_bytes(self().geometry(in), samples);
  }
#if TELAR_HAVE_ONEDNN
  /*! \brief Under telar::OneDnnConvBf16, the input kept in bf16 when the
   *  stage runner asks (saved_type::compact; fp32 where bf16 falls back):
   *  the bytes of \p samples inputs \p in. */
  template <class P = conv_policy, class = std::enable_if_t<std::is_same_v<P, OneDnnConvBf16>>>
  std::size_t compact_bytes(std::size_t samples, Shape const& in) const {
    std::size_t const values = samples * in.size();
    return conv_extents_consistent(self().geometry(in)) ? Bf16SavedInput<MemorySpace>::bytes(values)
                                                        : view_bytes<float>(values);
  }
#endif

  /*! \brief Allocates W, b and their gradients and draws W and b.
   *  \param seed stream seed (telar::Sequential derives one per layer) */
  void initialize(std::uint64_t seed) {
    std::string const label = Transposed ? "telar::ConvTranspose::" : "telar::Conv::";
    weight = Matrix<T, MemorySpace>(label + "weight", rows(), cols());
    weight_grad = Matrix<T, MemorySpace>(label + "weight_grad", rows(), cols());
    if (use_bias_) {
      bias = Vector<T, MemorySpace>(label + "bias", out_);
      bias_grad = Vector<T, MemorySpace>(label + "bias_grad", out_);
    }
    conv_fill(weight, bias, seed);
  }
  /*! \brief Visits (name, value, gradient) of each parameter.
   *  \param f callable as f(char const*, View&, View&) */
  template <class F>
  void parameters(F&& f) {
    f("weight", weight, weight_grad);
    if (use_bias_)
      f("bias", bias, bias_grad);
  }

  Matrix<T, MemorySpace> weight;      //!< W [rows, in or out / groups * kernel volume]
  Matrix<T, MemorySpace> weight_grad; //!< dL/dW, as W
  Vector<T, MemorySpace> bias;        //!< b [out] (empty without bias)
  Vector<T, MemorySpace> bias_grad;   //!< dL/db [out]

protected:
  ConvLayer() = default;
  ConvLayer(std::size_t in, std::size_t out, Extents kernel, Extents stride, Extents padding,
            bool bias, Extents dilation, std::size_t groups)
      : in_(in), out_(out), groups_(groups), kernel_(kernel), stride_(stride), padding_(padding),
        dilation_(dilation), use_bias_(bias) {
    conv_check_groups(Derived::name(), in, out, groups);
  }
  // The settings, geometry and parameter views of the same layer under other
  // GEMM and convolution policies (telar::Precision's rebind); the engine
  // starts empty (it caches per policy).
  template <class D, class G, class P>
  explicit ConvLayer(ConvLayer<D, T, Dims, MemorySpace, G, P, Transposed> const& o)
      : weight(o.weight), weight_grad(o.weight_grad), bias(o.bias), bias_grad(o.bias_grad),
        in_(o.in_), out_(o.out_), groups_(o.groups_), kernel_(o.kernel_), stride_(o.stride_),
        padding_(o.padding_), dilation_(o.dilation_), use_bias_(o.use_bias_), g_(o.g_),
        built_(o.built_) {}
  template <class, class, int, class, class, class, bool>
  friend class ConvLayer; // the converting constructor reads another policy's layer
  static constexpr Extents fill(std::size_t v) {
    return conv_fill_extents<Dims>(v);
  }
  // W's rows: the output channels, or the input's for the adjoint's weight.
  std::size_t rows() const {
    return Transposed ? in_ : out_;
  }
  std::size_t cols() const {
    return (Transposed ? out_ : in_) / groups_ * conv_volume(kernel_);
  }
  std::string expected() const {
    return std::string(Derived::name()) + " expects inputs [" + std::to_string(in_) +
           (Dims == 3 ? ", D, H, W]" : ", H, W]");
  }
  // The layer's call on x-like [xn, xf] and y-like [yn, yf] against the
  // sizes of the last build (x_size, y_size features), or ShapeError.
  void check(char const* what, std::size_t x_size, std::size_t y_size, std::size_t xn,
             std::size_t xf, std::size_t yn, std::size_t yf) const {
    conv_check_call(Derived::name(), what, built_, weight.extent(0) > 0, x_size, y_size, xn, xf, yn,
                    yf);
  }
  Derived const& self() const {
    return static_cast<Derived const&>(*this);
  }

  std::size_t in_ = 0, out_ = 0, groups_ = 1;
  Extents kernel_ = fill(1), stride_ = fill(1), padding_ = fill(0), dilation_ = fill(1);
  bool use_bias_ = true;
  ConvGeometry g_{};
  bool built_ = false;
  ConvEngine<T, MemorySpace, Gemm, is_onednn_conv_v<conv_policy>,
             std::is_same_v<conv_policy, OneDnnConvBf16>>
      engine_;
};
} // namespace detail

/*! \brief A convolution over samples [C, H, W] (Dims = 2) or [C, D, H, W]
 *  (Dims = 3), with stride, zero padding, dilation per dimension and groups;
 *  use the aliases telar::Conv2D and telar::Conv3D.
 *
 *  The weight is stored as PyTorch's [out, in / groups, (kd,) kh, kw]
 *  flattened to a matrix [out, in / groups * kernel volume]. With groups g,
 *  output channels [i out/g, (i+1) out/g) read input channels [i in/g,
 *  (i+1) in/g) only; groups == in is a depthwise convolution. initialize(seed)
 *  draws W and b uniform in ±1/sqrt(in / groups * kernel volume) (PyTorch's
 *  default, kaiming-uniform with a = sqrt(5)) from a counter-based generator.
 *  build(in) must be called (telar::Sequential does) before forward.
 *  \code
 *  telar::Conv2D<float> depthwise(32, 32, 3, 1, 1, true, 1, 32);  // groups = 32
 *  \endcode
 *  \tparam T value type (float or double)
 *  \tparam Dims 2 or 3 spatial dimensions
 *  \tparam MemorySpace where parameters and activations live
 *  \tparam Gemm GEMM policy of the im2col path (see telar/core/gemm.hpp)
 *  \tparam ConvPolicy convolution policy (see telar/layers/conv_policy.hpp) */
template <class T, int Dims, class MemorySpace = DefaultMemorySpace, class Gemm = AutoGemm,
          class ConvPolicy = AutoConv>
class Convolution : public detail::ConvLayer<Convolution<T, Dims, MemorySpace, Gemm, ConvPolicy>, T,
                                             Dims, MemorySpace, Gemm, ConvPolicy, false> {
  using Base = detail::ConvLayer<Convolution, T, Dims, MemorySpace, Gemm, ConvPolicy, false>;
  using Ext = typename Base::Extents;
  using Saved = typename Base::saved_type;
  friend Base;

public:
  /*! \brief An empty layer; assign a configured one before use. */
  Convolution() = default;
  /*! \brief A cubic (square) kernel with the same stride, padding and
   *  dilation in every dimension.
   *  \param in input channels \param out output channels \param kernel kernel extent
   *  \param stride stride \param padding zero padding on each side
   *  \param bias add a bias per output channel \param dilation kernel dilation
   *  \param groups channel groups (in and out must be multiples of it)
   *  \throws ShapeError when in or out is not a multiple of groups */
  Convolution(std::size_t in, std::size_t out, std::size_t kernel, std::size_t stride = 1,
              std::size_t padding = 0, bool bias = true, std::size_t dilation = 1,
              std::size_t groups = 1)
      : Convolution(in, out, Base::fill(kernel), Base::fill(stride), Base::fill(padding), bias,
                    Base::fill(dilation), groups) {}
  /*! \brief Settings per dimension (e.g. a 1x5 kernel).
   *  \param in input channels \param out output channels \param kernel kernel extents
   *  \param stride strides \param padding zero padding on each side
   *  \param bias add a bias per output channel \param dilation kernel dilations
   *  \param groups channel groups (in and out must be multiples of it)
   *  \throws ShapeError when in or out is not a multiple of groups */
  Convolution(std::size_t in, std::size_t out, Ext kernel, Ext stride, Ext padding,
              bool bias = true, Ext dilation = Base::fill(1), std::size_t groups = 1)
      : Base(in, out, kernel, stride, padding, bias, dilation, groups) {}
  /*! \brief The same layer (configuration, geometry and parameter views)
   *  under other GEMM and convolution policies: what telar::Precision's rebind
   *  of a model makes. \tparam G the other GEMM policy \tparam P the other
   *  convolution policy \param o the layer */
  template <class G, class P,
            class = std::enable_if_t<
                !std::is_same_v<Convolution<T, Dims, MemorySpace, G, P>, Convolution>>>
  explicit Convolution(Convolution<T, Dims, MemorySpace, G, P> const& o) : Base(o) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return Dims == 2 ? "Conv2D" : "Conv3D"; }

  /*! \brief [out, (Do,) Ho, Wo] for an input [in, (D,) H, W].
   *  \param in the input shape
   *  \throws ShapeError for another rank or channel count, or a kernel larger
   *  than the padded input */
  Shape output_shape(Shape const& in) const { return shape_of(geometry(in)); }

  /*! \brief Builds for one slab of a sample split along its first spatial
   *  axis (spatial parallelism, telar/parallel/spatial_conv.hpp): \p in is the
   *  slab with its halo rows, \p front_padding zero rows precede it and
   *  \p back_padding follow it (the volume's faces; none inside it), and the
   *  layer computes \p out_rows rows.
   *  \param in the slab's shape \param front_padding zero rows before it
   *  \param back_padding zero rows after it \param out_rows output rows along
   *  the split axis
   *  \throws ShapeError when the windows of the output rows do not fit the
   *  padded slab, or as build for the other axes */
  void build_slab(Shape const& in, std::size_t front_padding, std::size_t back_padding,
                  std::size_t out_rows) {
    detail::ConvGeometry const g = geometry(in, long(front_padding), long(out_rows));
    // Rows past the slab read as zero (the kernels check bounds): the back
    // padding needs no setting, only room.
    long const last = long(out_rows - 1) * (Dims == 3 ? g.sd : g.sh) +
                      (Dims == 3 ? g.dd * (g.kd - 1) : g.dh * (g.kh - 1)) + 1;
    if (out_rows < 1 || last > long(front_padding + in[1] + back_padding))
      throw ShapeError(this->expected() + ": a slab of " + std::to_string(in[1]) +
                       " rows padded by " + std::to_string(front_padding) + " and " +
                       std::to_string(back_padding) + " cannot give " + std::to_string(out_rows) +
                       " output rows");
    this->g_ = g;
    (Dims == 3 ? this->g_.pd_end : this->g_.ph_end) = int(back_padding);
    this->built_ = true;
  }

  /*! \brief y = conv(x) + b. \param exec execution space instance
   *  \param x input [n, in * (D *) H * W] \param y output [n, out * (Do *) Ho * Wo]
   *  \param saved keeps x: a view, or (compact) x rounded to bf16, as the
   *  primitive read it */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               Saved& saved) const {
    check("forward", x.extent(0), x.extent(1), y.extent(0), y.extent(1));
    saved.x = saved.compact ? ConstMatrix<T, MemorySpace>() : x;
    saved.call = detail::next_conv_call();
#if TELAR_HAVE_ONEDNN
    if constexpr (std::is_same_v<typename Base::conv_policy, OneDnnConvBf16>)
      if (saved.compact) {
        bool const bf16 = detail::conv_extents_consistent(this->g_) &&
                          detail::bf16_check_isa("telar::Convolution (telar::OneDnnConvBf16)");
        if (bf16) // oneDNN copies x as its primitive converted it: once
          return this->engine_.forward(exec, this->g_, x, this->weight.data(), this->bias, y,
                                       saved.call, saved.kept.room(x.extent(0), x.extent(1)));
        saved.kept.keep(exec, x, false);
      }
#endif
    this->engine_.forward(exec, this->g_, x, this->weight.data(), this->bias, y, saved.call);
  }

  /*! \brief dx = col2im(W^T dy) (the saved input is not read; its call id lets
   *  oneDNN keep the converted dy for backward_weight).
   *  \param exec execution space instance \param dy gradient of the output
   *  \param dx gradient of the input \param saved the forward's state (its call id) */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      Saved const& saved) const {
    check("backward_input", dx.extent(0), dx.extent(1), dy.extent(0), dy.extent(1));
    this->engine_.backward_data(exec, this->g_, dy, this->weight.data(), dx, this->use_bias_,
                                saved.call);
  }

  /*! \brief dW += dy col(x)^T, db += sums of dy over positions.
   *  \param exec execution space instance \param dy gradient of the output
   *  \param saved the input of the matching forward */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Saved const& saved) const {
#if TELAR_HAVE_ONEDNN
    if constexpr (std::is_same_v<typename Base::conv_policy, OneDnnConvBf16>)
      if (saved.compact) {
        auto const& kept = saved.kept;
        check("backward_weight", kept.rows(), kept.cols(), dy.extent(0), dy.extent(1));
        if (kept.rounded())
          return this->engine_.backward_weights(exec, this->g_, kept.rows(), kept.words(),
                                                dy.data(), this->weight_grad.data(),
                                                this->bias_grad, saved.call);
        return this->engine_.backward_weights(exec, this->g_, kept.values(), dy,
                                              this->weight_grad.data(), this->bias_grad,
                                              saved.call);
      }
#endif
    check("backward_weight", saved.x.extent(0), saved.x.extent(1), dy.extent(0), dy.extent(1));
    this->engine_.backward_weights(exec, this->g_, saved.x, dy, this->weight_grad.data(),
                                   this->bias_grad, saved.call);
  }

private:
  // Sizes for input shape `in`, or ShapeError; a slab (out_rows >= 0) has
  // `front` zero rows before it along the first axis and `out_rows` outputs.
  detail::ConvGeometry geometry(Shape const& in, long front = 0, long out_rows = -1) const {
    if (in.rank != Dims + 1 || in[0] != this->in_)
      throw ShapeError(this->expected() + ", got " + in.str());
    detail::conv_check_settings<Dims>(name(), this->kernel_, this->stride_, this->dilation_);
    detail::ConvGeometry g;
    g.C = int(this->in_);
    g.Co = int(this->out_);
    g.G = int(this->groups_);
    for (std::size_t i = 0; i < Dims; ++i) {
      int const k = int(this->kernel_[i]), s = int(this->stride_[i]), d = int(this->dilation_[i]);
      int p = int(this->padding_[i]);
      long const out =
          i == 0 && out_rows >= 0 ? out_rows : detail::conv_out_extent(long(in[i + 1]), k, s, p, d);
      if (i == 0 && out_rows >= 0)
        p = int(front);
      if (out < 1)
        throw ShapeError(this->expected() + " whose spatial extents, padded, cover the kernel (" +
                         std::to_string(d * (k - 1) + 1) + "), got " + in.str());
      detail::conv_set_dim(g, int(i) + 3 - Dims, int(in[i + 1]), k, s, p, d, int(out));
    }
    return g;
  }
  static Shape shape_of(detail::ConvGeometry const& g) {
    if (Dims == 2)
      return Shape{std::size_t(g.Co), std::size_t(g.Ho), std::size_t(g.Wo)};
    return Shape{std::size_t(g.Co), std::size_t(g.Do), std::size_t(g.Ho), std::size_t(g.Wo)};
  }
  void check(char const* what, std::size_t xn, std::size_t xf, std::size_t yn,
             std::size_t yf) const {
    Base::check(what, std::size_t(this->g_.in_size()),
                std::size_t(this->g_.Co) * std::size_t(this->g_.P()), xn, xf, yn, yf);
  }
};

/*! \brief 2-D convolution over samples [C, H, W]:
 *  `Conv2D<T>(in, out, kernel, stride = 1, padding = 0, bias = true, dilation = 1, groups = 1)`.
 *  \tparam T value type \tparam MemorySpace memory space \tparam Gemm GEMM policy
 *  \tparam ConvPolicy convolution policy */
template <class T, class MemorySpace = DefaultMemorySpace, class Gemm = AutoGemm,
          class ConvPolicy = AutoConv>
using Conv2D = Convolution<T, 2, MemorySpace, Gemm, ConvPolicy>;

/*! \brief 3-D convolution over samples [C, D, H, W]:
 *  `Conv3D<T>(in, out, kernel, stride = 1, padding = 0, bias = true, dilation = 1, groups = 1)`.
 *  \tparam T value type \tparam MemorySpace memory space \tparam Gemm GEMM policy
 *  \tparam ConvPolicy convolution policy */
template <class T, class MemorySpace = DefaultMemorySpace, class Gemm = AutoGemm,
          class ConvPolicy = AutoConv>
using Conv3D = Convolution<T, 3, MemorySpace, Gemm, ConvPolicy>;

} // namespace telar
