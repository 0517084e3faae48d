#pragma once
// Kernels of telar::BatchNorm. A batch [n, C * S] (S: the spatial size) holds
// n * C planes, plane (i, c) being channel c of sample i: S contiguous values
// (NCHW). Every kernel works plane by plane, so that each channel index is
// known once per plane (no division per value) and the S values are read in
// order; statistics are per channel, summed over the n planes of a channel.
#include <telar/core/detail/math.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>

namespace telar::detail {

// The batch's extents: C channels of S values, n samples.
struct ChannelGeometry {
  std::size_t channels = 0; // C
  std::size_t spatial = 1;  // S
  std::size_t samples = 0;  // n
  KOKKOS_INLINE_FUNCTION std::size_t count() const { return samples * spatial; }
  KOKKOS_INLINE_FUNCTION std::size_t planes() const { return samples * channels; }
};

// Both batches of a channel-wise layer's call ([an, ak] and [bn, bk]) are
// [n, channels * spatial], and the layer is initialised (`ready`); else
// an error naming `layer` ("telar::BatchNorm") and `what` ("forward").
inline void check_channel_batches(char const* layer, char const* what, std::size_t channels,
                                  bool ready, std::size_t an, std::size_t ak, std::size_t bn,
                                  std::size_t bk) {
  bool const ok = channels > 0 && ak > 0 && ak % channels == 0 && an == bn && ak == bk && ready;
  if (!ok)
    throw ShapeError(std::string(layer) + "::" + what + ": expected [n, " +
                     std::to_string(channels) + " * spatial] twice, got [" + std::to_string(an) +
                     ", " + std::to_string(ak) + "] and [" + std::to_string(bn) + ", " +
                     std::to_string(bk) + "]" + (ready ? "" : " (layer not initialised)"));
}

// One team per plane p = i C + c: f(team, i, c, first feature c S).
template <class Exec, class F>
void for_each_plane(char const* label, Exec const& exec, ChannelGeometry g, F f) {
  using Policy = Kokkos::TeamPolicy<Exec>;
  using Member = typename Policy::member_type;
  Kokkos::parallel_for(
      label, Policy(exec, int(g.planes()), Kokkos::AUTO), KOKKOS_LAMBDA(Member const& team) {
        std::size_t const p = std::size_t(team.league_rank());
        std::size_t const c = p % g.channels;
        f(team, p / g.channels, c, c * g.spatial);
      });
}

// Sum of term(k) over k in [0, s), split among the team: each thread adds
// chunks of 8 consecutive values as a tree, so a host thread has independent
// additions in flight instead of one chain bound by the add latency, and a
// device thread reads 8 contiguous values.
template <class Member, class Term>
KOKKOS_INLINE_FUNCTION auto plane_sum(Member const& team, std::size_t s, Term const& term) {
  using T = decltype(term(std::size_t(0)));
  constexpr std::size_t w = 8;
  T total = 0;
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(team, (s + w - 1) / w),
      [&](std::size_t b, T& acc) {
        std::size_t const k = b * w;
        if (k + w <= s) {
          T const s01 = term(k) + term(k + 1), s23 = term(k + 2) + term(k + 3);
          T const s45 = term(k + 4) + term(k + 5), s67 = term(k + 6) + term(k + 7);
          acc += (s01 + s23) + (s45 + s67);
        } else {
          for (std::size_t j = k; j < s; ++j)
            acc += term(j);
        }
      },
      total);
  return total;
}

// Per-plane partial sums [planes, 2] (BatchNormScratch's).
template <class T, class M>
using PlaneSums = Kokkos::View<T**, Kokkos::LayoutRight, M>;

// A BatchNorm's scratch, kept between calls (one call at a time per layer)
// and grown to the largest batch: the partial sums of its samples' planes
// and two per-channel sums (the variance's; backward's sum dy and sum dy
// x_hat). Allocated per call, it was the peak's unplanned 66 KB in the
// ResNet example; now it is the layer's workspace_bytes().
template <class T, class M>
struct BatchNormScratch {
  PlaneSums<T, M> planes;
  Vector<T, M> a, b;

  // Bytes for `samples` samples of `channels` channels.
  static std::size_t bytes(std::size_t samples, std::size_t channels) {
    return view_bytes<T>(2 * samples * channels) + 2 * view_bytes<T>(channels);
  }
  // Room for `samples` samples, a and b zeroed on `exec` (in order with its
  // kernels).
  template <class Exec>
  void prepare(Exec const& exec, std::size_t samples, std::size_t channels) {
    auto const uninitialised = [] { // only where one grows: no label built per call
      return Kokkos::view_alloc(Kokkos::WithoutInitializing,
                                std::string("telar::BatchNorm::workspace"));
    };
    if (planes.extent(0) < samples * channels)
      planes = PlaneSums<T, M>(uninitialised(), samples * channels, 2);
    if (a.extent(0) != channels) {
      a = Vector<T, M>(uninitialised(), channels);
      b = Vector<T, M>(uninitialised(), channels);
    }
    Kokkos::deep_copy(exec, a, T(0));
    Kokkos::deep_copy(exec, b, T(0));
  }
};

