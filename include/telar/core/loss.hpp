#pragma once
/*! \file
 *  \brief The Loss concept: what a loss provides to the Trainer and the
 *  pipeline executor, and the checks applied where a loss enters the API.
 *
 *  A loss turns the last layer's output of a micro-batch and its targets into
 *  the summed loss (plus any counts it defines) and dL/dy:
 *  \code
 *  struct L1 {
 *    using value_type = float;
 *    using memory_space = telar::DefaultMemorySpace;
 *    using target_type = telar::Matrix<float>;            // [n, k]
 *    template <class Exec>
 *    telar::LossSum forward_backward(Exec const& exec, telar::ConstMatrix<float> y,
 *                                    target_type const& t, telar::Matrix<float> dy,
 *                                    float scale) const;  // dy = scale * dloss/dy
 *  };
 *  \endcode
 *  Required: `value_type`, `memory_space`, `target_type` (a Kokkos::View
 *  whose first extent is the sample: class labels [n], per-position labels
 *  [n, positions], real targets [n, k]), and `forward_backward(exec, y,
 *  targets, dy, scale)` returning a telar::LossSum and writing scale times the
 *  gradient of the summed loss into dy.
 *
 *  Optional:
 *  - `void build(telar::Shape const& out)`: learns the model's per-sample
 *    output shape (e.g. [positions, classes]); throws ShapeError if it cannot
 *    take it;
 *  - `template <class Exec> long long count(Exec const&, target_type const&) const`:
 *    the loss terms in a batch (default: its samples). The gradient is that of
 *    the summed loss divided by the global count, so with an ignore index the
 *    mean is over the positions that count, on every layout;
 *  - `static constexpr bool has_accuracy`: LossSum::correct means something
 *    (reported as accuracy);
 *  - `evaluate(exec, y, targets)`: the loss without a gradient (default:
 *    forward_backward into a scratch gradient with scale 0);
 *  - `template <class Exec> long long invalid_targets(Exec const&, target_type
 *    const&, Shape const& out) const` and `std::string
 *    invalid_targets_what(Shape const& out) const`: targets the loss cannot
 *    take (e.g. labels outside [0, classes)) and what they are, for messages;
 *    the Trainer counts them over the global batch before a step and stops
 *    every rank with one message;
 *  - `std::size_t workspace_bytes(std::size_t samples, telar::Shape const&
 *    out) const`: bytes the loss keeps between steps for a micro-batch of
 *    \p samples outputs of shape \p out, for memory plans (default: a double
 *    and an int per sample, the per-row sums and flags most losses keep);
 *  - `name()`.
 */
#include <telar/core/detail/type_traits.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>

#include <type_traits>
#include <utility>

