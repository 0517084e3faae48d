#pragma once
/*! \file
 *  \brief telar::calibrate_layers: times each layer of a model at its own
 *  shapes and the micro-batch sizes a plan will ask about, and caches the
 *  times in a telar::MachineProfile, which telar::predict_step prefers to
 *  its FLOP rates. */
#include <telar/core/recompute.hpp>
#include <telar/core/sequential.hpp>
#include <telar/layers/dropout.hpp>
#include <telar/parallel/detail/step_cost_detail.hpp>
#include <telar/parallel/machine_profile.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#include <time.h>

namespace telar {

/*! \brief The micro-batch row counts the layouts of \p world_size ranks may
 *  run for a global batch of \p batch: batch / dp / m for every dp dividing
 *  the world and every m of \p microbatches dividing the local batch.
 *  \param batch global batch \param world_size ranks
 *  \param microbatches micro-batch counts the planner tries */
inline std::vector<std::size_t> planned_rows(std::size_t batch, int world_size,
                                             std::vector<int> const& microbatches = {1, 2, 4, 8}) {
  std::vector<std::size_t> rows;
  for (int dp = 1; dp <= world_size; ++dp) {
    if (world_size % dp != 0 || batch % std::size_t(dp) != 0)
      continue;
    std::size_t const local = batch / std::size_t(dp);
    for (int m : microbatches)
      if (m > 0 && local % std::size_t(m) == 0)
        rows.push_back(local / std::size_t(m));
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

namespace detail {

// The fastest of `reps` timed calls after one warm-up, each fenced: on a
// shared machine the noise is one-sided (a descheduled call only takes
// longer), and contention is modelled apart (shared_slowdown, sync_wait).
// A median of 3 let one preempted burst put a 36 ms forward into the cache
// for a 2-row Dense (see the validation in docs/planner.md).
// On the host's serial backend a call is timed in this thread's CPU time:
// time spent descheduled (other ranks, other users) is not the layer's, and
// the cost model adds it back from the run's measured cpu_share; wall time
// let the load at calibration time into the cache (cnn layers 2-4x slow).
// Other backends (threads, devices) are timed by the wall clock.
inline double calibration_clock() {
#if defined(KOKKOS_ENABLE_SERIAL) && defined(CLOCK_THREAD_CPUTIME_ID)
  if constexpr (std::is_same_v<Kokkos::DefaultExecutionSpace, Kokkos::Serial>) {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
#endif
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <class F>
double best_call_seconds(int reps, F&& f) {
  f();
  Kokkos::fence();
  std::vector<double> t;
  for (int i = 0; i < std::max(1, reps); ++i) {
    double const t0 = calibration_clock();
    f();
    Kokkos::fence();
    t.push_back(calibration_clock() - t0);
  }
  return *std::min_element(t.begin(), t.end());
}

// `rows`, or 2 for a layer that cannot train on `rows` samples alone
// (BatchNorm on one value per channel: a data-parallel SyncStats run sums
// the ranks' values, the copy timed here has no group): timed on 2 rows, a
// layer of one row per rank is planned a little slow rather than not at all.
template <class S>
std::size_t trainable_rows(S& seq, Shape const& in, std::size_t rows) {
  set_training_batch(seq, rows);
  try {
    (void)seq.output_shape(in);
    return rows;
  } catch (ShapeError const&) {
    set_training_batch(seq, 2);
    return 2;
  }
}

// One layer (as a one-layer Sequential, which dispatches split or fused
// backward) timed at `rows`.
template <class L>
LayerTiming time_layer(L const& layer, Shape const& in, std::size_t rows, int reps) {
  using T = typename L::value_type;
  using M = typename L::memory_space;
  Sequential<L> seq(layer);
  std::vector<Shape> const shapes = seq.build(in);
  seq.initialize(1);
  rows = trainable_rows(seq, in, rows);
  Matrix<T, M> x("telar::calibrate::x", rows, in.size());
  Matrix<T, M> y("telar::calibrate::y", rows, shapes.back().size());
  Matrix<T, M> dy("telar::calibrate::dy", rows, shapes.back().size());
  Matrix<T, M> dx("telar::calibrate::dx", rows, in.size());
  // 1: a valid input for every layer, token ids of an Embedding included
  // (0.5 made telar::Embedding refuse the calibration of the GPT example).
  Kokkos::deep_copy(x, T(1));
  Kokkos::deep_copy(dy, T(0.01));
  typename Sequential<L>::saved_type saved;
  Kokkos::DefaultExecutionSpace exec;
  LayerTiming t;
  t.forward = best_call_seconds(reps, [&] { seq.forward(exec, x, y, saved); });
  t.backward_input =
      best_call_seconds(reps,
                        [&] {
                          seq.forward(exec, x, y,
                                      saved); // backward_weight consumes what backward_input keeps
                          Kokkos::fence();
                          seq.backward_input(exec, dy, dx, saved);
                        }) -
      t.forward;
  if constexpr (layer_traits<L>::has_backward_weight)
    t.backward_weight = best_call_seconds(reps,
                                          [&] {
                                            seq.forward(exec, x, y, saved);
                                            seq.backward_input(exec, dy, dx, saved);
                                            Kokkos::fence();
                                            seq.backward_weight(exec, dy, saved);
                                          }) -
                        t.forward - t.backward_input;
  t.backward_input = std::max(t.backward_input, 0.0);
  t.backward_weight = std::max(t.backward_weight, 0.0);
  return t;
}

} // namespace detail

/*! \brief The calibration group of \p layer (a telar::Recompute layer: the
 *  layer it wraps) at per-sample shapes \p in -> \p out, at this process's
 *  Kokkos thread count (MachineProfile::layer_group()). */
template <class L>
std::string calibration_group(L const& layer, Shape const& in, Shape const& out,
                              int threads = detail::calibration_threads()) {
  return detail::calibration_group(layer, in, out, threads);
}

/*! \brief Times forward, backward_input and backward_weight of every
 *  top-level layer of \p model (a telar::Recompute layer: the layer it
 *  wraps) at its shapes for each of \p rows (the fastest of \p reps calls
 *  after a warm-up), and adds them to \p profile;
 *  sizes already in the profile are not timed again, so a cached profile
 *  makes this free. Runs on this process alone (call it on one rank while
 *  the others wait, as telar_probe does: contention is the profile's
 *  shared_slowdown). Takes seconds for the examples' models.
 *  \code
 *  auto prof = telar::load_machine_profile();
 *  if (telar::calibrate_layers(model, 784, telar::planned_rows(64, 2), prof) > 0)
 *    telar::save_machine_profile(prof, telar::default_profile_path());
 *  \endcode
 *  \param model the model (not initialised) \param in per-sample input shape
 *  \param rows micro-batch sizes to time \param profile updated in place
 *  \param reps timed calls per measurement (after one warm-up)
 *  \return how many (layer, rows) pairs were timed */
template <class Model>
std::size_t calibrate_layers(Model const& model, Shape const& in,
                             std::vector<std::size_t> const& rows, MachineProfile& profile,
                             int reps = 5) {
  Model m = model;
  std::vector<Shape> const shapes = m.build(in);
  int const threads = detail::calibration_threads();
  std::size_t timed = 0;
  m.for_each_layer([&](auto index, auto const& layer) {
    using L = std::decay_t<decltype(layer)>;
    Shape const& x = shapes[index];
    std::string const group = detail::calibration_group(layer, x, shapes[index + 1], threads);
    for (std::size_t r : rows) {
      if (r == 0 || profile.layer_times[group].count(r) > 0)
        continue;
      if constexpr (detail::is_recompute_v<L>)
        profile.layer_times[group][r] = detail::time_layer(layer.inner(), x, r, reps);
      else
        profile.layer_times[group][r] = detail::time_layer(layer, x, r, reps);
      ++timed;
    }
  });
  return timed;
}

/*! \brief Times the loss's forward_backward on \p rows outputs of shape
 *  \p out (group "loss <name> <out>"), as calibrate_layers() does for layers.
 *  \return how many sizes were timed */
template <class Loss>
std::size_t calibrate_loss(Shape const& out, std::vector<std::size_t> const& rows,
                           MachineProfile& profile, int reps = 3) {
  using T = typename Loss::value_type;
  using M = typename Loss::memory_space;
  using Target = typename Loss::target_type;
  std::string const group = MachineProfile::layer_group("loss " + layer_name(Loss{}), out.str(),
                                                        "[]", detail::calibration_threads());
  std::size_t timed = 0;
  for (std::size_t r : rows) {
    if (r == 0 || profile.layer_times[group].count(r) > 0)
      continue;
    Loss loss;
    Matrix<T, M> y("telar::calibrate::logits", r, out.size());
    Matrix<T, M> dy("telar::calibrate::dlogits", r, out.size());
    Kokkos::deep_copy(y, T(0.1));
    Target target;
    if constexpr (std::size_t(Target::rank) == 1)
      target = Target("telar::calibrate::target", r);
    else
      target = Target("telar::calibrate::target", r, out.size());
    Kokkos::DefaultExecutionSpace exec;
    LayerTiming t;
    t.forward = detail::best_call_seconds(
        reps, [&] { (void)loss.forward_backward(exec, y, target, dy, T(1) / T(r)); });
    profile.layer_times[group][r] = t;
    ++timed;
  }
  return timed;
}

} // namespace telar
