#pragma once
/*! \file
 *  \brief Per-sample normalisation layers: telar::LayerNorm,
 *  telar::RMSNorm and telar::GroupNorm.
 *
 *  Both compute their statistics within one sample, so a sample's output does
 *  not depend on the rest of the batch: they give the same result whatever the
 *  micro-batching or data-parallel split, with no communication.
 *
 *  BatchNorm, whose statistics are over the batch, is in
 *  telar/layers/batch_norm.hpp: under data parallelism it needs a statistics
 *  policy (telar::LocalStats or telar::SyncStats) to say over which batch.
 */
#include <telar/core/detail/column_sums.hpp>
#include <telar/core/detail/host_simd.hpp>
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/detail/math.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/detail/batch_norm.hpp>

#include <cstdint>
#include <string>

namespace telar {

namespace detail {

// A batch [n, sample] is cut into rows of `row` consecutive values, each
// normalised on its own (LayerNorm: the last extent; GroupNorm: one group's
// channels x spatial). Value f of a sample uses affine parameter
// (f / stride) % params (LayerNorm: stride 1, params = row; GroupNorm:
// stride = spatial size, params = channels).
struct NormGeometry {
  std::size_t row = 0;    // values normalised together
  std::size_t sample = 0; // values per sample
  std::size_t stride = 1; // consecutive values sharing one parameter
  std::size_t params = 0; // affine parameters (0: none)
  KOKKOS_INLINE_FUNCTION bool affine() const { return params > 0; }
  // Value j of every row uses parameter j (LayerNorm): no index arithmetic.
  KOKKOS_INLINE_FUNCTION bool direct() const { return stride == 1 && params == row; }
  // Rows in a batch of n samples.
  KOKKOS_INLINE_FUNCTION std::size_t rows(std::size_t n) const { return n * sample / row; }
  // The parameter of value f, the j-th of its row.
  KOKKOS_INLINE_FUNCTION std::size_t param(std::size_t f, std::size_t j) const {
    return direct() ? j : f / stride % params;
  }
};

// One team per row r of a batch of n samples: f(team, r, i, f0), row r being
// values [f0, f0 + g.row) of sample i.
template <class Exec, class F>
void for_each_norm_row(char const* label, Exec const& exec, NormGeometry g, std::size_t n, F f) {
  using Policy = Kokkos::TeamPolicy<Exec>;
  using Member = typename Policy::member_type;
  Kokkos::parallel_for(
      label, Policy(exec, int(g.rows(n)), Kokkos::AUTO), KOKKOS_LAMBDA(Member const& team) {
        std::size_t const r = std::size_t(team.league_rank());
        f(team, r, r * g.row / g.sample, r * g.row % g.sample);
      });
}

// On the host, LayerNorm's rows (parameter j for value j) are one call each
// of a simd_for, their loops over plain pointers vectorised 16 wide where
// the CPU has AVX-512, their sums in lane_sum's order; on devices, and for
// GroupNorm's geometry, a row is a team's.
template <class Exec, class T, class M>
void norm_forward_rows(Exec const& exec, ConstMatrix<T, M> x, Matrix<T, M> y, Vector<T, M> mean,
                       Vector<T, M> rstd, Vector<T, M> gamma, Vector<T, M> beta, NormGeometry g,
                       T eps) {
  simd_for(
      "telar::normalization::forward", exec, g.rows(x.extent(0)),
      [=](std::size_t r) {
        std::size_t const n = g.row, i = r * n / g.sample, f0 = r * n % g.sample;
        T const* xr = &x(i, f0);
        T* yr = &y(i, f0);
        T const *ga = gamma.data(), *be = beta.data();
        T const mu = lane_sum<T>(n, [&](std::size_t j) { return xr[j]; }) / T(n);
        T const sq = lane_sum<T>(n, [&](std::size_t j) { return (xr[j] - mu) * (xr[j] - mu); });
        T const rs = T(1) / detail::sqrt(sq / T(n) + eps);
        mean(r) = mu;
        rstd(r) = rs;
        for (std::size_t j = 0; j < n; ++j)
          yr[j] = (xr[j] - mu) * rs * ga[j] + be[j];
      },
      1);
}

template <class Exec, class T, class M>
void norm_backward_input_rows(Exec const& exec, ConstMatrix<T, M> dy, Matrix<T, M> dx,
                              ConstMatrix<T, M> x, Vector<T, M> mean, Vector<T, M> rstd,
                              Vector<T, M> gamma, NormGeometry g) {
  simd_for(
      "telar::normalization::backward_input", exec, g.rows(dy.extent(0)),
      [=](std::size_t r) {
        std::size_t const n = g.row, i = r * n / g.sample, f0 = r * n % g.sample;
        T const *dyr = &dy(i, f0), *xr = &x(i, f0), *ga = gamma.data();
        T* dxr = &dx(i, f0);
        T const mu = mean(r), rs = rstd(r);
        T const a = lane_sum<T>(n, [&](std::size_t j) { return dyr[j] * ga[j]; }) / T(n);
        T const b =
            lane_sum<T>(n, [&](std::size_t j) { return dyr[j] * ga[j] * (xr[j] - mu) * rs; }) /
            T(n);
        for (std::size_t j = 0; j < n; ++j)
          dxr[j] = rs * (dyr[j] * ga[j] - a - (xr[j] - mu) * rs * b);
      },
      1);
}

// Kernels as free functions (nvcc rejects extended lambdas in private member
// functions); views captured by value.
template <class Exec, class T, class M>
void norm_forward(Exec const& exec, ConstMatrix<T, M> x, Matrix<T, M> y, Vector<T, M> mean,
                  Vector<T, M> rstd, Vector<T, M> gamma, Vector<T, M> beta, NormGeometry g, T eps) {
  if constexpr (runs_on_host_v<Exec>) {
    if (g.direct())
      return norm_forward_rows(exec, x, y, mean, rstd, gamma, beta, g, eps);
  }
  using Member = typename Kokkos::TeamPolicy<Exec>::member_type;
  for_each_norm_row(
      "telar::normalization::forward", exec, g, x.extent(0),
      KOKKOS_LAMBDA(Member const& team, std::size_t r, std::size_t i, std::size_t f0) {
        T sum = 0, sq = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, g.row),
            [&](std::size_t j, T& acc) { acc += x(i, f0 + j); }, sum);
        T const mu = sum / T(g.row);
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, g.row),
            [&](std::size_t j, T& acc) {
              T const d = x(i, f0 + j) - mu;
              acc += d * d;
            },
            sq);
        T const rs = T(1) / detail::sqrt(sq / T(g.row) + eps);
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          mean(r) = mu;
          rstd(r) = rs;
        });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, g.row), [&](std::size_t j) {
          std::size_t const f = f0 + j;
          T const xh = (x(i, f) - mu) * rs;
          if (g.affine()) {
            std::size_t const p = g.param(f, j);
            y(i, f) = xh * gamma(p) + beta(p);
          } else {
            y(i, f) = xh;
          }
        });
      });
}

