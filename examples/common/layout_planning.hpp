// --layout auto, --dry-run and the predicted step time: what the examples
// that train with a telar::Trainer share around the planner
// (docs/planner.md). Apart from example_support.hpp so that an example
// without these flags (hpsearch) does not compile the cost model.
#pragma once

#include "example_support.hpp"

#include <telar/comm/topology.hpp>
#include <telar/parallel/calibrate.hpp>
#include <telar/parallel/machine_probe.hpp>
#include <telar/parallel/planner.hpp>
#include <telar/parallel/precision.hpp>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace example {

inline int world_size(MPI_Comm comm) {
  int n = 1;
  MPI_Comm_size(comm, &n);
  return n;
}

namespace detail {

// MPI_Bcast that waits asleep: while rank 0 calibrates, the others poll
// every millisecond instead of spinning, so on shared cores (4 ranks on 2)
// rank 0 times its layers on a core of its own, not on half of one.
inline void bcast_asleep(void* data, int count, MPI_Datatype type, MPI_Comm comm) {
  MPI_Request req;
  MPI_Ibcast(data, count, type, 0, comm, &req);
  for (int done = 0;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done)
      return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Rank 0's `text` on every rank; a leading '!' marks an error, thrown on
// every rank alike (rank 0 must not fail alone: the others would wait).
inline std::string broadcast_or_throw(MPI_Comm comm, std::string text) {
  unsigned long long n = text.size();
  bcast_asleep(&n, 1, MPI_UNSIGNED_LONG_LONG, comm);
  text.resize(n);
  bcast_asleep(text.data(), int(n), MPI_CHAR, comm);
  if (!text.empty() && text[0] == '!')
    throw telar::Error(text.substr(1));
  return text;
}

// Says what a calibration timed and saves `profile` to --profile /
// $TELAR_PROFILE when one is named (never to the shared default cache, which
// older builds read).
inline void keep_calibration(CommonArgs const& a, telar::MachineProfile const& profile,
                             std::size_t timed, double seconds) {
  if (timed == 0)
    return;
  char const* env = std::getenv("TELAR_PROFILE");
  bool const keep = !a.profile.empty() || (env != nullptr && *env != 0);
  std::string const path = a.profile.empty() ? telar::default_profile_path() : a.profile;
  std::fprintf(stderr, "calibration: %zu layer sizes timed in %.2f s%s%s\n", timed, seconds,
               keep ? ", cached in " : "", keep ? path.c_str() : "");
  if (keep)
    try {
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
      telar::MachineProfile machine = profile; // the run's scheduler is not the machine's
      machine.cpu_share = machine.slice_us = machine.descheduled_us = 0;
      machine.ranks_per_node = 0;
      telar::save_machine_profile(machine, path);
    } catch (std::exception const& e) {
      std::fprintf(stderr, "calibration: not cached (%s)\n", e.what());
    }
}

// Rank 0 times what `profile` lacks of `model` and its loss at `rows`
// (keep_calibration).
template <class Model, class Loss>
void calibrate_on_root(CommonArgs const& a, Model const& model, telar::Shape const& in,
                       std::vector<std::size_t> const& rows, telar::MachineProfile& profile) {
  auto const t0 = std::chrono::steady_clock::now();
  Model m = model;
  std::size_t const timed = telar::calibrate_layers(model, in, rows, profile) +
                            telar::calibrate_loss<Loss>(m.build(in).back(), rows, profile);
  keep_calibration(a, profile, timed,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// Rank 0, alone (the others wait asleep), once per process: measures the
// compute part of `profile` again when it was measured under conditions
// that differ from this run's beyond telar::StalenessMargins (another load,
// share of a core, build or probe method; or none recorded), says so, and
// writes it back to the file it came from, so the next run under like
// conditions does not measure again (telar::refresh_stale_profile(): never
// a profile written by hand, nor a read-only file). Layer times go too
// (calibration times the sizes this run needs); message costs and fixed step
// costs stay (they need every rank: telar_probe). TELAR_CPU_SHARE (runs
// planned alike whatever the load) keeps the profile as it is.
inline void refresh_if_stale(CommonArgs const& a, telar::MachineProfile& profile) {
  if (char const* fixed = std::getenv("TELAR_CPU_SHARE"); fixed != nullptr && *fixed)
    return;
  std::string const path = a.profile.empty() ? telar::default_profile_path() : a.profile;
  telar::ProfileConditions now = telar::current_conditions(profile.cores);
  now.cpu_share = telar::measure_scheduling(0.1).cpu_share;
  telar::ProfileRefresh const r = telar::refresh_stale_profile(profile, path, now);
  if (!r.staleness.stale)
    return;
  std::string const file = r.saved          ? "written back"
                           : r.kept.empty() ? "warning: not written back (" + r.failed + ")"
                                            : "the file kept as is (" + r.kept + ")";
  std::fprintf(stderr,
               "profile %s is stale: %s; compute rates and optimizer re-measured in %.2f s "
               "(optimizer %.1f ns/parameter), layer times re-calibrated; message costs kept "
               "(mpirun telar_probe to re-measure them); %s\n",
               path.c_str(), r.staleness.reason.c_str(), r.seconds,
               profile.optimizer_ns_per_parameter, file.c_str());
}

// Ranks per node of this run (the fewest on any node; 0 when every rank
// shares one node): collectives whose group spans nodes are costed with the
// profile's "across" link class. The nodes are the Trainer's
// (telar::node_layout), so TELAR_RANKS_PER_NODE=n, which fakes nodes of n
// ranks on one host, makes a --dry-run there predict a run over such nodes.
inline int ranks_per_node(MPI_Comm comm) {
  static int seen = -1;
  if (seen >= 0)
    return seen;
  telar::NodeLayout const nodes = telar::node_layout(telar::Communicator(comm, "node layout"));
  int fewest = nodes.ranks_per_node; // nodes may differ: every rank plans alike
  MPI_Allreduce(MPI_IN_PLACE, &fewest, 1, MPI_INT, MPI_MIN, comm);
  seen = nodes.nodes > 1 ? fewest : 0;
  return seen;
}

// The profile at --profile (else the cached one), refreshed when stale:
// once per process, whatever the model types an example plans (each
// machine_profile<Model, Loss> keeps its own copy).
inline telar::MachineProfile loaded_profile(CommonArgs const& a) {
  static std::optional<telar::MachineProfile> base;
  if (!base) {
    base = telar::load_machine_profile(a.profile);
    refresh_if_stale(a, *base);
  }
  return *base;
}

// The scheduler as this run sees it (cpu_share, slice_us, descheduled_us):
// every rank spins at once, as in a step, and all take the mean over ranks,
// so every rank predicts alike. Once per process: the plan and the closing
// prediction use the same share. Not saved with the calibration (the load
// belongs to the run, not to the machine).
inline void add_scheduling(MPI_Comm comm, telar::MachineProfile& profile) {
  static std::optional<std::array<double, 3>> seen;
  // TELAR_CPU_SHARE=s stands in for the measurement (tests, and runs to be
  // planned alike whatever the load): the model's defaults for the rest.
  if (char const* fixed = std::getenv("TELAR_CPU_SHARE"); !seen && fixed != nullptr && *fixed)
    seen = std::array<double, 3>{std::clamp(std::atof(fixed), 0.01, 1.0), 0.0, 0.0};
  if (!seen) {
    MPI_Barrier(comm);
    // 250 ms: under a load of 15 a rank runs ~4 ms between 20-40 ms gaps;
    // 50 ms saw one gap or none and read a share of 0.6 for a true 0.15.
    telar::SchedulingSample const s = telar::measure_scheduling(0.25);
    std::array<double, 3> v{s.cpu_share, s.slice_us, s.descheduled_us};
    MPI_Allreduce(MPI_IN_PLACE, v.data(), 3, MPI_DOUBLE, MPI_SUM, comm);
    for (double& x : v)
      x /= double(world_size(comm));
    seen = v;
  }
  profile.cpu_share = (*seen)[0];
  profile.slice_us = (*seen)[1];
  profile.descheduled_us = (*seen)[2];
  profile.ranks_per_node = ranks_per_node(comm);
}

} // namespace detail

// The machine profile (--profile, else the cached one) with every layer of
// `model` timed at `rows` samples: rank 0 calibrates what the profile lacks
// while the others wait (contention is the profile's shared_slowdown) and
// sends the result to every rank, so all plan and predict alike. Collective;
// the profile is loaded once per process and grows with each call.
template <class Model, class Loss = telar::SoftmaxCrossEntropy<typename Model::value_type,
                                                               typename Model::memory_space>>
telar::MachineProfile const& machine_profile(MPI_Comm comm, CommonArgs const& a, Model const& model,
                                             telar::Shape const& in,
                                             std::vector<std::size_t> const& rows) {
  static std::optional<telar::MachineProfile> cached;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string json;
  if (rank == 0)
    try {
      if (!cached)
        cached = detail::loaded_profile(a);
      detail::calibrate_on_root<Model, Loss>(a, model, in, rows, *cached);
      json = cached->to_json();
    } catch (std::exception const& e) {
      json = std::string("!") + e.what();
    }
  cached = telar::MachineProfile::from_json(detail::broadcast_or_throw(comm, json));
  detail::add_scheduling(comm, *cached);
  return *cached;
}

// The model a Trainer<Model, Strategy, ...> trains, which the cost model
// calibrates and predicts: under --precision bf16 (telar::Precision<bf16,
// float> in Strategy) `model` rebound (telar::WithPrecision), whose layers
// are timed in bf16, apart from fp32 ones; else `model` itself.
template <class Strategy, class Model>
auto trained_model(Model const& model) {
  return telar::with_precision<telar::detail::strategy_precision_t<Strategy>>(model);
}

// Every layout of this world that a Trainer<Model, Strategy, Optimizer,
// Loss> can run, ranked (collective: calibrates first): the layouts of the
// model it trains (trained_model). An example whose flags pick among several
// strategy or model types merges their plans.
template <class Model, class Strategy, class Optimizer,
          class Loss =
              telar::SoftmaxCrossEntropy<typename Model::value_type, typename Model::memory_space>>
telar::LayoutPlan plan_of(MPI_Comm comm, CommonArgs const& a, Model const& model,
                          telar::Shape const& in) {
  auto const trained = trained_model<Strategy>(model);
  using Trained = std::decay_t<decltype(trained)>;
  int const world = world_size(comm);
  telar::LayoutOptions opts;
  opts.batch_size = a.batch;
  opts.bf16_weight_copy = a.bf16_weight_copy;
  telar::PlannerOptions search;
  search.memory_budget = a.memory_budget;
  auto const& prof =
      machine_profile<Trained, Loss>(comm, a, trained, in, telar::planned_rows(a.batch, world));
  return telar::plan_layout<Trained, Strategy, Optimizer, Loss>(trained, opts, in, world, prof,
                                                                search);
}

// Plans of several strategy or model types (ZeRO stages, recomputation)
// ranked together: the layouts an example's flags can choose from.
inline telar::LayoutPlan merged(std::initializer_list<telar::LayoutPlan> plans) {
  telar::LayoutPlan out = *plans.begin();
  for (auto it = std::next(plans.begin()); it != plans.end(); ++it)
    out.merge(*it);
  return out;
}

// --dry-run prints the plan (rank 0; JSON on stdout with --json) and returns
// false: train nothing. --layout auto takes the fastest layout that fits into
// `a` (degrees, schedule, micro-batches; the example sets what its types
// decide, such as ZeRO or recomputation) and says why. Every rank plans
// alike (the same flags and the broadcast profile), so all choose alike.
inline bool take_plan(MPI_Comm comm, CommonArgs& a, telar::LayoutPlan const& plan,
                      char const* program) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (a.dry_run) {
    if (rank == 0) {
      std::fprintf(stderr, "%s: layouts of %d ranks, global batch %zu, profile %s\n%s", program,
                   world_size(comm), a.batch, plan.profile.c_str(), plan.table().c_str());
      if (a.json) {
        std::printf("%s\n", plan.json().c_str());
        std::fflush(stdout);
      }
    }
    return false;
  }
  if (!a.layout_auto)
    return true;
  telar::LayoutCandidate const& best = plan.best();
  a.dp = best.grid.dp;
  a.pp = best.grid.pp;
  a.tp = best.grid.tp;
  a.schedule = best.schedule;
  a.microbatches = best.microbatches;
  a.layout_reason = best.reason;
  if (rank == 0)
    std::fprintf(stderr, "layout auto: chose %s, predicted %.2f ms/step (%s)\n", best.str().c_str(),
                 best.predicted_step_ms, best.reason.c_str());
  return true;
}

// Whether the flags ask for a plan: --layout auto, --dry-run, or a
// --memory-budget (whose refusal names the fastest layout that fits).
inline bool wants_plan(CommonArgs const& a) {
  return a.layout_auto || a.dry_run || a.memory_budget > 0;
}

// The plan `make()` computes when the flags want one, taken into `a`;
// false after --dry-run (train nothing).
template <class MakePlan>
bool plan_run(MPI_Comm comm, CommonArgs& a, std::optional<telar::LayoutPlan>& plan,
              char const* program, MakePlan make) {
  if (!wants_plan(a))
    return true;
  plan = make();
  return take_plan(comm, a, *plan, program);
}

// Builds the Trainer; a layout given by flags that the budget refuses is
// refused naming, besides the cheapest fitting layout, the planner's fastest
// (or, under the default budget, where that budget comes from).
template <class Build>
auto with_fastest_fitting(std::optional<telar::LayoutPlan> const& plan, Build build) {
  try {
    return build();
  } catch (telar::MemoryError const& e) {
    if (!plan || plan->ranked.empty())
      throw telar::MemoryError(e.what() + default_budget_note);
    auto const& best = plan->ranked.front();
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.2f", best.predicted_step_ms);
    throw telar::MemoryError(std::string(e.what()) + "; the fastest layout that fits: " +
                             best.str() + ", predicted " + ms + " ms/step (--layout auto)");
  }
}

// The cost model's step time of the layout `trainer` runs (collective):
// `model` is a copy of its model before initialisation. Only this layout's
// micro-batch size is calibrated when no plan did it already. Calibrated and
// predicted is the model the Trainer trains (trained_model).
template <class Model, class Strategy, class Optimizer, class Loss>
double predicted_step_ms(MPI_Comm comm, CommonArgs const& a, Model const& model,
                         telar::Trainer<Model, Strategy, Optimizer, Loss> const& trainer,
                         telar::Shape const& in) {
  auto const trained = trained_model<Strategy>(model);
  using Trained = std::decay_t<decltype(trained)>;
  telar::TrainerOptions const& opts = trainer.options();
  std::size_t const rows =
      a.batch / std::size_t(trainer.grid_shape().dp) / std::size_t(opts.microbatches);
  auto const& prof = machine_profile<Trained, Loss>(comm, a, trained, in, {rows});
  return telar::predict_step<Trained, Strategy, Optimizer, Loss>(trained, opts, in,
                                                                 world_size(comm), prof)
      .step_ms;
}

} // namespace example
