#pragma once
// Kernels of telar::BatchNorm. A batch [n, C * S] (S: the spatial size) is
// read as n * S values per channel; statistics are per channel.
#include <telar/core/detail/math.hpp>
#include <telar/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace telar::detail {

// Where channel c's values lie in a batch [n, C * S].
struct ChannelGeometry {
  std::size_t channels = 0; // C
  std::size_t spatial = 1;  // S
  std::size_t samples = 0;  // n
  KOKKOS_INLINE_FUNCTION std::size_t count() const { return samples * spatial; }
  // Value m (0 <= m < n S) of channel c: sample m / S, feature c S + m % S.
  KOKKOS_INLINE_FUNCTION void at(std::size_t c, std::size_t m, std::size_t& i,
                                 std::size_t& f) const {
    i = m / spatial;
    f = c * spatial + m % spatial;
  }
};

// out(c) = sum over channel c's values of term(i, f): one team per channel
// (core/detail/column_sums.hpp sums columns, which is this only when S = 1).
template <class Exec, class Term, class Out>
void channel_sums(char const* label, Exec const& exec, ChannelGeometry g, Term term, Out out) {
  using T = typename Out::non_const_value_type;
  using Policy = Kokkos::TeamPolicy<Exec>;
  using Member = typename Policy::member_type;
  Kokkos::parallel_for(
      label, Policy(exec, int(g.channels), Kokkos::AUTO), KOKKOS_LAMBDA(Member const& team) {
        std::size_t const c = std::size_t(team.league_rank());
        T s = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, g.count()),
            [&](std::size_t m, T& acc) {
              std::size_t i = 0, f = 0;
              g.at(c, m, i, f);
              acc += term(i, f);
            },
            s);
        Kokkos::single(Kokkos::PerTeam(team), [&]() { out(c) = s; });
      });
}

// out(c) = sum of x over channel c.
template <class Exec, class T, class M>
void batch_norm_sum(Exec const& exec, ConstMatrix<T, M> x, ChannelGeometry g, Vector<T, M> out) {
  channel_sums(
      "telar::BatchNorm::sum", exec, g,
      KOKKOS_LAMBDA(std::size_t i, std::size_t f) { return x(i, f); }, out);
}

// out(c) = sum of (x - mean[c])^2 over channel c.
template <class Exec, class T, class M>
void batch_norm_centred_squares(Exec const& exec, ConstMatrix<T, M> x, ChannelGeometry g,
                                Vector<T, M> mean, Vector<T, M> out) {
  std::size_t const S = g.spatial;
  channel_sums(
      "telar::BatchNorm::centred_squares", exec, g,
      KOKKOS_LAMBDA(std::size_t i, std::size_t f) {
        T const d = x(i, f) - mean(f / S);
        return d * d;
      },
      out);
}

// a(c) = sum dy, b(c) = sum dy x_hat over channel c.
template <class Exec, class T, class M>
void batch_norm_gradient_sums(Exec const& exec, ConstMatrix<T, M> dy, ConstMatrix<T, M> x,
                              Vector<T, M> mean, Vector<T, M> rstd, ChannelGeometry g,
                              Vector<T, M> a, Vector<T, M> b) {
  std::size_t const S = g.spatial;
  channel_sums(
      "telar::BatchNorm::sum_dy", exec, g,
      KOKKOS_LAMBDA(std::size_t i, std::size_t f) { return dy(i, f); }, a);
  channel_sums(
      "telar::BatchNorm::sum_dy_xhat", exec, g,
      KOKKOS_LAMBDA(std::size_t i, std::size_t f) {
        std::size_t const c = f / S;
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

// y = (x - mean[c]) rstd[c] gamma[c] + beta[c].
template <class Exec, class T, class M>
void batch_norm_apply(Exec const& exec, ConstMatrix<T, M> x, Matrix<T, M> y, Vector<T, M> mean,
                      Vector<T, M> rstd, Vector<T, M> gamma, Vector<T, M> beta, std::size_t S) {
  Kokkos::parallel_for(
      "telar::BatchNorm::apply",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {x.extent(0), x.extent(1)}),
      KOKKOS_LAMBDA(std::size_t i, std::size_t f) {
        std::size_t const c = f / S;
        y(i, f) = (x(i, f) - mean(c)) * rstd(c) * gamma(c) + beta(c);
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
// (fixed statistics: a = b = 0).
template <class Exec, class T, class M>
void batch_norm_backward_input(Exec const& exec, ConstMatrix<T, M> dy, Matrix<T, M> dx,
                               ConstMatrix<T, M> x, Vector<T, M> mean, Vector<T, M> rstd,
                               Vector<T, M> gamma, Vector<T, M> a, Vector<T, M> b, T count,
                               std::size_t S) {
  Kokkos::parallel_for(
      "telar::BatchNorm::backward_input",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {dy.extent(0), dy.extent(1)}),
      KOKKOS_LAMBDA(std::size_t i, std::size_t f) {
        std::size_t const c = f / S;
        T const xh = (x(i, f) - mean(c)) * rstd(c);
        dx(i, f) = gamma(c) * rstd(c) * (dy(i, f) - a(c) / count - xh * b(c) / count);
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