// dx = rstd (dxh - mean(dxh) - xh mean(dxh xh)), dxh = dy gamma.
template <class Exec, class T, class M>
void norm_backward_input(Exec const& exec, ConstMatrix<T, M> dy, Matrix<T, M> dx,
                         ConstMatrix<T, M> x, Vector<T, M> mean, Vector<T, M> rstd,
                         Vector<T, M> gamma, NormGeometry g) {
  if constexpr (runs_on_host_v<Exec>) {
    if (g.direct())
      return norm_backward_input_rows(exec, dy, dx, x, mean, rstd, gamma, g);
  }
  using Member = typename Kokkos::TeamPolicy<Exec>::member_type;
  for_each_norm_row(
      "telar::normalization::backward_input", exec, g, dy.extent(0),
      KOKKOS_LAMBDA(Member const& team, std::size_t r, std::size_t i, std::size_t f0) {
        T const mu = mean(r), rs = rstd(r);
        auto dxh = [&](std::size_t f) {
          return g.affine() ? dy(i, f) * gamma(g.param(f, f - f0)) : dy(i, f);
        };
        T a = 0, b = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, g.row),
            [&](std::size_t j, T& acc) { acc += dxh(f0 + j); }, a);
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, g.row),
            [&](std::size_t j, T& acc) {
              std::size_t const f = f0 + j;
              acc += dxh(f) * (x(i, f) - mu) * rs;
            },
            b);
        a /= T(g.row);
        b /= T(g.row);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, g.row), [&](std::size_t j) {
          std::size_t const f = f0 + j;
          dx(i, f) = rs * (dxh(f) - a - (x(i, f) - mu) * rs * b);
        });
      });
}