namespace telar {

/*! \brief What a loss reports for a batch: sums, so micro-batches, stages and
 *  ranks add them. */
struct LossSum {
  double loss = 0;       //!< the loss summed over its terms
  long long correct = 0; //!< terms predicted correctly (losses with has_accuracy)
  long long samples = 0; //!< samples in the batch
  long long count = 0;   //!< loss terms (samples, or positions that count)
  /*! \brief Adds another batch's sums. \param o the other */
  LossSum& operator+=(LossSum const& o) {
    loss += o.loss;
    correct += o.correct;
    samples += o.samples;
    count += o.count;
    return *this;
  }
};

namespace detail {
template <class L>
using target_type_t = typename L::target_type;
template <class L>
using loss_forward_backward_t = decltype(LossSum(std::declval<L const&>().forward_backward(
    std::declval<typename L::memory_space::execution_space const&>(),
    std::declval<ConstMatrix<typename L::value_type, typename L::memory_space>>(),
    std::declval<typename L::target_type const&>(),
    std::declval<Matrix<typename L::value_type, typename L::memory_space>>(),
    std::declval<typename L::value_type>())));
template <class L>
using loss_evaluate_t = decltype(LossSum(std::declval<L const&>().evaluate(
    std::declval<typename L::memory_space::execution_space const&>(),
    std::declval<ConstMatrix<typename L::value_type, typename L::memory_space>>(),
    std::declval<typename L::target_type const&>())));
template <class L>
using loss_count_t = decltype((long long)(std::declval<L const&>().count(
    std::declval<typename L::memory_space::execution_space const&>(),
    std::declval<typename L::target_type const&>())));
template <class L>
using loss_build_t = decltype(std::declval<L&>().build(std::declval<Shape const&>()));
template <class L>
using loss_invalid_targets_t = decltype((long long)(std::declval<L const&>().invalid_targets(
    std::declval<typename L::memory_space::execution_space const&>(),
    std::declval<typename L::target_type const&>(), std::declval<Shape const&>())));
template <class L>
using loss_workspace_bytes_t = decltype(std::size_t(
    std::declval<L const&>().workspace_bytes(std::size_t{}, std::declval<Shape const&>())));
template <class L>
using has_accuracy_t = std::bool_constant<bool(L::has_accuracy)>;

template <class L>
constexpr bool check_loss() {
  static_assert(is_detected_v<value_type_t, L> && is_detected_v<memory_space_t, L>,
                "telar::Trainer: a loss must declare `using value_type = ...;` and `using "
                "memory_space = ...;`");
  static_assert(is_detected_v<target_type_t, L>,
                "telar::Trainer: a loss must declare `using target_type = <Kokkos::View of the "
                "targets, first extent the sample>;`");
  static_assert(is_detected_v<loss_forward_backward_t, L>,
                "telar::Trainer: a loss must provide `template <class Exec> telar::LossSum "
                "forward_backward(Exec const& exec, telar::ConstMatrix<T, memory_space> y, "
                "target_type const& targets, telar::Matrix<T, memory_space> dy, T scale) const`");
  return true;
}

template <class V>
using view_scalar_t = typename V::non_const_value_type;
// Whether V is a Kokkos::View (or alike) of Scalar-kind values.
template <class V>
constexpr bool integral_targets() {
  return std::is_integral_v<detected_or_t<void, view_scalar_t, V>>;
}
template <class V>
constexpr bool floating_targets() {
  return std::is_floating_point_v<detected_or_t<void, view_scalar_t, V>>;
}

// Checked where targets of type Targets enter the API for loss L (Trainer::
// step and evaluate): the instantiation names L and Targets; the message
// says which kind of targets L takes.
template <class L, class Targets>
constexpr bool check_targets() {
  using Want = typename L::target_type;
  constexpr bool floats_for_labels = integral_targets<Want>() && floating_targets<Targets>();
  constexpr bool labels_for_floats = floating_targets<Want>() && integral_targets<Targets>();
  static_assert(!floats_for_labels,
                "telar::Trainer: the loss's target_type is class labels (integers, e.g. "
                "telar::Labels<>) but the targets given are floating-point values: pass labels "
                "of the loss's target_type (Trainer::target_type), or train with a loss for real "
                "targets (telar::MeanSquaredError)");
  static_assert(!labels_for_floats,
                "telar::Trainer: the loss's target_type is real values (a floating-point "
                "telar::Matrix) but the targets given are integer labels: pass values of the "
                "loss's target_type (Trainer::target_type), or train with a loss for labels "
                "(telar::SoftmaxCrossEntropy)");
  static_assert(std::is_convertible_v<Targets const&, Want> || floats_for_labels ||
                    labels_for_floats,
                "telar::Trainer: the targets' type is not the loss's target_type (both are named "
                "in this instantiation): pass Trainer::target_type");
  return true;
}
} // namespace detail

/*! \brief What Telar knows about a loss type. \tparam L a loss */
template <class L>
struct loss_traits {
  /*! \brief LossSum::correct is meaningful (accuracy is reported). */
  static constexpr bool has_accuracy = detail::flag_v<detail::has_accuracy_t, L>;
  /*! \brief The loss counts its own terms (count()). */
  static constexpr bool has_count = detail::is_detected_v<detail::loss_count_t, L>;
  /*! \brief The loss has a build(output shape) hook. */
  static constexpr bool has_build = detail::is_detected_v<detail::loss_build_t, L>;
  /*! \brief The loss says which targets it cannot take (invalid_targets()). */
  static constexpr bool has_invalid_targets =
      detail::is_detected_v<detail::loss_invalid_targets_t, L>;
};

/*! \brief The loss of a batch without its gradient: the loss's evaluate(), or
 *  forward_backward into a scratch gradient with scale 0.
 *  \param loss the loss \param exec execution space instance
 *  \param y model output [n, k] \param targets the batch's targets */
template <class L, class Exec>
LossSum evaluate_loss(L const& loss, Exec const& exec,
                      ConstMatrix<typename L::value_type, typename L::memory_space> y,
                      typename L::target_type const& targets) {
  if constexpr (detail::is_detected_v<detail::loss_evaluate_t, L>) {
    return loss.evaluate(exec, y, targets);
  } else {
    Matrix<typename L::value_type, typename L::memory_space> scratch(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::evaluate_loss::scratch"),
        y.extent(0), y.extent(1));
    return loss.forward_backward(exec, y, targets, scratch, typename L::value_type(0));
  }
}

/*! \brief Bytes a loss of type \p L (default-constructed) keeps between
 *  steps for \p samples outputs of shape \p out: its workspace_bytes(), else
 *  a double and an int per sample. \tparam L the loss
 *  \param samples rows \param out per-sample output shape */
template <class L>
std::size_t loss_workspace_bytes(std::size_t samples, Shape const& out) {
  if constexpr (detail::is_detected_v<detail::loss_workspace_bytes_t, L> &&
                std::is_default_constructible_v<L>)
    return L{}.workspace_bytes(samples, out);
  else
    return (void)out, detail::view_bytes<double>(samples) + detail::view_bytes<int>(samples);
}

/*! \brief Loss terms of a batch: the loss's count(), else its samples.
 *  \param loss the loss \param exec execution space instance \param targets the batch's targets */
template <class L, class Exec>
long long loss_count(L const& loss, Exec const& exec, typename L::target_type const& targets) {
  if constexpr (loss_traits<L>::has_count)
    return loss.count(exec, targets);
  else
    return static_cast<long long>(targets.extent(0));
}

} // namespace telar
