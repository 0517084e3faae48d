#pragma once
/*! \file
 *  \brief telar::calibrate_layers: times each layer of a model at its own
 *  shapes and the micro-batch sizes a plan will ask about, and caches the
 *  times in a telar::MachineProfile, which telar::predict_step prefers to
 *  its FLOP rates. */
#include <telar/core/recompute.hpp>
#include <telar/core/sequential.hpp>
#include <telar/layers/dropout.hpp>
#include <telar/parallel/detail/stage_runner.hpp>
#include <telar/parallel/detail/step_cost_detail.hpp>
#include <telar/parallel/machine_profile.hpp>
#include <telar/profile/memory.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <limits>
#include <map>
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

// The fastest of `reps` calls of f after a warm-up, each after an untimed
// call of `setup` (what f needs: a backward part's forward).
template <class Setup, class F>
double best_call_seconds(int reps, Setup&& setup, F&& f) {
  setup();
  f();
  Kokkos::fence();
  std::vector<double> t;
  for (int i = 0; i < std::max(1, reps); ++i) {
    setup();
    Kokkos::fence();
    double const t0 = calibration_clock();
    f();
    Kokkos::fence();
    t.push_back(calibration_clock() - t0);
  }
  return *std::min_element(t.begin(), t.end());
}
template <class F>
double best_call_seconds(int reps, F&& f) {
  return best_call_seconds(
      reps, [] {}, f);
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

// Forward, backward-input and (`weight`) backward-weight of `callee` (a
// layer-like object: forward, backward_input, backward_weight, saved_type)
// from `in_cols` to `out_cols` features at `rows`, each the fastest of
// `reps`. Each backward part is timed alone, after the calls it needs
// (untimed): a difference of two fastest sums came out 0 or negative for a
// small layer on a loaded machine.
template <bool weight, class Callee>
LayerTiming time_calls(Callee& callee, std::size_t in_cols, std::size_t out_cols, std::size_t rows,
                       int reps) {
  using T = typename Callee::value_type;
  using M = typename Callee::memory_space;
  Matrix<T, M> x("telar::calibrate::x", rows, in_cols);
  Matrix<T, M> y("telar::calibrate::y", rows, out_cols);
  Matrix<T, M> dy("telar::calibrate::dy", rows, out_cols);
  Matrix<T, M> dx("telar::calibrate::dx", rows, in_cols);
  // 1: a valid input for every layer, token ids of an Embedding included
  // (0.5 made telar::Embedding refuse the calibration of the GPT example).
  Kokkos::deep_copy(x, T(1));
  Kokkos::deep_copy(dy, T(0.01));
  typename Callee::saved_type saved{};
  Kokkos::DefaultExecutionSpace exec;
  auto const forward = [&] { callee.forward(exec, x, y, saved); };
  auto const input = [&] { callee.backward_input(exec, dy, dx, saved); };
  LayerTiming t;
  t.forward = best_call_seconds(reps, forward);
  t.backward_input = best_call_seconds(reps, forward, input);
  if constexpr (weight)
    t.backward_weight = best_call_seconds(
        reps,
        [&] {
          forward(); // backward_weight consumes what backward_input keeps
          input();
        },
        [&] { callee.backward_weight(exec, dy, saved); });
  return t;
}

// One layer (as a one-layer Sequential, which dispatches split or fused
// backward) timed at `rows`.
template <class L>
LayerTiming time_layer(L const& layer, Shape const& in, std::size_t rows, int reps) {
  Sequential<L> seq(layer);
  std::vector<Shape> const shapes = seq.build(in);
  seq.initialize(1);
  rows = trainable_rows(seq, in, rows);
  return time_calls<layer_traits<L>::has_backward_weight>(seq, in.size(), shapes.back().size(),
                                                          rows, reps);
}

// The executor's hooks, stamping this clock at each call: a layer's forward
// runs from its before_forward to the next stamp, its input gradient from
// its before_backward to the next, its weight gradient up to its
// gradient_ready (from the stamp before it).
struct ChainStamps : NoStepHooks {
  std::vector<double> at;
  std::vector<std::size_t> layer;
  void mark(std::size_t k) {
    Kokkos::fence();
    at.push_back(calibration_clock());
    layer.push_back(k);
  }
  void before_forward(std::size_t k) { mark(k); }
  void before_backward(std::size_t k) { mark(k); }
  void gradient_ready(std::size_t k) { mark(k); }
};

// `best[k]` := min(best[k], the time from stamp i of layer k to stamp i + 1)
// for `from_stamp`, or from stamp i - 1 to stamp i (gradient_ready).
inline void keep_fastest(ChainStamps const& s, bool from_stamp, std::vector<double>& best) {
  for (std::size_t i = 1; i < s.at.size(); ++i) {
    std::size_t const k = s.layer[from_stamp ? i - 1 : i];
    if (k < best.size())
      best[k] = std::min(best[k], s.at[i] - s.at[i - 1]);
  }
}

// Each layer's calibration group (a Recompute layer: the layer it wraps).
template <class Model>
std::vector<std::string> calibration_groups(Model const& m, std::vector<Shape> const& shapes) {
  int const threads = calibration_threads();
  std::vector<std::string> groups;
  m.for_each_layer([&](auto index, auto const& layer) {
    groups.push_back(detail::calibration_group(layer, shapes[index], shapes[index + 1], threads));
  });
  return groups;
}

// Every layer of `m` (built, initialised) timed in the chain at `rows`, as
// telar::calibrate_layers() says. The model's first layer computes no input
// gradient in a step (StageRunner::input_part; a block's weight part runs
// its inner gradients instead): where its backward is split, that part is
// timed alone, so that its group means the same call wherever it is met. A
// Recompute layer's forward again is taken out of its backward (the cost
// model adds it back).
template <class Model>
std::vector<LayerTiming> time_chain(Model& m, std::vector<Shape> const& shapes, std::size_t rows,
                                    int reps) {
  using T = typename Model::value_type;
  using MS = typename Model::memory_space;
  std::size_t const n = shapes.size() - 1;
  rows = trainable_rows(m, shapes[0], rows);
  if constexpr (is_detected_v<stage_boundaries_t, Model>)
    m.set_stage_boundaries({0, n});
  StageRunner<Model> runner(&m, 0, n, feature_sizes(shapes));
  int const slot = runner.acquire(rows);
  Matrix<T, MS> x("telar::calibrate::x", rows, shapes[0].size());
  Kokkos::deep_copy(x, T(1)); // a valid input for every first layer (token ids too)
  Kokkos::deep_copy(runner.output_grad(slot), T(0.01));
  double const inf = std::numeric_limits<double>::infinity();
  std::vector<double> fwd(n, inf), bi(n, inf), bw(n, inf);
  typename Model::execution_space exec;
  for (int rep = 0; rep <= std::max(1, reps); ++rep) {
    ChainStamps f, b, w;
    runner.forward(exec, slot, ConstMatrix<T, MS>(x), f);
    f.mark(n);
    runner.backward_input(exec, slot, b);
    b.mark(n);
    w.mark(n);
    runner.backward_weight(exec, slot, w);
    if (rep == 0)
      continue; // warm-up: first touches, oneDNN primitives
    keep_fastest(f, true, fwd);
    keep_fastest(b, true, bi);
    keep_fastest(w, false, bw);
  }
  std::vector<LayerTiming> t(n);
  m.for_each_layer([&](auto index, auto const& layer) {
    using L = std::decay_t<decltype(layer)>;
    std::size_t const k = index;
    auto finite = [](double v) { return std::isfinite(v) ? std::max(v, 0.0) : 0.0; };
    t[k] = LayerTiming{finite(fwd[k]), finite(bi[k]), finite(bw[k])};
    if constexpr (is_recompute_v<L>)
      t[k].backward_input = std::max(0.0, t[k].backward_input - t[k].forward);
    else if constexpr (layer_traits<L>::has_split_backward)
      if (k == 0) {
        t[k].backward_input = time_layer(layer, shapes[0], rows, reps).backward_input;
        if constexpr (layer_traits<L>::backward_input_first) // a block's inner gradients
          t[k].backward_weight = std::max(0.0, t[k].backward_weight - t[k].backward_input);
      }
  });
  runner.release(slot);
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
 *  wraps) at its shapes for each of \p rows, and adds them to \p profile.
 *  Each layer is timed where a training step runs it: the whole model runs
 *  forward, then backward, through the Trainer's own stage runner, and each
 *  call is the fastest of \p reps passes after a warm-up. A backward then
 *  reads what its forward saved long before, with every other layer's data
 *  in between, as in a step; timed alone, right after its forward, the cnn
 *  example's layers took about half their time in the step (docs/planner.md,
 *  "Validation"). A group met more than once (two ReLUs of one width) gets
 *  the mean of its calls. Sizes already in the profile are not timed again,
 *  so a cached profile makes this free. Runs on this process alone (call it
 *  on one rank while the others wait, as telar_probe does: contention is the
 *  profile's shared_slowdown). Takes seconds for the examples' models.
 *  \code
 *  auto prof = telar::load_machine_profile();
 *  if (telar::calibrate_layers(model, 784, telar::planned_rows(64, 2), prof) > 0)
 *    telar::save_machine_profile(prof, telar::default_profile_path());
 *  \endcode
 *  \param model the model (not initialised) \param in per-sample input shape
 *  \param rows micro-batch sizes to time \param profile updated in place
 *  \param reps timed passes per size (after one warm-up)
 *  \return how many (group, rows) pairs were timed */
template <class Model>
std::size_t calibrate_layers(Model const& model, Shape const& in,
                             std::vector<std::size_t> const& rows, MachineProfile& profile,
                             int reps = 5) {
  MemoryMeter::Uncounted uncounted; // this model's buffers are no trainer's
  Model m = model;
  std::vector<Shape> const shapes = m.build(in);
  m.initialize(1);
  std::vector<std::string> const groups = detail::calibration_groups(m, shapes);
  std::size_t timed = 0;
  for (std::size_t r : rows) {
    auto missing = [&](std::string const& g) { return profile.layer_times[g].count(r) == 0; };
    if (r == 0 || std::none_of(groups.begin(), groups.end(), missing))
      continue;
    std::map<std::string, std::pair<LayerTiming, int>> sums;
    std::vector<LayerTiming> const t = detail::time_chain(m, shapes, r, reps);
    for (std::size_t k = 0; k < groups.size(); ++k)
      if (missing(groups[k])) {
        auto& [sum, calls] = sums[groups[k]];
        sum.forward += t[k].forward;
        sum.backward_input += t[k].backward_input;
        sum.backward_weight += t[k].backward_weight;
        ++calls;
      }
    for (auto const& [group, sum] : sums) {
      double const n = double(sum.second);
      profile.layer_times[group][r] = LayerTiming{
          sum.first.forward / n, sum.first.backward_input / n, sum.first.backward_weight / n};
      ++timed;
    }
  }
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
  MemoryMeter::Uncounted uncounted;
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