// dgamma[p] += sum dy xh, dbeta[p] += sum dy over the values using p:
// column sums for LayerNorm's rows, else one team per parameter.
template <class Exec, class T, class M>
void norm_backward_weight(Exec const& exec, ConstMatrix<T, M> dy, ConstMatrix<T, M> x,
                          Vector<T, M> mean, Vector<T, M> rstd, Vector<T, M> gamma_grad,
                          Vector<T, M> beta_grad, NormGeometry g) {
  if (g.direct()) { // rows of P values, parameter j for value j
    std::size_t const rows = g.rows(dy.extent(0));
    auto const dyr = as_rows(dy, rows, g.row);
    auto const xr = as_rows(x, rows, g.row);
    add_column_sums(
        "telar::normalization::backward_gamma", exec, rows, g.row,
        KOKKOS_LAMBDA(std::size_t r, std::size_t j) {
          return dyr(r, j) * (xr(r, j) - mean(r)) * rstd(r);
        },
        gamma_grad);
    add_column_sums(
        "telar::normalization::backward_beta", exec, rows, g.row,
        KOKKOS_LAMBDA(std::size_t r, std::size_t j) { return dyr(r, j); }, beta_grad);
    return;
  }
  using Policy = Kokkos::TeamPolicy<Exec>;
  using Member = typename Policy::member_type;
  std::size_t const n = dy.extent(0), S = g.stride, P = g.params;
  std::size_t const Q = g.sample / (S * P); // repeats of the parameter pattern per sample
  std::size_t const per = n * Q * S;
  Kokkos::parallel_for(
      "telar::normalization::backward_weight", Policy(exec, int(P), Kokkos::AUTO),
      KOKKOS_LAMBDA(Member const& team) {
        std::size_t const p = std::size_t(team.league_rank());
        auto at = [&](std::size_t m, std::size_t& i, std::size_t& f) {
          i = m / (Q * S);
          std::size_t const rem = m % (Q * S);
          f = (rem / S * P + p) * S + rem % S;
        };
        T dg = 0, db = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, per),
            [&](std::size_t m, T& acc) {
              std::size_t i = 0, f = 0;
              at(m, i, f);
              std::size_t const r = (i * g.sample + f) / g.row;
              acc += dy(i, f) * (x(i, f) - mean(r)) * rstd(r);
            },
            dg);
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, per),
            [&](std::size_t m, T& acc) {
              std::size_t i = 0, f = 0;
              at(m, i, f);
              acc += dy(i, f);
            },
            db);
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          gamma_grad(p) += dg;
          beta_grad(p) += db;
        });
      });
}

// Allocates (or keeps) the per-row statistics `what` of a saved state of
// `layer`; the label is built only when it allocates.
template <class T, class M>
void norm_ensure(Vector<T, M>& v, std::size_t rows, char const* layer, char const* what) {
  if (v.extent(0) != rows)
    v = Vector<T, M>(Kokkos::view_alloc(Kokkos::WithoutInitializing,
                                        std::string("telar::") + layer + "::" + what),
                     rows);
}

template <class T, class M>
void norm_allocate(Vector<T, M>& w, Vector<T, M>& wg, Vector<T, M>& b, Vector<T, M>& bg,
                   std::size_t size, char const* api) {
  std::string const a(api);
  w = Vector<T, M>(a + "::weight", size);
  wg = Vector<T, M>(a + "::weight_grad", size);
  b = Vector<T, M>(a + "::bias", size);
  bg = Vector<T, M>(a + "::bias_grad", size);
  Kokkos::deep_copy(w, T(1));
}

// RMSNorm over rows of `row` values: y = gamma * x * rstd, rstd = 1 /
// sqrt(mean(x^2) + eps). One team per row.
template <class Exec, class T, class M>
void rms_forward(Exec const& exec, ConstMatrix<T, M> x, Matrix<T, M> y, Vector<T, M> rstd,
                 Vector<T, M> gamma, std::size_t row, T eps) {
  using Policy = Kokkos::TeamPolicy<Exec>;
  using Member = typename Policy::member_type;
  auto const xr = as_rows(x, rstd.extent(0), row);
  auto const yr = as_rows(y, rstd.extent(0), row);
  Kokkos::parallel_for(
      "telar::RMSNorm::forward", Policy(exec, int(rstd.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(Member const& team) {
        std::size_t const r = std::size_t(team.league_rank());
        T sq = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, row),
            [&](std::size_t j, T& acc) { acc += xr(r, j) * xr(r, j); }, sq);
        T const rs = T(1) / detail::sqrt(sq / T(row) + eps);
        Kokkos::single(Kokkos::PerTeam(team), [&]() { rstd(r) = rs; });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, row),
                             [&](std::size_t j) { yr(r, j) = xr(r, j) * rs * gamma(j); });
      });
}

