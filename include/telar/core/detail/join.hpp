#pragma once
// How the branches of a block join: a sum (telar::Add, telar::Residual), a
// product (telar::Mul) or a concatenation along channels (telar::Concat,
// telar::DenseConcat). Each join says which output shape the branches give,
// writes y from the branch outputs, and gives each branch its output
// gradient. Sums and products broadcast a branch that gives one value per
// channel ([C] or [C, 1, 1] against [C, H, W]).
#include <telar/core/detail/host_simd.hpp>
#include <telar/core/error.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace telar::detail {

enum class JoinOp { assign, add, mul };

// dst[i, j] (op)= src[i, j / r], src of [n, k / r]: a per-channel branch
// spreads its value over the channel's r positions (r = 1: same shape).
template <class Exec, class D, class S>
void join_into(Exec const& exec, D const& dst, S const& src, JoinOp op) {
  std::size_t const k = dst.extent(1), ks = src.extent(1), r = k / ks;
  auto* d = dst.data();
  auto const* s = src.data();
  if (ks == k) { // the same shape: no index arithmetic (see join_pair)
    Kokkos::RangePolicy<Exec> const all(exec, 0, dst.extent(0) * k);
    if (op == JoinOp::assign)
      Kokkos::parallel_for(
          "telar::join", all, KOKKOS_LAMBDA(std::size_t i) { d[i] = s[i]; });
    else if (op == JoinOp::add)
      Kokkos::parallel_for(
          "telar::join", all, KOKKOS_LAMBDA(std::size_t i) { d[i] += s[i]; });
    else
      Kokkos::parallel_for(
          "telar::join", all, KOKKOS_LAMBDA(std::size_t i) { d[i] *= s[i]; });
    return;
  }
  Kokkos::parallel_for(
      "telar::join", Kokkos::RangePolicy<Exec>(exec, 0, dst.extent(0) * k),
      KOKKOS_LAMBDA(std::size_t i) {
        auto const v = s[(i / k) * ks + (i % k) / r];
        if (op == JoinOp::assign)
          d[i] = v;
        else if (op == JoinOp::add)
          d[i] += v;
        else
          d[i] *= v;
      });
}

// dst = a (op) b, both spread as in join_into: the common two-branch case in
// one pass.
template <class Exec, class D, class A, class B>
void join_pair(Exec const& exec, D const& dst, A const& a, B const& b, JoinOp op) {
  std::size_t const k = dst.extent(1), ka = a.extent(1), kb = b.extent(1);
  std::size_t const ra = k / ka, rb = k / kb;
  auto* d = dst.data();
  auto const* pa = a.data();
  auto const* pb = b.data();
  if (ka == k && kb == k) { // the same shapes (every residual sum): the four
    // 64-bit divisions per value below made ResNet-50's sums 4x slower
    std::size_t const all = dst.extent(0) * k;
    if (op == JoinOp::mul)
      simd_for(
          "telar::join", exec, all, KOKKOS_LAMBDA(std::size_t i) { d[i] = pa[i] * pb[i]; });
    else
      simd_for(
          "telar::join", exec, all, KOKKOS_LAMBDA(std::size_t i) { d[i] = pa[i] + pb[i]; });
    return;
  }
  Kokkos::parallel_for(
      "telar::join", Kokkos::RangePolicy<Exec>(exec, 0, dst.extent(0) * k),
      KOKKOS_LAMBDA(std::size_t i) {
        std::size_t const row = i / k, col = i % k;
        auto const u = pa[row * ka + col / ra], v = pb[row * kb + col / rb];
        d[i] = op == JoinOp::mul ? u * v : u + v;
      });
}

// g[i, c] = sum over the channel's r positions of t[i, c * r + p]: the
// gradient of a per-channel branch. Summed in order: deterministic.
template <class Exec, class G, class S>
void sum_per_channel(Exec const& exec, G const& g, S const& t) {
  std::size_t const r = t.extent(1) / g.extent(1);
  auto* pg = g.data();
  auto const* pt = t.data();
  Kokkos::parallel_for(
      "telar::sum_per_channel", Kokkos::RangePolicy<Exec>(exec, 0, g.size()),
      KOKKOS_LAMBDA(std::size_t i) {
        auto s = pt[i * r];
        for (std::size_t p = 1; p < r; ++p)
          s += pt[i * r + p];
        pg[i] = s;
      });
}

