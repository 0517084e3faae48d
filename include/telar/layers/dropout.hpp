#pragma once
/*! \file
 *  \brief telar::Dropout whose mask is a pure function of (seed, step, global
 *  sample index, element), and the helpers that tell a model's dropout
 *  layers the step, the first sample and whether they train.
 *
 *  Why keyed by the global sample index: the mask a sample gets must not
 *  depend on how the batch is cut (micro-batches, data-parallel ranks,
 *  pipeline stages), so a run gives the same result whatever the layout. A
 *  layer sees only its micro-batch, so it keeps a cursor, the global index of
 *  the next sample it will see: set_random_position(step, first) sets it at
 *  the start of a step (first = the global index of this rank's first
 *  sample), and every forward advances it by the micro-batch's rows (a
 *  layer sees its micro-batches in order under every schedule).
 *
 *  The cursor is the layer's random counter in telar::Recompute's convention
 *  (random_counter() / set_random_counter()), so a recomputed forward
 *  replays exactly the mask of the first one.
 *  telar::Trainer does both itself (the position before each step, training
 *  off around evaluate()); a loop driving a model by hand does:
 *  \code
 *  telar::set_random_position(model, step, rank_first_sample);  // before each step
 *  telar::set_training(model, false);                           // evaluation: identity
 *  \endcode
 */
#include <telar/core/detail/counter_rng.hpp>
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/detail/type_traits.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/recompute.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace telar {

namespace detail {

// y = x * mask / (1 - p) where element j of sample (first + i) is kept when
// its uniform draw is >= p; the same call with dy gives dx.
template <class Exec, class In, class Out>
void dropout_apply(Exec const& exec, In const& in, Out const& out, std::uint64_t key,
                   std::uint64_t first, double p) {
  using T = typename Out::non_const_value_type;
  T const keep_scale = T(1.0 / (1.0 - p));
  T const drop = T(p);
  Kokkos::parallel_for(
      "telar::Dropout::apply",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {in.extent(0), in.extent(1)}),
      KOKKOS_LAMBDA(std::size_t i, std::size_t j) {
        T const u = uniform_at<T>(mix_seed(key, first + i), j, T(0), T(1));
        out(i, j) = u < drop ? T(0) : in(i, j) * keep_scale;
      });
}

template <class L>
using set_random_position_t =
    decltype(std::declval<L&>().set_random_position(std::uint64_t{}, std::uint64_t{}));
template <class L>
using set_training_t = decltype(std::declval<L&>().set_training(true));
template <class L>
using set_training_batch_t = decltype(std::declval<L&>().set_training_batch(std::size_t{}));

} // namespace detail