// dx = rstd (g - xh mean(g xh)), g = dy gamma, xh = x rstd.
template <class Exec, class T, class M>
void rms_backward_input(Exec const& exec, ConstMatrix<T, M> dy, Matrix<T, M> dx,
                        ConstMatrix<T, M> x, Vector<T, M> rstd, Vector<T, M> gamma,
                        std::size_t row) {
  using Policy = Kokkos::TeamPolicy<Exec>;
  using Member = typename Policy::member_type;
  std::size_t const rows = rstd.extent(0);
  auto const dyr = as_rows(dy, rows, row);
  auto const dxr = as_rows(dx, rows, row);
  auto const xr = as_rows(x, rows, row);
  Kokkos::parallel_for(
      "telar::RMSNorm::backward_input", Policy(exec, int(rows), Kokkos::AUTO),
      KOKKOS_LAMBDA(Member const& team) {
        std::size_t const r = std::size_t(team.league_rank());
        T const rs = rstd(r);
        T a = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, row),
            [&](std::size_t j, T& acc) { acc += dyr(r, j) * gamma(j) * xr(r, j) * rs; }, a);
        a /= T(row);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, row), [&](std::size_t j) {
          dxr(r, j) = rs * (dyr(r, j) * gamma(j) - xr(r, j) * rs * a);
        });
      });
}

// dgamma[j] += sum over rows of dy xh.
template <class Exec, class T, class M>
void rms_backward_weight(Exec const& exec, ConstMatrix<T, M> dy, ConstMatrix<T, M> x,
                         Vector<T, M> rstd, Vector<T, M> gamma_grad, std::size_t row) {
  std::size_t const rows = rstd.extent(0);
  auto const dyr = as_rows(dy, rows, row);
  auto const xr = as_rows(x, rows, row);
  add_column_sums(
      "telar::RMSNorm::backward_weight", exec, rows, row,
      KOKKOS_LAMBDA(std::size_t r, std::size_t j) { return dyr(r, j) * xr(r, j) * rstd(r); },
      gamma_grad);
}

// ShapeError unless a [an, ak] and b [bn, bk] are the same [n, k * size] and
// gamma has its size (LayerNorm, RMSNorm: rows of `size` values).
inline void norm_check_rows(char const* layer, char const* what, std::size_t size,
                            std::size_t gamma, std::size_t an, std::size_t ak, std::size_t bn,
                            std::size_t bk) {
  bool const ok = size > 0 && ak % size == 0 && an == bn && ak == bk && gamma == size;
  if (!ok)
    throw ShapeError(std::string("telar::") + layer + "::" + what + ": expected [n, k * " +
                     std::to_string(size) + "] twice, got [" + std::to_string(an) + ", " +
                     std::to_string(ak) + "] and [" + std::to_string(bn) + ", " +
                     std::to_string(bk) + "]" + (gamma != size ? " (layer not initialised)" : ""));
}

/*! \brief What LayerNorm and RMSNorm share: rows of \p normalized_size
 *  values (the last extent) normalised with an offset eps; the output has the
 *  input's shape. \tparam Derived the layer (CRTP: name())
 *  \tparam T value type \tparam MemorySpace memory space */
template <class Derived, class T, class MemorySpace>
class RowNorm : public ShapePreservingLayerTypes<T, MemorySpace> {
public:
  /*! \brief The input's shape. \param in [..., normalized_size]
   *  \throws ShapeError when the last extent differs */
  Shape output_shape(Shape const& in) const {
    if (in.back() != size_)
      throw ShapeError(std::string(Derived::name()) + " expects inputs [..., " +
                       std::to_string(size_) + "]");
    return in;
  }
  /*! \brief The normalised extent. */
  std::size_t normalized_size() const { return size_; }
  /*! \brief The offset added under the square root. */
  double eps() const { return eps_; }

protected:
  RowNorm() = default;
  RowNorm(std::size_t normalized_size, double eps) : size_(normalized_size), eps_(eps) {}
  // Bytes of `per_row` statistics of every normalised row.
  std::size_t row_stats_bytes(std::size_t samples, Shape const& in, std::size_t per_row) const {
    return per_row * view_bytes<T>(samples * (size_ ? in.size() / size_ : 0));
  }