// a(c) = sum of term_a over channel c's values, and b(c) of term_b unless b
// is empty; term(i, c, f) reads feature f (of channel c) of sample i. Per-plane sums first
// (one pass over the batch, into `part`: at least g.planes() rows), then the
// n planes of each channel.
template <class Exec, class TermA, class TermB, class T, class M>
void channel_sums(char const* label, Exec const& exec, ChannelGeometry g, PlaneSums<T, M> part,
                  TermA term_a, Vector<T, M> a, TermB term_b, Vector<T, M> b) {
  using Member = typename Kokkos::TeamPolicy<Exec>::member_type;
  bool const two = b.extent(0) > 0;
  for_each_plane(
      label, exec, g,
      KOKKOS_LAMBDA(Member const& team, std::size_t i, std::size_t c, std::size_t f0) {
        std::size_t const p = i * g.channels + c;
        T const sa =
            plane_sum(team, g.spatial, [&](std::size_t k) { return term_a(i, c, f0 + k); });
        Kokkos::single(Kokkos::PerTeam(team), [&]() { part(p, 0) = sa; });
        if (two) {
          T const sb =
              plane_sum(team, g.spatial, [&](std::size_t k) { return term_b(i, c, f0 + k); });
          Kokkos::single(Kokkos::PerTeam(team), [&]() { part(p, 1) = sb; });
        }
      });
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<Exec>(exec, 0, g.channels), KOKKOS_LAMBDA(std::size_t c) {
        T sa = 0, sb = 0;
        for (std::size_t i = 0; i < g.samples; ++i) {
          sa += part(i * g.channels + c, 0);
          if (two)
            sb += part(i * g.channels + c, 1);
        }
        a(c) = sa;
        if (two)
          b(c) = sb;
      });
}

// out(c) = sum of x over channel c.
template <class Exec, class T, class M>
void batch_norm_sum(Exec const& exec, ConstMatrix<T, M> x, ChannelGeometry g, PlaneSums<T, M> part,
                    Vector<T, M> out) {
  auto const value = KOKKOS_LAMBDA(std::size_t i, std::size_t, std::size_t f) {
    return x(i, f);
  };
  channel_sums("telar::BatchNorm::sum", exec, g, part, value, out, value, Vector<T, M>());
}

// out(c) = sum of (x - mean[c])^2 over channel c.
template <class Exec, class T, class M>
void batch_norm_centred_squares(Exec const& exec, ConstMatrix<T, M> x, ChannelGeometry g,
                                PlaneSums<T, M> part, Vector<T, M> mean, Vector<T, M> out) {
  auto const square = KOKKOS_LAMBDA(std::size_t i, std::size_t c, std::size_t f) {
    T const d = x(i, f) - mean(c);
    return d * d;
  };
  channel_sums("telar::BatchNorm::centred_squares", exec, g, part, square, out, square,
               Vector<T, M>());
}

// a(c) = sum dy, b(c) = sum dy x_hat over channel c, in one pass.
template <class Exec, class T, class M>
void batch_norm_gradient_sums(Exec const& exec, ConstMatrix<T, M> dy, ConstMatrix<T, M> x,
                              Vector<T, M> mean, Vector<T, M> rstd, ChannelGeometry g,
                              PlaneSums<T, M> part, Vector<T, M> a, Vector<T, M> b) {
  channel_sums(
      "telar::BatchNorm::gradient_sums", exec, g, part,
      KOKKOS_LAMBDA(std::size_t i, std::size_t, std::size_t f) { return dy(i, f); }, a,
      KOKKOS_LAMBDA(std::size_t i, std::size_t c, std::size_t f) {
        return dy(i, f) * (x(i, f) - mean(c)) * rstd(c);
      },
      b);
}

// v *= s.
template <class Exec, class T, class M>
void batch_norm_scale(Exec const& exec, Vector<T, M> v, T s) {
  Kokkos::parallel_for(
      "telar::BatchNorm::scale", Kokkos::RangePolicy<Exec>(exec, 0, v.extent(0)),
      KOKKOS_LAMBDA(std::size_t c) { v(c) *= s; });
}