/*! \brief Inverted dropout: in training, each element is zeroed with
 *  probability p and the rest scaled by 1 / (1 - p); in evaluation, the
 *  identity.
 *
 *  The mask of element j of the sample with global index s in step t is a
 *  pure function of (seed, t, s, j) (telar's counter-based generator), so it
 *  is the same whatever the micro-batching, data-parallel split or pipeline
 *  layout, and backward regenerates it instead of storing it (the saved
 *  state is two integers). The seed comes from initialize(seed), which
 *  telar::Sequential derives from the layer's position: two dropout layers
 *  draw independent masks. See the file's notes for the step and the
 *  sample cursor.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
class Dropout : public detail::ShapePreservingLayerTypes<T, MemorySpace> {
public:
  /*! \brief Backward regenerates the mask: it reads neither tensor. */
  static constexpr BackwardReads backward_reads = BackwardReads::nothing;
  /*! \brief The key of the mask a forward used (backward regenerates it). */
  struct saved_type {
    std::uint64_t key = 0;   //!< stream of (seed, step)
    std::uint64_t first = 0; //!< global index of the micro-batch's first sample
    bool active = false;     //!< false: the forward was the identity
  };

  /*! \brief p = 0: the identity. */
  Dropout() = default;
  /*! \brief \param p probability of zeroing an element, in [0, 1)
   *  \throws Error for p outside [0, 1) */
  explicit Dropout(double p) : p_(p) {
    if (!(p >= 0.0 && p < 1.0))
      throw Error("telar::Dropout: probability " + std::to_string(p) + " is not in [0, 1)");
  }

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "Dropout"; }
  /*! \brief The input's shape. \param in any shape */
  Shape output_shape(Shape const& in) const { return in; }
  /*! \brief The drop probability. */
  double probability() const { return p_; }
  /*! \brief Cost estimate. \param samples rows \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    return double(samples) * double(in.size());
  }

  /*! \brief Keeps the mask's key only (backward regenerates the mask): 0. */
  std::size_t saved_bytes(std::size_t, Shape const&) const { return 0; }

  /*! \brief Takes the stream seed. \param seed derived by Sequential from the layer's position */
  void initialize(std::uint64_t seed) { seed_ = seed; }
  /*! \brief Step \p step starts and this rank's first sample has global index
   *  \p first_sample. \param step training step \param first_sample global index */
  void set_random_position(std::uint64_t step, std::uint64_t first_sample) {
    step_ = step;
    cursor_ = first_sample;
  }
  /*! \brief Training (masks) or evaluation (identity). \param training on or off */
  void set_training(bool training) { training_ = training; }
  /*! \brief Whether the layer drops (training). */
  bool training() const { return training_; }
  /*! \brief The global index of the next sample (Recompute's random counter). */
  std::uint64_t random_counter() const { return cursor_; }
  /*! \brief Sets the sample cursor (Recompute replays with it). \param c global sample index */
  void set_random_counter(std::uint64_t c) { cursor_ = c; }

  /*! \brief y = x * mask / (1 - p), or y = x in evaluation; advances the
   *  cursor by the micro-batch's rows. \param exec execution space instance
   *  \param x input \param y output \param saved the mask's key */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type& saved) {
    check(x.extent(0), x.extent(1), y.extent(0), y.extent(1));
    saved.active = training_ && p_ > 0.0;
    saved.key = detail::mix_seed(seed_, step_);
    saved.first = cursor_;
    if (training_)
      cursor_ += x.extent(0);
    if (saved.active)
      detail::dropout_apply(exec, x, y, saved.key, saved.first, p_);
    else
      Kokkos::deep_copy(exec, y, x);
  }
  /*! \brief dx = dy * mask / (1 - p) with the forward's mask.
   *  \param exec execution space instance \param dy output gradient
   *  \param dx input gradient \param saved the mask's key */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      saved_type const& saved) const {
    check(dy.extent(0), dy.extent(1), dx.extent(0), dx.extent(1));
    if (saved.active)
      detail::dropout_apply(exec, dy, dx, saved.key, saved.first, p_);
    else
      Kokkos::deep_copy(exec, dx, dy);
  }

private:
  static void check(std::size_t an, std::size_t ak, std::size_t bn, std::size_t bk) {
    if (an != bn || ak != bk)
      throw ShapeError("telar::Dropout: input [" + std::to_string(an) + ", " + std::to_string(ak) +
                       "] and output [" + std::to_string(bn) + ", " + std::to_string(bk) +
                       "] differ");
  }

  double p_ = 0.0;
  std::uint64_t seed_ = 0;
  std::uint64_t step_ = 0;
  std::uint64_t cursor_ = 0;
  bool training_ = true;
};

/*! \brief Tells every dropout layer of \p model (through blocks and
 *  telar::Recompute) that step \p step starts and that this rank's first
 *  sample of the step has global index \p first_sample; call before each
 *  step (data parallelism: first_sample = the rank's offset in the global
 *  batch). \param model a layer or block \param step training step
 *  \param first_sample global index of this rank's first sample */
template <class Model>
void set_random_position(Model& model, std::uint64_t step, std::uint64_t first_sample) {
  auto f = [&](auto& l) {
    if constexpr (detail::is_detected_v<detail::set_random_position_t, std::decay_t<decltype(l)>>)
      l.set_random_position(step, first_sample);
  };
  detail::for_each_stochastic(model, f);
}

/*! \brief Switches every dropout layer of \p model to training (masks) or
 *  evaluation (identity). \param model a layer or block \param training on or off */
template <class Model>
void set_training(Model& model, bool training) {
  auto f = [&](auto& l) {
    if constexpr (detail::is_detected_v<detail::set_training_t, std::decay_t<decltype(l)>>)
      l.set_training(training);
  };
  detail::for_each_stochastic(model, f);
}

/*! \brief Tells every layer of \p model whose training needs several
 *  samples (BatchNorm's batch statistics) how many each micro-batch of this
 *  rank holds, so that the model's shape pass (output_shape, build) refuses
 *  too few before any step; telar::Trainer calls it. \param model a layer or
 *  block \param samples per micro-batch (0: unknown, nothing refused) */
template <class Model>
void set_training_batch(Model& model, std::size_t samples) {
  auto f = [&](auto& l) {
    if constexpr (detail::is_detected_v<detail::set_training_batch_t, std::decay_t<decltype(l)>>)
      l.set_training_batch(samples);
  };
  detail::for_each_stochastic(model, f);
}

} // namespace telar