  std::size_t size_ = 0; //!< the normalised extent
  double eps_ = 1e-5;    //!< the offset
};

/*! \brief The passes LayerNorm and GroupNorm share: each normalised row
 *  (Derived::geometry) is shifted to mean 0 and scaled to variance 1, then
 *  y = gamma[p] * x_hat + beta[p] when Derived::affine(). They differ only in
 *  the geometry and the shape check (Derived::check, run first by every pass).
 *  Derived provides the public views weight, weight_grad, bias and bias_grad,
 *  name(), eps_, and (possibly private, with this class a friend) geometry,
 *  check and affine.
 *  \tparam Derived the layer (CRTP) \tparam T value type
 *  \tparam MemorySpace memory space */
template <class Derived, class T, class MemorySpace>
class MeanVarNorm {
public:
  /*! \brief Backward reads the input (the saved view), never the output. */
  static constexpr BackwardReads backward_reads = BackwardReads::input;
  /*! \brief What backward needs from forward. */
  struct saved_type {
    ConstMatrix<T, MemorySpace> x; //!< the forward input
    Vector<T, MemorySpace> mean;   //!< mean of each normalised row
    Vector<T, MemorySpace> rstd;   //!< 1 / sqrt(variance + eps) of each row
  };

  /*! \brief y = gamma * (x - mean) / sqrt(var + eps) + beta per normalised row.
   *  \param exec execution space instance \param x input [n, sample]
   *  \param y output, as x \param saved keeps x and the row statistics */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type& saved) const {
    Derived const& self = derived();
    self.check("forward", x.extent(0), x.extent(1), y.extent(0), y.extent(1));
    NormGeometry const g = self.geometry(x.extent(1));
    std::size_t const rows = g.rows(x.extent(0));
    norm_ensure(saved.mean, rows, Derived::name(), "mean");
    norm_ensure(saved.rstd, rows, Derived::name(), "rstd");
    saved.x = x;
    norm_forward<Exec, T, MemorySpace>(exec, x, y, saved.mean, saved.rstd, self.weight, self.bias,
                                       g, T(self.eps_));
  }
  /*! \brief dL/dx. \param exec execution space instance \param dy output gradient
   *  \param dx input gradient \param saved state of the matching forward */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      saved_type const& saved) const {
    Derived const& self = derived();
    self.check("backward_input", dy.extent(0), dy.extent(1), dx.extent(0), dx.extent(1));
    norm_backward_input<Exec, T, MemorySpace>(exec, dy, dx, saved.x, saved.mean, saved.rstd,
                                              self.weight, self.geometry(dy.extent(1)));
  }
  /*! \brief dgamma += sum dy x_hat, dbeta += sum dy per parameter (accumulates;
   *  nothing, and no check, without affine parameters).
   *  \param exec execution space instance \param dy output gradient
   *  \param saved state of the matching forward */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<T, MemorySpace> dy,
                       saved_type const& saved) const {
    Derived const& self = derived();
    if (!self.affine())
      return;
    self.check("backward_weight", dy.extent(0), dy.extent(1), saved.x.extent(0), saved.x.extent(1));
    norm_backward_weight<Exec, T, MemorySpace>(exec, dy, saved.x, saved.mean, saved.rstd,
                                               self.weight_grad, self.bias_grad,
                                               self.geometry(dy.extent(1)));
  }

private:
  Derived const& derived() const { return static_cast<Derived const&>(*this); }
};

} // namespace detail

/*! \brief Layer normalisation over the last extent (Ba et al. 2016; PyTorch's
 *  `nn.LayerNorm(normalized_size, eps)`): each row of \p normalized_size
 *  values, a sample of [features] or every position of [sequence, hidden], is
 *  shifted to mean 0 and scaled to variance 1 (biased variance, plus eps),
 *  then y = gamma * x_hat + beta with gamma, beta of size normalized_size.
 *
 *  Parameters "weight" (gamma, initialised to 1) and "bias" (beta, 0) are
 *  allocated by initialize(). Statistics are per sample and position, so the
 *  layer is exact under data parallelism. forward, backward_input and
 *  backward_weight (shared with GroupNorm, detail::MeanVarNorm) take inputs
 *  [n, k * normalized_size]; the saved state is the input and each row's mean
 *  and 1/std.
 *  \code
 *  using Block = telar::Residual<telar::LayerNorm<float>, telar::Dense<float>, telar::GELU<float>>;
 *  Block block(telar::LayerNorm<float>(64), telar::Dense<float>(64, 64), {});  // on [16, 64]
 *  \endcode
 *  \tparam T value type \tparam MemorySpace memory space
 */