// dst[:, dst_off + c] = src[:, src_off + c] for c < width: a branch's
// channels in the concatenated rows (a sample's [C, ...] is contiguous, so
// its channels are one run of columns).
template <class Exec, class D, class S>
void copy_columns(Exec const& exec, D const& dst, std::size_t dst_off, S const& src,
                  std::size_t src_off, std::size_t width) {
  std::size_t const kd = dst.extent(1), ks = src.extent(1);
  auto* d = dst.data();
  auto const* s = src.data();
  Kokkos::parallel_for(
      "telar::copy_columns", Kokkos::RangePolicy<Exec>(exec, 0, dst.extent(0) * width),
      KOKKOS_LAMBDA(std::size_t i) {
        std::size_t const row = i / width, c = i % width;
        d[row * kd + dst_off + c] = s[row * ks + src_off + c];
      });
}

// [C] or [C, 1, ..., 1] against a full [C, ...] of rank 2 or more.
inline bool per_channel(Shape const& s, Shape const& full) {
  if (full.rank < 2 || s[0] != full[0] || (s.rank != 1 && s.rank != full.rank))
    return false;
  for (int d = 1; d < s.rank; ++d)
    if (s[d] != 1)
      return false;
  return true;
}

// Sums and products: every branch gives the full shape or one value per channel.
template <JoinOp Op>
struct ElementwiseJoin {
  // The largest branch output; the others equal it or are per channel.
  static Shape shape(char const* block, Shape const&, std::vector<Shape> const& outs,
                     std::vector<std::string> const& labels) {
    std::size_t big = 0;
    for (std::size_t i = 1; i < outs.size(); ++i)
      if (outs[i].size() > outs[big].size())
        big = i;
    for (std::size_t i = 0; i < outs.size(); ++i)
      if (outs[i] != outs[big] && !per_channel(outs[i], outs[big]))
        throw ShapeError(std::string("telar::") + block + ": " + labels[i] + " gives " +
                         outs[i].str() + " but " + labels[big] + " gives " + outs[big].str() +
                         "; a branch must give the same shape or one value per channel ([" +
                         std::to_string(outs[big][0]) + "] or [" + std::to_string(outs[big][0]) +
                         ", 1, ...])");
    return outs[big];
  }
  // A sum hands a full-shape branch dy itself; everything else gets a buffer.
  static bool grad_buffer(std::size_t spread) { return Op == JoinOp::mul || spread > 1; }
  // A product's per-channel branch sums a full-size term.
  static bool join_buffer(bool any_spread) { return Op == JoinOp::mul && any_spread; }

  template <class Exec, class Outs, class Y>
  static void forward(Exec const& exec, Outs const& outs, Y const& y) {
    if (outs.size() == 1)
      join_into(exec, y, outs[0], JoinOp::assign);
    else
      join_pair(exec, y, outs[0], outs[1], Op);
    for (std::size_t i = 2; i < outs.size(); ++i)
      join_into(exec, y, outs[i], Op);
  }
  // d(sum)/d out_i = dy; d(product)/d out_i = dy times the other outputs;
  // summed over the channel for a per-channel branch.
  template <class Exec, class Dy, class Outs, class Grads, class M>
  static void grads(Exec const& exec, Dy const& dy, Outs const& outs, Grads& g, M const& join) {
    for (std::size_t i = 0; i < outs.size(); ++i) {
      bool const spread = outs[i].extent(1) != dy.extent(1);
      if constexpr (Op == JoinOp::add) {
        if (spread)
          sum_per_channel(exec, g[i], dy);
      } else {
        auto const term = spread ? join : g[i];
        Kokkos::deep_copy(exec, term, dy);
        for (std::size_t m = 0; m < outs.size(); ++m)
          if (m != i)
            join_into(exec, term, outs[m], JoinOp::mul);
        if (spread)
          sum_per_channel(exec, g[i], term);
      }
    }
  }
};

