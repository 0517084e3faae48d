#pragma once
/*! \file
 *  \brief Losses beyond class logits: mean squared error for regression and
 *  position-wise cross-entropy for [positions, classes] outputs (tokens,
 *  pixels) with an ignore index.
 *
 *  Both follow the Loss concept (telar/core/loss.hpp): forward_backward
 *  returns the loss summed over its terms and writes `scale` times the
 *  gradient of that sum; count() says how many terms a batch has, and the
 *  Trainer passes scale = 1 / (terms in the global batch), so the gradient is
 *  that of the mean over the global batch on every layout.
 */
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/detail/math.hpp>
#include <telar/core/error.hpp>
#include <telar/core/loss.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>

#include <string>

namespace telar {

namespace detail {
inline std::string extents_str(std::size_t a, std::size_t b) {
  return "[" + std::to_string(a) + ", " + std::to_string(b) + "]";
}

// Kernels as free functions (nvcc rejects extended lambdas in private member
// functions); views captured by value.
template <class Exec, class T, class M>
double mse_forward_backward(Exec const& exec, ConstMatrix<T, M> y, ConstMatrix<T, M> t,
                            Matrix<T, M> dy, T scale) {
  std::size_t const k = y.extent(1), total = y.extent(0) * y.extent(1);
  double sum = 0;
  Kokkos::parallel_reduce(
      "telar::MeanSquaredError::forward_backward", Kokkos::RangePolicy<Exec>(exec, 0, total),
      KOKKOS_LAMBDA(std::size_t e, double& acc) {
        std::size_t const i = e / k, j = e % k;
        T const d = y(i, j) - t(i, j);
        dy(i, j) = scale * T(2) * d;
        acc += double(d) * double(d);
      },
      sum);
  return sum;
}

// One row per (sample, position): row_loss, and row_flag 0 (wrong or
// ignored), 1 (arg-max is the label), 2 (label out of range), 3 (ignored).
template <class Exec, class T, class M>
void positionwise_ce_rows(Exec const& exec, ConstMatrix<T, M> logits,
                          Kokkos::View<int**, Kokkos::LayoutRight, M> const& labels,
                          Matrix<T, M> dlogits, T scale, int ignore_index,
                          Kokkos::View<double*, M> const& row_loss,
                          Kokkos::View<int*, M> const& row_flag) {
  std::size_t const P = labels.extent(1), rows = labels.extent(0) * P;
  std::size_t const C = P ? logits.extent(1) / P : 0;
  Kokkos::parallel_for(
      "telar::PositionwiseCrossEntropy::forward_backward", Kokkos::RangePolicy<Exec>(exec, 0, rows),
      KOKKOS_LAMBDA(std::size_t r) {
        std::size_t const i = r / P, p = r % P, c0 = p * C;
        int const y = labels(i, p);
        bool const ignored = y == ignore_index;
        if (ignored || y < 0 || std::size_t(y) >= C) {
          row_flag(r) = ignored ? 3 : 2;
          row_loss(r) = 0;
          for (std::size_t j = 0; j < C; ++j)
            dlogits(i, c0 + j) = 0;
          return;
        }
        T mx = logits(i, c0);
        std::size_t arg = 0;
        for (std::size_t j = 1; j < C; ++j)
          if (logits(i, c0 + j) > mx) {
            mx = logits(i, c0 + j);
            arg = j;
          }
        T sum = 0;
        for (std::size_t j = 0; j < C; ++j)
          sum += detail::exp(logits(i, c0 + j) - mx);
        T const lse = mx + detail::log(sum);
        row_loss(r) = double(lse - logits(i, c0 + std::size_t(y)));
        row_flag(r) = arg == std::size_t(y) ? 1 : 0;
        for (std::size_t j = 0; j < C; ++j) {
          T const prob = detail::exp(logits(i, c0 + j) - lse);
          dlogits(i, c0 + j) = scale * (prob - (j == std::size_t(y) ? T(1) : T(0)));
        }
      });
}

template <class Exec, class M>
long long count_flag(Exec const& exec, Kokkos::View<int*, M> const& flags, std::size_t n,
                     int flag) {
  long long c = 0;
  Kokkos::parallel_reduce(
      "telar::PositionwiseCrossEntropy::count", Kokkos::RangePolicy<Exec>(exec, 0, n),
      KOKKOS_LAMBDA(std::size_t r, long long& acc) { acc += flags(r) == flag ? 1 : 0; }, c);
  return c;
}

template <class Exec, class M>
long long count_not_ignored(Exec const& exec,
                            Kokkos::View<int**, Kokkos::LayoutRight, M> const& labels,
                            int ignore_index) {
  std::size_t const P = labels.extent(1), rows = labels.extent(0) * P;
  long long c = 0;
  Kokkos::parallel_reduce(
      "telar::PositionwiseCrossEntropy::count", Kokkos::RangePolicy<Exec>(exec, 0, rows),
      KOKKOS_LAMBDA(std::size_t r, long long& acc) {
        acc += labels(r / P, r % P) != ignore_index ? 1 : 0;
      },
      c);
  return c;
}

// Labels of a [n, positions] batch outside [0, classes) and not ignore_index.
template <class Exec, class M>
long long count_labels_outside(Exec const& exec,
                               Kokkos::View<int**, Kokkos::LayoutRight, M> const& labels,
                               std::size_t classes, int ignore_index) {
  std::size_t const P = labels.extent(1), rows = labels.extent(0) * P;
  long long c = 0;
  Kokkos::parallel_reduce(
      "telar::PositionwiseCrossEntropy::invalid", Kokkos::RangePolicy<Exec>(exec, 0, rows),
      KOKKOS_LAMBDA(std::size_t r, long long& acc) {
        int const y = labels(r / P, r % P);
        acc += y != ignore_index && (y < 0 || std::size_t(y) >= classes) ? 1 : 0;
      },
      c);
  return c;
}
} // namespace detail

/*! \brief Mean squared error, as PyTorch's `MSELoss(reduction='mean')`: the
 *  mean of (y - t)^2 over every element of the batch.
 *
 *  forward_backward returns LossSum::loss = sum of (y - t)^2 over the batch
 *  and LossSum::count = its elements (n * k), and writes
 *  dy = scale * 2 (y - t). count() is n * k too, so the Trainer's scale is
 *  1 / (elements in the global batch) and the reported loss is the
 *  element-wise mean. Targets are stored like outputs: a model with output
 *  shape [positions, k] takes targets [n, positions * k].
 *  \code
 *  telar::Trainer<Model, telar::Serial, telar::SGD<float>, telar::MeanSquaredError<float>>
 *      trainer(model, telar::SGD<float>{}, opts, 8);
 *  trainer.step(x, t);  // t: telar::Matrix<float> [n, outputs]
 *  \endcode
 *  \tparam T value type \tparam MemorySpace memory space
 */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct MeanSquaredError : public detail::LayerTypes<T, MemorySpace> {
  /*! \brief Real targets [n, k], k the model's values per sample. */
  using target_type = Matrix<T, MemorySpace>;
  /*! \brief No accuracy: LossSum::correct stays 0. */
  static constexpr bool has_accuracy = false;

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "MeanSquaredError"; }