// y = (x - mean[c]) rstd[c] gamma[c] + beta[c], plane by plane.
template <class Exec, class T, class M>
void batch_norm_apply(Exec const& exec, ConstMatrix<T, M> x, Matrix<T, M> y, Vector<T, M> mean,
                      Vector<T, M> rstd, Vector<T, M> gamma, Vector<T, M> beta, std::size_t S) {
  using Member = typename Kokkos::TeamPolicy<Exec>::member_type;
  ChannelGeometry const g{gamma.extent(0), S, x.extent(0)};
  for_each_plane(
      "telar::BatchNorm::apply", exec, g,
      KOKKOS_LAMBDA(Member const& team, std::size_t i, std::size_t c, std::size_t f0) {
        T const m = mean(c), r = rstd(c), w = gamma(c), b = beta(c);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, S),
                             [&](std::size_t k) { y(i, f0 + k) = (x(i, f0 + k) - m) * r * w + b; });
      });
}

// Batch statistics from the channel sums: mean = sum / count, then
// rstd = 1 / sqrt(sq / count + eps) from the centred squares (sq holds them).
template <class Exec, class T, class M>
void batch_norm_rstd(Exec const& exec, Vector<T, M> sq, Vector<T, M> rstd, T count, T eps) {
  Kokkos::parallel_for(
      "telar::BatchNorm::rstd", Kokkos::RangePolicy<Exec>(exec, 0, sq.extent(0)),
      KOKKOS_LAMBDA(std::size_t c) { rstd(c) = T(1) / detail::sqrt(sq(c) / count + eps); });
}

// running = (1 - m) running + m batch, with the unbiased variance sq / (count - 1).
template <class Exec, class T, class M>
void batch_norm_update_running(Exec const& exec, Vector<T, M> running_mean,
                               Vector<T, M> running_var, Vector<T, M> mean, Vector<T, M> sq,
                               T count, T momentum) {
  Kokkos::parallel_for(
      "telar::BatchNorm::update_running",
      Kokkos::RangePolicy<Exec>(exec, 0, running_mean.extent(0)), KOKKOS_LAMBDA(std::size_t c) {
        running_mean(c) = (T(1) - momentum) * running_mean(c) + momentum * mean(c);
        running_var(c) = (T(1) - momentum) * running_var(c) + momentum * sq(c) / (count - T(1));
      });
}

// Fixed statistics (evaluation): mean = running_mean, rstd = 1 / sqrt(running_var + eps).
template <class Exec, class T, class M>
void batch_norm_fixed_stats(Exec const& exec, Vector<T, M> running_mean, Vector<T, M> running_var,
                            Vector<T, M> mean, Vector<T, M> rstd, T eps) {
  Kokkos::parallel_for(
      "telar::BatchNorm::fixed_stats", Kokkos::RangePolicy<Exec>(exec, 0, mean.extent(0)),
      KOKKOS_LAMBDA(std::size_t c) {
        mean(c) = running_mean(c);
        rstd(c) = T(1) / detail::sqrt(running_var(c) + eps);
      });
}

// dx = gamma rstd (dy - a / count - x_hat b / count), with a = sum dy and
// b = sum dy x_hat over the channel (batch statistics), or dx = gamma rstd dy
// (fixed statistics: a = b = 0), plane by plane.
template <class Exec, class T, class M>
void batch_norm_backward_input(Exec const& exec, ConstMatrix<T, M> dy, Matrix<T, M> dx,
                               ConstMatrix<T, M> x, Vector<T, M> mean, Vector<T, M> rstd,
                               Vector<T, M> gamma, Vector<T, M> a, Vector<T, M> b, T count,
                               std::size_t S) {
  using Member = typename Kokkos::TeamPolicy<Exec>::member_type;
  ChannelGeometry const g{gamma.extent(0), S, dy.extent(0)};
  for_each_plane(
      "telar::BatchNorm::backward_input", exec, g,
      KOKKOS_LAMBDA(Member const& team, std::size_t i, std::size_t c, std::size_t f0) {
        T const m = mean(c), r = rstd(c), scale = gamma(c) * r;
        T const da = a(c) / count, db = b(c) / count;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, S), [&](std::size_t k) {
          T const xh = (x(i, f0 + k) - m) * r;
          dx(i, f0 + k) = scale * (dy(i, f0 + k) - da - xh * db);
        });
      });
}

// out += in, element-wise (gradients accumulate).
template <class Exec, class T, class M>
void batch_norm_accumulate(Exec const& exec, Vector<T, M> out, Vector<T, M> in) {
  Kokkos::parallel_for(
      "telar::BatchNorm::accumulate", Kokkos::RangePolicy<Exec>(exec, 0, out.extent(0)),
      KOKKOS_LAMBDA(std::size_t c) { out(c) += in(c); });
}

} // namespace telar::detail