using SumJoin = ElementwiseJoin<JoinOp::add>;
using ProductJoin = ElementwiseJoin<JoinOp::mul>;

// Concatenation along the first (channel) dimension.
struct ConcatJoin {
  // Channels add up; every other dimension must agree.
  static Shape shape(char const* block, Shape const&, std::vector<Shape> const& outs,
                     std::vector<std::string> const& labels) {
    Shape out = outs[0];
    for (std::size_t i = 1; i < outs.size(); ++i) {
      bool same = outs[i].rank == out.rank;
      for (int d = 1; same && d < out.rank; ++d)
        same = outs[i][d] == out[d];
      if (!same)
        throw ShapeError(std::string("telar::") + block + ": " + labels[i] + " gives " +
                         outs[i].str() + " but " + labels[0] + " gives " + outs[0].str() +
                         "; to concatenate along channels all dimensions but the first must agree");
      out.dims[0] += outs[i][0];
    }
    return out;
  }
  static bool grad_buffer(std::size_t) { return true; }
  static bool join_buffer(bool) { return false; }

  template <class Exec, class Outs, class Y>
  static void forward(Exec const& exec, Outs const& outs, Y const& y) {
    std::size_t off = 0;
    for (auto const& o : outs) {
      copy_columns(exec, y, off, o, 0, o.extent(1));
      off += o.extent(1);
    }
  }
  // Each branch's channels of dy.
  template <class Exec, class Dy, class Outs, class Grads, class M>
  static void grads(Exec const& exec, Dy const& dy, Outs const& outs, Grads& g, M const&) {
    std::size_t off = 0;
    for (std::size_t i = 0; i < outs.size(); ++i) {
      copy_columns(exec, g[i], 0, dy, off, outs[i].extent(1));
      off += outs[i].extent(1);
    }
  }
};

// Parameters "<branch>.<name>", messages "branch <i> (<Name>)": a PyTorch
// module holding its branches in an nn.ModuleList-like container.
struct IndexedBranches {
  static std::string prefix(std::size_t i) { return std::to_string(i) + "."; }
  static std::string label(std::size_t i, std::string const& name) {
    return "branch " + std::to_string(i) + " (" + name + ")";
  }
};

struct AddKind : SumJoin, IndexedBranches {
  static constexpr char const* name() { return "Add"; }
};
struct MulKind : ProductJoin, IndexedBranches {
  static constexpr char const* name() { return "Mul"; }
};
struct ConcatKind : ConcatJoin, IndexedBranches {
  static constexpr char const* name() { return "Concat"; }
};
// x joined with body(x): the body's parameters keep their own names, as a
// DenseNet layer's or telar::Residual's.
struct DenseConcatKind : ConcatJoin {
  static constexpr char const* name() { return "DenseConcat"; }
  static std::string prefix(std::size_t) { return ""; }
  static std::string label(std::size_t i, std::string const&) {
    return i == 0 ? "the input" : "the body";
  }
};
// body(x) + shortcut(x): the body's parameters "<i>.<name>", the
// projection's "shortcut.<name>"; no broadcasting.
template <bool Projected>
struct ResidualKind : SumJoin {
  static constexpr char const* name() { return Projected ? "ProjectedResidual" : "Residual"; }
  static std::string prefix(std::size_t i) { return i == 0 ? "" : "shortcut."; }
  static std::string label(std::size_t i, std::string const&) {
    return i == 0 ? "the body" : "the projection";
  }
  static Shape shape(char const*, Shape const& in, std::vector<Shape> const& outs,
                     std::vector<std::string> const&) {
    if (Projected && outs[1] != outs[0])
      throw ShapeError("the body gives " + outs[0].str() + " but the projection " + outs[1].str());
    if (!Projected && outs[0] != in)
      throw ShapeError("the body turns " + in.str() + " into " + outs[0].str() +
                       "; use telar::ProjectedResidual to add a projection of the input");
    return outs[0];
  }
};

} // namespace telar::detail