template <class T = float, class MemorySpace = DefaultMemorySpace>
class LayerNorm : public detail::RowNorm<LayerNorm<T, MemorySpace>, T, MemorySpace>,
                  public detail::MeanVarNorm<LayerNorm<T, MemorySpace>, T, MemorySpace> {
  using Base = detail::RowNorm<LayerNorm, T, MemorySpace>;
  using Passes = detail::MeanVarNorm<LayerNorm, T, MemorySpace>;
  friend Passes;
  using Base::eps_;
  using Base::size_;

public:
  /*! \brief What backward needs from forward: the input and each row's mean and 1/std. */
  using typename Passes::saved_type;

  /*! \brief An empty layer; assign a configured one before use. */
  LayerNorm() = default;
  /*! \brief \param normalized_size the last extent of the input
   *  \param eps added to the variance */
  explicit LayerNorm(std::size_t normalized_size, double eps = 1e-5) : Base(normalized_size, eps) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "LayerNorm"; }
  /*! \brief Cost estimate. \param samples rows \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    return 8.0 * double(samples) * double(in.size());
  }

  /*! \brief Values of gamma and beta. */
  std::size_t parameter_count() const { return 2 * size_; }
  /*! \brief Mean and 1/std of every normalised row. \param samples rows \param in input shape */
  std::size_t saved_bytes(std::size_t samples, Shape const& in) const {
    return this->row_stats_bytes(samples, in, 2);
  }

  /*! \brief Allocates gamma = 1, beta = 0 and their gradients.
   *  \param seed unused (the initial values are fixed) */
  void initialize(std::uint64_t seed) {
    (void)seed;
    detail::norm_allocate(weight, weight_grad, bias, bias_grad, size_, "telar::LayerNorm");
  }
  /*! \brief Visits ("weight", gamma) and ("bias", beta).
   *  \param f callable as f(char const*, View&, View&) */
  template <class F>
  void parameters(F&& f) {
    f("weight", weight, weight_grad);
    f("bias", bias, bias_grad);
  }

  Vector<T, MemorySpace> weight;      //!< gamma [normalized_size]
  Vector<T, MemorySpace> weight_grad; //!< dL/dgamma
  Vector<T, MemorySpace> bias;        //!< beta [normalized_size]
  Vector<T, MemorySpace> bias_grad;   //!< dL/dbeta

private:
  static constexpr bool affine() { return true; }
  detail::NormGeometry geometry(std::size_t sample) const {
    return detail::NormGeometry{size_, sample, 1, size_};
  }
  void check(char const* what, std::size_t an, std::size_t ak, std::size_t bn,
             std::size_t bk) const {
    detail::norm_check_rows("LayerNorm", what, size_, weight.extent(0), an, ak, bn, bk);
  }
};