  /*! \brief Loss terms of a batch: its elements.
   *  \param exec execution space instance (unused) \param targets [n, k] */
  template <class Exec>
  long long count(Exec const& exec, target_type const& targets) const {
    (void)exec;
    return static_cast<long long>(targets.extent(0) * targets.extent(1));
  }

  /*! \brief Summed squared error of a batch and its gradient.
   *  \param exec execution space instance \param y outputs [n, k]
   *  \param targets [n, k] \param dy [n, k] output: scale * 2 (y - t)
   *  \param scale gradient scale (1 / elements in the global batch)
   *  \return the sum of squared differences, samples n and count n * k
   *  \throws ShapeError when the extents differ */
  template <class Exec>
  LossSum forward_backward(Exec const& exec, ConstMatrix<T, MemorySpace> y,
                           target_type const& targets, Matrix<T, MemorySpace> dy, T scale) const {
    std::size_t const n = y.extent(0), k = y.extent(1);
    if (targets.extent(0) != n || targets.extent(1) != k || dy.extent(0) != n || dy.extent(1) != k)
      throw ShapeError("telar::MeanSquaredError: outputs " + detail::extents_str(n, k) +
                       ", targets " + detail::extents_str(targets.extent(0), targets.extent(1)) +
                       ", gradient " + detail::extents_str(dy.extent(0), dy.extent(1)) +
                       " do not match");
    LossSum out;
    out.samples = static_cast<long long>(n);
    out.count = static_cast<long long>(n * k);
    if (n * k > 0)
      out.loss = detail::mse_forward_backward<Exec, T, MemorySpace>(exec, y, targets, dy, scale);
    return out;
  }
};

