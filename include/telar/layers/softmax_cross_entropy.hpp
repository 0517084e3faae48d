#pragma once
/*! \file
 *  \brief Softmax cross-entropy loss over class logits. */
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/detail/math.hpp>
#include <telar/core/error.hpp>
#include <telar/core/loss.hpp>
#include <telar/core/tensor.hpp>

#include <string>

namespace telar {

/*! \brief Softmax followed by cross-entropy against integer labels.
 *
 *  forward_backward computes the loss and, in the same pass, the gradient of
 *  `scale * sum of losses` with respect to the logits. Training passes
 *  scale = 1 / global batch size, so micro-batches, pipeline stages and
 *  data-parallel ranks all add their gradients instead of averaging them,
 *  and every strategy produces the serial gradient.
 *  \tparam T value type \tparam MemorySpace memory space
 */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct SoftmaxCrossEntropy : public detail::LayerTypes<T, MemorySpace> {
  /*! \brief One class label per sample. */
  using target_type = Labels<MemorySpace>;
  /*! \brief LossSum::correct counts samples whose arg-max logit is the label. */
  static constexpr bool has_accuracy = true;

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "SoftmaxCrossEntropy"; }

  /*! \brief Takes outputs of rank 1, [classes]. \param out the model's output shape */
  void build(Shape const& out) const {
    if (out.rank != 1)
      throw ShapeError("telar::SoftmaxCrossEntropy: the model's output is " + out.str() +
                       ", expected class logits [classes] (use PositionwiseCrossEntropy for "
                       "[positions, classes])");
  }

  /*! \brief Labels outside [0, classes) (the Trainer counts them over the
   *  global batch before a step). \param exec execution space instance
   *  \param labels [n] \param out the model's per-sample output shape [classes] */
  template <class Exec>
  long long invalid_targets(Exec const& exec, Labels<MemorySpace> const& labels,
                            Shape const& out) const {
    std::size_t const c = out[0];
    long long bad = 0;
    Kokkos::parallel_reduce(
        "telar::SoftmaxCrossEntropy::invalid", Kokkos::RangePolicy<Exec>(exec, 0, labels.extent(0)),
        KOKKOS_LAMBDA(std::size_t i, long long& acc) {
          acc += labels(i) < 0 || std::size_t(labels(i)) >= c ? 1 : 0;
        },
        bad);
    return bad;
  }
  /*! \brief What invalid_targets() counts, for messages: "labels outside
   *  [0, 10)". \param out the model's per-sample output shape */
  std::string invalid_targets_what(Shape const& out) const {
    return "labels outside [0, " + std::to_string(out[0]) + ")";
  }

  /*! \brief Loss of a batch and its gradient.
   *  \param exec execution space instance
   *  \param logits [n, classes] \param labels [n], each in [0, classes)
   *  \param dlogits [n, classes] output: scale * (softmax - onehot)
   *  \param scale gradient scale (1 / global batch)
   *  \return the loss summed over the batch and the correct count
   *  \throws ShapeError on shape mismatch or a label out of range */
  template <class Exec>
  LossSum forward_backward(Exec const& exec, ConstMatrix<T, MemorySpace> logits,
                           Labels<MemorySpace> const& labels, Matrix<T, MemorySpace> dlogits,
                           T scale) const {
    std::size_t const n = logits.extent(0), c = logits.extent(1);
    if (labels.extent(0) != n || dlogits.extent(0) != n || dlogits.extent(1) != c)
      throw ShapeError("telar::SoftmaxCrossEntropy: logits [" + std::to_string(n) + ", " +
                       std::to_string(c) + "], labels [" + std::to_string(labels.extent(0)) +
                       "], gradient [" + std::to_string(dlogits.extent(0)) + ", " +
                       std::to_string(dlogits.extent(1)) + "] do not match");
    LossSum out;
    out.samples = out.count = static_cast<long long>(n);
    if (n == 0)
      return out;
    // Per-row results in small vectors, then plain sums: portable across
    // Kokkos 3.4 and 4.x without custom reducers. Kept between calls so a
    // training step allocates nothing.
    if (row_loss_.extent(0) < n) {
      row_loss_ = Kokkos::View<double*, MemorySpace>("telar::SoftmaxCrossEntropy::row_loss", n);
      row_flags_ = Kokkos::View<int*, MemorySpace>("telar::SoftmaxCrossEntropy::row_flags", n);
    }
    auto row_loss = row_loss_;
    auto row_flags = row_flags_;
    Kokkos::parallel_for(
        "telar::SoftmaxCrossEntropy::forward_backward", Kokkos::RangePolicy<Exec>(exec, 0, n),
        KOKKOS_LAMBDA(std::size_t i) {
          int const y = labels(i);
          if (y < 0 || std::size_t(y) >= c) {
            row_flags(i) = 2; // bad label
            row_loss(i) = 0;
            for (std::size_t j = 0; j < c; ++j)
              dlogits(i, j) = 0;
            return;
          }
          T mx = logits(i, 0);
          std::size_t arg = 0;
          for (std::size_t j = 1; j < c; ++j)
            if (logits(i, j) > mx) {
              mx = logits(i, j);
              arg = j;
            }
          T sum = 0;
          for (std::size_t j = 0; j < c; ++j)
            sum += detail::exp(logits(i, j) - mx);
          T const lse = mx + detail::log(sum);
          row_loss(i) = double(lse - logits(i, y));
          row_flags(i) = arg == std::size_t(y) ? 1 : 0;
          for (std::size_t j = 0; j < c; ++j) {
            T const p = detail::exp(logits(i, j) - lse);
            dlogits(i, j) = scale * (p - (j == std::size_t(y) ? T(1) : T(0)));
          }
        });
    double loss = 0;
    long long correct = 0, bad = 0;
    Kokkos::parallel_reduce(
        "telar::SoftmaxCrossEntropy::sum", Kokkos::RangePolicy<Exec>(exec, 0, n),
        KOKKOS_LAMBDA(std::size_t i, double& acc) { acc += row_loss(i); }, loss);
    Kokkos::parallel_reduce(
        "telar::SoftmaxCrossEntropy::correct", Kokkos::RangePolicy<Exec>(exec, 0, n),
        KOKKOS_LAMBDA(std::size_t i, long long& acc) { acc += row_flags(i) == 1 ? 1 : 0; },
        correct);
    Kokkos::parallel_reduce(
        "telar::SoftmaxCrossEntropy::bad", Kokkos::RangePolicy<Exec>(exec, 0, n),
        KOKKOS_LAMBDA(std::size_t i, long long& acc) { acc += row_flags(i) == 2 ? 1 : 0; }, bad);
    if (bad > 0)
      throw ShapeError("telar::SoftmaxCrossEntropy: " + std::to_string(bad) + " of " +
                       std::to_string(n) + " labels are outside [0, " + std::to_string(c) + ")");
    out.loss = loss;
    out.correct = correct;
    return out;
  }

  /*! \brief Loss and correct count without a gradient (evaluation).
   *  \param exec execution space instance \param logits [n, classes] \param labels [n] */
  template <class Exec>
  LossSum evaluate(Exec const& exec, ConstMatrix<T, MemorySpace> logits,
                   Labels<MemorySpace> const& labels) const {
    Matrix<T, MemorySpace> scratch(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::SoftmaxCrossEntropy::scratch"),
        logits.extent(0), logits.extent(1));
    return forward_backward(exec, logits, labels, scratch, T(0));
  }

private:
  mutable Kokkos::View<double*, MemorySpace> row_loss_;
  mutable Kokkos::View<int*, MemorySpace> row_flags_;
};

} // namespace telar