/*! \brief Root-mean-square normalisation over the last extent (Zhang &
 *  Sennrich 2019; PyTorch's `nn.RMSNorm(normalized_size, eps)`): each row of
 *  \p normalized_size values, a sample of [features] or every position of
 *  [sequence, hidden], is divided by sqrt(mean(x^2) + eps) and scaled by
 *  gamma (no shift, no mean subtraction).
 *
 *  Parameter "weight" (gamma, initialised to 1) is allocated by
 *  initialize(). Statistics are per sample and position (exact under data
 *  parallelism). backward_input and backward_weight are split; the saved
 *  state is the input and each row's 1/rms.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
class RMSNorm : public detail::RowNorm<RMSNorm<T, MemorySpace>, T, MemorySpace> {
  using Base = detail::RowNorm<RMSNorm, T, MemorySpace>;
  using Base::eps_;
  using Base::size_;

public:
  /*! \brief Backward reads the input (the saved view), never the output. */
  static constexpr BackwardReads backward_reads = BackwardReads::input;
  /*! \brief What backward needs from forward. */
  struct saved_type {
    ConstMatrix<T, MemorySpace> x; //!< the forward input
    Vector<T, MemorySpace> rstd;   //!< 1 / sqrt(mean(x^2) + eps) of each row
  };

  /*! \brief An empty layer; assign a configured one before use. */
  RMSNorm() = default;
  /*! \brief \param normalized_size the last extent of the input
   *  \param eps added to the mean square */
  explicit RMSNorm(std::size_t normalized_size, double eps = 1e-5) : Base(normalized_size, eps) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "RMSNorm"; }
  /*! \brief Cost estimate. \param samples rows \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    return 5.0 * double(samples) * double(in.size());
  }

  /*! \brief Values of gamma. */
  std::size_t parameter_count() const { return size_; }
  /*! \brief 1/rms of every normalised row. \param samples rows \param in input shape */
  std::size_t saved_bytes(std::size_t samples, Shape const& in) const {
    return this->row_stats_bytes(samples, in, 1);
  }

  /*! \brief Allocates gamma = 1 and its gradient.
   *  \param seed unused (the initial values are fixed) */
  void initialize(std::uint64_t seed) {
    (void)seed;
    weight = Vector<T, MemorySpace>("telar::RMSNorm::weight", size_);
    weight_grad = Vector<T, MemorySpace>("telar::RMSNorm::weight_grad", size_);
    Kokkos::deep_copy(weight, T(1));
  }
  /*! \brief Visits ("weight", gamma). \param f callable as f(char const*, View&, View&) */
  template <class F>
  void parameters(F&& f) {
    f("weight", weight, weight_grad);
  }

  /*! \brief y = gamma * x / sqrt(mean(x^2) + eps) per row.
   *  \param exec execution space instance \param x input [n, k * normalized_size]
   *  \param y output, as x \param saved keeps x and the row statistics */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type& saved) const {
    check("forward", x.extent(0), x.extent(1), y.extent(0), y.extent(1));
    detail::norm_ensure(saved.rstd, x.extent(0) * (x.extent(1) / size_), "RMSNorm", "rstd");
    saved.x = x;
    detail::rms_forward<Exec, T, MemorySpace>(exec, x, y, saved.rstd, weight, size_, T(eps_));
  }
  /*! \brief dL/dx. \param exec execution space instance \param dy output gradient
   *  \param dx input gradient \param saved state of the matching forward */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      saved_type const& saved) const {
    check("backward_input", dy.extent(0), dy.extent(1), dx.extent(0), dx.extent(1));
    detail::rms_backward_input<Exec, T, MemorySpace>(exec, dy, dx, saved.x, saved.rstd, weight,
                                                     size_);
  }
  /*! \brief dgamma += sum dy x_hat (accumulates). \param exec execution space instance
   *  \param dy output gradient \param saved state of the matching forward */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<T, MemorySpace> dy,
                       saved_type const& saved) const {
    check("backward_weight", dy.extent(0), dy.extent(1), saved.x.extent(0), saved.x.extent(1));
    detail::rms_backward_weight<Exec, T, MemorySpace>(exec, dy, saved.x, saved.rstd, weight_grad,
                                                      size_);
  }

  Vector<T, MemorySpace> weight;      //!< gamma [normalized_size]
  Vector<T, MemorySpace> weight_grad; //!< dL/dgamma

private:
  void check(char const* what, std::size_t an, std::size_t ak, std::size_t bn,
             std::size_t bk) const {
    detail::norm_check_rows("RMSNorm", what, size_, weight.extent(0), an, ak, bn, bk);
  }
};

/*! \brief Group normalisation (Wu & He 2018; PyTorch's `nn.GroupNorm(groups,
 *  channels, eps, affine)`) over samples [channels, ...spatial] of rank 2 to
 *  4: the channels are split into \p groups consecutive groups, and each
 *  group of each sample (its channels x spatial values) is shifted to mean 0
 *  and scaled to variance 1 (biased, plus eps); with \p affine, then
 *  y = gamma[c] * x_hat + beta[c] per channel.
 *
 *  groups = 1 normalises the whole sample (LayerNorm over [C, H, W] with
 *  per-channel affine); groups = channels is instance normalisation.
 *  Parameters "weight" (gamma, initialised to 1) and "bias" (beta, 0), when
 *  affine, are allocated by initialize(). Statistics are per sample, so the
 *  layer is exact under data parallelism (unlike BatchNorm; see the file's
 *  notes). forward, backward_input and backward_weight (shared with
 *  LayerNorm, detail::MeanVarNorm) take inputs [n, channels * spatial] and
 *  apply gamma[c], beta[c] per channel; backward_weight does nothing without
 *  affine. The saved state is the input and each (sample, group)'s mean and
 *  1/std.
 *  \code
 *  telar::GroupNorm<float> gn(8, 32);  // inputs [32, H, W], 8 groups of 4 channels
 *  \endcode
 *  \tparam T value type \tparam MemorySpace memory space
 */