/*! \brief Softmax cross-entropy at every position of outputs [positions,
 *  classes] (a language model's tokens, a segmentation's pixels), against
 *  integer labels [n, positions]; positions labelled \p ignore_index (padding)
 *  do not count, as in PyTorch's `CrossEntropyLoss(ignore_index=-100)`.
 *
 *  The loss is the mean over the positions that count in the global batch:
 *  count() gives this rank's number of non-ignored labels, the Trainer sums
 *  it over the data-parallel group and passes scale = 1 / that sum, so data
 *  parallelism with unevenly padded shares matches serial training.
 *  LossSum::correct counts the non-ignored positions whose arg-max logit is
 *  the label (accuracy over the positions that count).
 *  \code
 *  // outputs [16, 10] per sample: 16 positions, 10 classes
 *  telar::Trainer<Model, telar::Serial, telar::AdamW<float>,
 *                 telar::PositionwiseCrossEntropy<float>> trainer(model, {}, opts, {16, 32});
 *  telar::PositionwiseCrossEntropy<float>::target_type y("y", n, 16);  // -100: padding
 *  \endcode
 *  \tparam T value type \tparam MemorySpace memory space
 */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct PositionwiseCrossEntropy : public detail::LayerTypes<T, MemorySpace> {
  /*! \brief One class label per sample and position, [n, positions]. */
  using target_type = Kokkos::View<int**, Kokkos::LayoutRight, MemorySpace>;
  /*! \brief LossSum::correct counts positions whose arg-max logit is the label. */
  static constexpr bool has_accuracy = true;

  /*! \brief Ignores label -100 (PyTorch's default). */
  PositionwiseCrossEntropy() = default;
  /*! \brief \param ignore_index label of positions that do not count */
  explicit PositionwiseCrossEntropy(int ignore_index) : ignore_index_(ignore_index) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "PositionwiseCrossEntropy"; }
  /*! \brief The label that does not count. */
  int ignore_index() const { return ignore_index_; }

  /*! \brief Takes outputs of rank 2, [positions, classes].
   *  \param out the model's per-sample output shape
   *  \throws ShapeError for another rank */
  void build(Shape const& out) {
    if (out.rank != 2)
      throw ShapeError("telar::PositionwiseCrossEntropy: the model's output is " + out.str() +
                       ", expected [positions, classes] (use SoftmaxCrossEntropy for [classes])");
    positions_ = out[0];
    classes_ = out[1];
  }

  /*! \brief A double and an int per position, kept between steps.
   *  \param samples rows \param out [positions, classes] */
  std::size_t workspace_bytes(std::size_t samples, Shape const& out) const {
    std::size_t const rows = samples * (out.rank == 2 ? out[0] : 1);
    return detail::view_bytes<double>(rows) + detail::view_bytes<int>(rows);
  }

  /*! \brief Loss terms of a batch: labels other than ignore_index.
   *  \param exec execution space instance \param labels [n, positions] */
  template <class Exec>
  long long count(Exec const& exec, target_type const& labels) const {
    return detail::count_not_ignored<Exec, MemorySpace>(exec, labels, ignore_index_);
  }

  /*! \brief Labels outside [0, classes) and not the ignore_index (the
   *  Trainer counts them over the global batch before a step).
   *  \param exec execution space instance \param labels [n, positions]
   *  \param out the model's per-sample output shape [positions, classes] */
  template <class Exec>
  long long invalid_targets(Exec const& exec, target_type const& labels, Shape const& out) const {
    return detail::count_labels_outside<Exec, MemorySpace>(exec, labels, out[out.rank - 1],
                                                           ignore_index_);
  }
  /*! \brief What invalid_targets() counts, for messages: "labels outside
   *  [0, 10) and not the ignore_index -100". \param out the output shape */
  std::string invalid_targets_what(Shape const& out) const {
    return "labels outside [0, " + std::to_string(out[out.rank - 1]) +
           ") and not the ignore_index " + std::to_string(ignore_index_);
  }

  /*! \brief Loss of a batch and its gradient.
   *  \param exec execution space instance
   *  \param logits [n, positions * classes] (row-major [positions, classes] per sample)
   *  \param labels [n, positions], each in [0, classes) or ignore_index
   *  \param dlogits [n, positions * classes] output: scale * (softmax - onehot),
   *  zero at ignored positions
   *  \param scale gradient scale (1 / non-ignored positions in the global batch)
   *  \return loss summed over the positions that count, their number
   *  (LossSum::count), correct predictions among them, and samples n
   *  \throws ShapeError on shape mismatch or labels out of range */
  template <class Exec>
  LossSum forward_backward(Exec const& exec, ConstMatrix<T, MemorySpace> logits,
                           target_type const& labels, Matrix<T, MemorySpace> dlogits,
                           T scale) const {
    std::size_t const n = logits.extent(0), k = logits.extent(1), P = labels.extent(1);
    bool const fits = labels.extent(0) == n && dlogits.extent(0) == n && dlogits.extent(1) == k &&
                      P > 0 && k % P == 0 && (positions_ == 0 || P == positions_) &&
                      (classes_ == 0 || k == P * classes_);
    if (!fits)
      throw ShapeError("telar::PositionwiseCrossEntropy: logits " + detail::extents_str(n, k) +
                       ", labels " + detail::extents_str(labels.extent(0), P) + ", gradient " +
                       detail::extents_str(dlogits.extent(0), dlogits.extent(1)) + " do not match" +
                       (positions_ ? " [n, " + std::to_string(positions_) + " * " +
                                         std::to_string(classes_) + "] and [n, " +
                                         std::to_string(positions_) + "]"
                                   : std::string()));
    LossSum out;
    out.samples = static_cast<long long>(n);
    std::size_t const rows = n * P;
    if (rows == 0)
      return out;
    if (row_loss_.extent(0) < rows) {
      row_loss_ =
          Kokkos::View<double*, MemorySpace>("telar::PositionwiseCrossEntropy::row_loss", rows);
      row_flag_ =
          Kokkos::View<int*, MemorySpace>("telar::PositionwiseCrossEntropy::row_flag", rows);
    }
    detail::positionwise_ce_rows<Exec, T, MemorySpace>(exec, logits, labels, dlogits, scale,
                                                       ignore_index_, row_loss_, row_flag_);
    auto row_loss = row_loss_;
    double loss = 0;
    Kokkos::parallel_reduce(
        "telar::PositionwiseCrossEntropy::sum", Kokkos::RangePolicy<Exec>(exec, 0, rows),
        KOKKOS_LAMBDA(std::size_t r, double& acc) { acc += row_loss(r); }, loss);
    long long const bad = detail::count_flag(exec, row_flag_, rows, 2);
    if (bad > 0)
      throw ShapeError("telar::PositionwiseCrossEntropy: " + std::to_string(bad) + " of " +
                       std::to_string(rows) + " labels are outside [0, " + std::to_string(k / P) +
                       ") and not the ignore_index " + std::to_string(ignore_index_));
    long long const ignored = detail::count_flag(exec, row_flag_, rows, 3);
    out.loss = loss;
    out.correct = detail::count_flag(exec, row_flag_, rows, 1);
    out.count = static_cast<long long>(rows) - ignored;
    return out;
  }

private:
  int ignore_index_ = -100;
  std::size_t positions_ = 0; // from build(); 0: taken from the labels
  std::size_t classes_ = 0;
  mutable Kokkos::View<double*, MemorySpace> row_loss_;
  mutable Kokkos::View<int*, MemorySpace> row_flag_;
};

} // namespace telar
