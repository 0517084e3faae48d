#pragma once
// Internals of telar::SpatialConv: while the halo travels the layer runs
// over the whole extended slab, whose halo rows still hold the last call's
// values, so that its interior output rows (those whose windows read no
// halo row) are right; once the halo has arrived the rows at the two faces
// are computed again, each by a copy of the layer built for those rows
// alone. Recomputing a face row costs what it did (a few rows of a slab);
// the copies keep only a face's rows (not a second slab).
#include <telar/comm/detail/halo_rows.hpp>
#include <telar/comm/halo_plan.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/conv.hpp>
#include <telar/parallel/detail/spatial.hpp>
#include <telar/parallel/spatial_decomposition.hpp>

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>

namespace telar::detail {

// Only a plain convolution splits its output rows this way (a transposed
// convolution's windows run the other way; the U-Net's pools and
// upsamplings exchange no halo).
template <class L>
struct is_convolution : std::false_type {};
template <class T, int Dims, class M, class G, class P>
struct is_convolution<Convolution<T, Dims, M, G, P>> : std::true_type {};

// The output rows [o0, o1) of one face, the extended-slab rows [r0, r1)
// they read, and a copy of the layer built for those rows alone (packed:
// every channel's rows [r0, r1) one after the other), sharing the layer's
// weights.
template <class Conv>
struct RowPart {
  using T = typename Conv::value_type;
  using M = typename Conv::memory_space;
  std::size_t o0 = 0, o1 = 0, r0 = 0, r1 = 0;
  std::optional<Conv> conv; // (not every wrapped layer has a default state)
  Matrix<T, M> in, out;     // packed input rows, output rows
  typename layer_traits<Conv>::saved_type saved;
  bool empty() const { return o1 <= o0; }
};

// The faces of a convolution over a halo-extended slab: part 0 the output
// rows before the interior, part 2 those after (part 1, the interior, has
// rows but no layer: the whole layer computes it).
template <class Conv>
class RowParts {
  using T = typename Conv::value_type;
  using M = typename Conv::memory_space;

public:
  // The parts for `layer` (built for the whole extended slab `ext`), or
  // none (active() false) when the rank exchanges no halo or every output
  // row reads one.
  void build(Conv const& layer, Shape const& ext, Shape const& out, ConvAxis a, SlabWindow w,
             HaloPlan const& h) {
    active_ = false;
    long const E = long(h.extended_rows()), O = long(out[1]), s = long(a.stride);
    long const span = long(a.dilation * (a.kernel - 1) + 1), pf = long(w.pad_front);
    if (h.recv_lo + h.recv_hi == 0)
      return;
    // Output row o reads extended rows [o s - pf, o s - pf + span).
    auto const reads_lo = [&](long o) { return h.recv_lo > 0 && o * s - pf < long(h.recv_lo); };
    auto const reads_hi = [&](long o) {
      return h.recv_hi > 0 && o * s - pf + span > E - long(h.recv_hi);
    };
    long b = 0, e = O;
    while (b < O && reads_lo(b))
      ++b;
    while (e > b && reads_hi(e - 1))
      --e;
    if (e <= b)
      return;
    std::array<long, 4> const cut{0, b, e, O};
    for (std::size_t i = 0; i < 3; ++i) {
      RowPart<Conv>& p = parts_[i];
      p.o0 = std::size_t(cut[i]), p.o1 = std::size_t(cut[i + 1]);
      if (p.empty() || i == 1)
        continue;
      long const lo = cut[i] * s - pf, hi = (cut[i + 1] - 1) * s - pf + span;
      p.r0 = std::size_t(std::max(lo, 0L)), p.r1 = std::size_t(std::min(hi, E));
      p.conv.emplace(layer);
      Shape in = ext;
      in.dims[1] = p.r1 - p.r0;
      p.conv->build_slab(in, std::size_t(long(p.r0) - lo), std::size_t(hi - long(p.r1)),
                         p.o1 - p.o0);
    }
    in_ = ext, out_ = out;
    active_ = true;
  }

  bool active() const { return active_; }

  // Computes face i (0: before the interior, 2: after) of `layer` over the
  // extended slab `ext` into its rows of `y`.
  template <class Exec>
  void run(Exec const& exec, int i, Conv const& layer, ConstMatrix<T, M> ext, Matrix<T, M> y) {
    RowPart<Conv>& p = parts_[std::size_t(i)];
    if (!p.conv)
      return;
    std::size_t const n = ext.extent(0), plane = plane_of(in_), oplane = plane_of(out_);
    std::size_t const R = p.r1 - p.r0, Ro = p.o1 - p.o0;
    fit(p.in, n, in_[0] * R * plane, "telar::SpatialConv::part_input");
    fit(p.out, n, out_[0] * Ro * oplane, "telar::SpatialConv::part_output");
    copy_rows<T>(exec, {ext.data(), in_[1], p.r0}, {p.in.data(), R, 0}, R, n * in_[0], plane,
                 false);
    p.conv->weight = layer.weight, p.conv->bias = layer.bias; // shared, not copied
    p.conv->forward(exec, p.in, p.out, p.saved);
    copy_rows<T>(exec, {p.out.data(), Ro, 0}, {y.data(), out_[1], p.o0}, Ro, n * out_[0], oplane,
                 false);
  }

  // Bytes the faces keep between calls for `samples` samples: packed
  // inputs and outputs and each copy's own workspace.
  std::size_t workspace_bytes(std::size_t samples) const {
    if (!active_)
      return 0;
    std::size_t b = 0;
    for (RowPart<Conv> const& p : parts_) {
      if (!p.conv)
        continue;
      Shape in = in_;
      in.dims[1] = p.r1 - p.r0;
      b += view_bytes<T>(samples * in.size()) +
           view_bytes<T>(samples * out_[0] * (p.o1 - p.o0) * plane_of(out_)) +
           workspace_bytes_of(*p.conv, samples, in);
    }
    return b;
  }

  // Output rows of part i (tests and docs).
  std::array<std::size_t, 2> rows(int i) const {
    return {parts_[std::size_t(i)].o0, parts_[std::size_t(i)].o1};
  }

private:
  static std::size_t plane_of(Shape const& s) {
    std::size_t p = 1;
    for (int i = 2; i < s.rank; ++i)
      p *= s[std::size_t(i)];
    return p;
  }
  static void fit(Matrix<T, M>& m, std::size_t n, std::size_t cols, char const* label) {
    if (m.extent(0) != n || m.extent(1) != cols)
      m = Matrix<T, M>(std::string(label), n, cols);
  }
  std::array<RowPart<Conv>, 3> parts_{};
  Shape in_{}, out_{};
  bool active_ = false;
};

} // namespace telar::detail