template <class T = float, class MemorySpace = DefaultMemorySpace>
class GroupNorm : public detail::ShapePreservingLayerTypes<T, MemorySpace>,
                  public detail::MeanVarNorm<GroupNorm<T, MemorySpace>, T, MemorySpace> {
  using Passes = detail::MeanVarNorm<GroupNorm, T, MemorySpace>;
  friend Passes;

public:
  /*! \brief What backward needs from forward; a normalised row is one (sample, group). */
  using typename Passes::saved_type;

  /*! \brief An empty layer; assign a configured one before use. */
  GroupNorm() = default;
  /*! \brief \param groups number of channel groups (must divide channels)
   *  \param channels the first extent of the input \param eps added to the variance
   *  \param affine learn per-channel gamma and beta
   *  \throws Error when groups is 0 or does not divide channels */
  GroupNorm(std::size_t groups, std::size_t channels, double eps = 1e-5, bool affine = true)
      : groups_(groups), channels_(channels), eps_(eps), affine_(affine) {
    if (groups == 0 || channels % groups != 0)
      throw Error("telar::GroupNorm: " + std::to_string(channels) +
                  " channels cannot be split into " + std::to_string(groups) + " groups");
  }

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "GroupNorm"; }
  /*! \brief The input's shape. \param in [channels, ...spatial], rank 2 to 4
   *  \throws ShapeError for another rank or channel count */
  Shape output_shape(Shape const& in) const {
    if (in.rank < 2 || in.rank > 4 || in[0] != channels_)
      throw ShapeError("GroupNorm expects inputs [" + std::to_string(channels_) +
                       ", ...spatial] of rank 2 to 4");
    return in;
  }
  /*! \brief Number of groups. */
  std::size_t groups() const { return groups_; }
  /*! \brief Number of channels. */
  std::size_t channels() const { return channels_; }
  /*! \brief The variance offset. */
  double eps() const { return eps_; }
  /*! \brief Whether gamma and beta are learnt. */
  bool affine() const { return affine_; }
  /*! \brief Cost estimate. \param samples rows \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    return 8.0 * double(samples) * double(in.size());
  }

  /*! \brief Values of gamma and beta (0 without affine). */
  std::size_t parameter_count() const { return affine_ ? 2 * channels_ : 0; }
  /*! \brief Mean and 1/std of every (sample, group). \param samples rows */
  std::size_t saved_bytes(std::size_t samples, Shape const&) const {
    return 2 * detail::view_bytes<T>(samples * groups_);
  }

  /*! \brief Allocates gamma = 1, beta = 0 and their gradients (if affine).
   *  \param seed unused (the initial values are fixed) */
  void initialize(std::uint64_t seed) {
    (void)seed;
    if (affine_)
      detail::norm_allocate(weight, weight_grad, bias, bias_grad, channels_, "telar::GroupNorm");
  }
  /*! \brief Visits ("weight", gamma) and ("bias", beta) if affine; nothing otherwise.
   *  \param f callable as f(char const*, View&, View&) */
  template <class F>
  void parameters(F&& f) {
    if (affine_) {
      f("weight", weight, weight_grad);
      f("bias", bias, bias_grad);
    }
  }

  Vector<T, MemorySpace> weight;      //!< gamma [channels] (empty without affine)
  Vector<T, MemorySpace> weight_grad; //!< dL/dgamma
  Vector<T, MemorySpace> bias;        //!< beta [channels] (empty without affine)
  Vector<T, MemorySpace> bias_grad;   //!< dL/dbeta

private:
  detail::NormGeometry geometry(std::size_t sample) const {
    std::size_t const spatial = sample / channels_;
    return detail::NormGeometry{channels_ / groups_ * spatial, sample, spatial,
                                affine_ ? channels_ : 0};
  }
  void check(char const* what, std::size_t an, std::size_t ak, std::size_t bn,
             std::size_t bk) const {
    detail::check_channel_batches("telar::GroupNorm", what, channels_,
                                  !affine_ || weight.extent(0) == channels_, an, ak, bn, bk);
  }

  std::size_t groups_ = 1;
  std::size_t channels_ = 0;
  double eps_ = 1e-5;
  bool affine_ = true;
};

} // namespace telar
