#pragma once
/*! \file
 *  \brief telar::plan_layout: every layout of a world size that the memory
 *  plan fits in the budget, ranked by the step time telar::predict_step
 *  predicts, with why the others were refused. */
#include <telar/parallel/detail/planner_detail.hpp>
#include <telar/parallel/detail/run_layout_detail.hpp>
#include <telar/parallel/step_cost.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace telar {

/*! \brief One layout the planner considered. */
struct LayoutCandidate {
  GridShape grid{1, 1, 1};      //!< dp x pp x tp
  int zero_stage = 0;           //!< data-parallel sharding (0: NoSharding)
  std::string schedule;         //!< pipeline schedule name (1f1b without pipelining)
  int microbatches = 1;         //!< micro-batches per step
  bool recompute = false;       //!< every layer recomputed in backward
  bool fits = false;            //!< the memory plan fits and the layout can run
  double predicted_step_ms = 0; //!< telar::predict_step's step time (fitting layouts)
  std::size_t memory_bytes = 0; //!< the largest rank's planned total (0 when not planned)
  StepPrediction prediction;    //!< where the predicted time goes
  std::string reason;           //!< why chosen, why slower, or why refused

  /*! \brief e.g. "dp=2 x pp=1 x tp=1, ZeRO-1, 1f1b, 2 micro-batches, recompute". */
  std::string str() const {
    std::string s = ProcessGrid::describe(grid) + ", " +
                    (zero_stage > 0 ? "ZeRO-" + std::to_string(zero_stage) : "no ZeRO") + ", " +
                    schedule + ", " + std::to_string(microbatches) + " micro-batch" +
                    (microbatches == 1 ? "" : "es");
    return recompute ? s + ", recompute" : s;
  }
};

/*! \brief What to search (beyond the grids of the world size) and the budget. */
struct PlannerOptions {
  /*! \brief Pipeline schedules tried when pp > 1 (the Trainer's names). */
  std::vector<std::string> schedules{"gpipe", "1f1b", "zb-h1"};
  std::vector<int> microbatches{1, 2, 4, 8}; //!< tried when they divide the local batch
  bool tensor_parallel = true;               //!< try tp > 1 when the model has tp layers
  /*! \brief Bytes per rank a layout may plan (0: no budget; a Trainer's
   *  caller passes TrainerOptions::memory_budget). */
  std::size_t memory_budget = 0;
  /*! \brief Plain data parallelism (dp = world, no ZeRO, no recomputation,
   *  one micro-batch) is chosen when predicted within this fraction of the
   *  fastest: the model's error on a shared machine (docs/planner.md)
   *  cannot separate layouts closer than that (0: always the fastest). */
  double plain_dp_margin = 0.10;
};

/*! \brief The planner's answer: fitting layouts fastest first, then the refused. */
struct LayoutPlan {
  std::vector<LayoutCandidate> ranked;  //!< fitting layouts, fastest first
  std::vector<LayoutCandidate> refused; //!< layouts that cannot run or do not fit
  std::string profile;                  //!< the MachineProfile's name
  double plain_dp_margin = 0;           //!< PlannerOptions::plain_dp_margin it was ranked with

  /*! \brief The fastest fitting layout. \throws telar::Error when none fits */
  LayoutCandidate const& best() const {
    if (ranked.empty())
      throw Error("telar::plan_layout: no layout fits" +
                  (refused.empty()
                       ? std::string()
                       : "; e.g. " + refused.front().str() + ": " + refused.front().reason));
    return ranked.front();
  }

  /*! \brief Adds \p other's candidates (another model or strategy type:
   *  ZeRO stages, recomputation) and ranks all again.
   *  \param other a plan of the same world size and batch */
  LayoutPlan& merge(LayoutPlan const& other) {
    ranked.insert(ranked.end(), other.ranked.begin(), other.ranked.end());
    refused.insert(refused.end(), other.refused.begin(), other.refused.end());
    plain_dp_margin = std::max(plain_dp_margin, other.plain_dp_margin);
    detail::rank_candidates(ranked, plain_dp_margin);
    return *this;
  }

  /*! \brief The top \p top fitting layouts, one per line, then the refused
   *  ones with their reasons (at most \p top of them, then a count). */
  std::string table(std::size_t top = 10) const {
    std::string s;
    char buf[96];
    for (std::size_t i = 0; i < ranked.size() && i < top; ++i) {
      auto const& c = ranked[i];
      std::snprintf(buf, sizeof buf, "%3zu. %8.2f ms  %10s  ", i + 1, c.predicted_step_ms,
                    MemoryBytes::human(c.memory_bytes).c_str());
      s += buf + c.str() + " (" + c.reason + ")\n";
    }
    if (ranked.size() > top)
      s += "     ... and " + std::to_string(ranked.size() - top) + " more that fit\n";
    for (std::size_t i = 0; i < refused.size() && i < top; ++i)
      s += "  refused: " + refused[i].str() + ": " + refused[i].reason + "\n";
    if (refused.size() > top)
      s += "  ... and " + std::to_string(refused.size() - top) + " more refused\n";
    return s;
  }

  /*! \brief {"profile":..., "ranked":[{...}], "refused":[{...}]} on one line. */
  std::string json() const {
    return "{\"profile\":" + detail::json_quote(profile) +
           ",\"ranked\":" + detail::candidates_json(ranked) +
           ",\"refused\":" + detail::candidates_json(refused) + "}";
  }
};

namespace detail {
// plan_layout for a model the strategy trains as it is.
template <class Model, class StrategyT, class Optimizer, class Loss>
LayoutPlan plan_layout_as_given(Model const& model, LayoutOptions const& options, Shape const& in,
                                int world_size, MachineProfile const& profile,
                                PlannerOptions const& search) {
  if (options.batch_size == 0)
    throw Error("telar::plan_layout: LayoutOptions::batch_size must be set");
  std::size_t const budget = search.memory_budget;
  int const stage = detail::strategy_zero_stage<StrategyT>();
  bool const recompute = detail::recomputes_v<Model>;
  bool const tp_layers = search.tensor_parallel && detail::has_tensor_parallel_layers(model);
  LayoutPlan out;
  out.profile = profile.name;
  out.plain_dp_margin = search.plain_dp_margin;
  std::map<std::pair<std::size_t, int>, std::string> micro_refusals; // by (samples, dp)
  for (GridShape const g : detail::grids<StrategyT>(world_size, tp_layers)) {
    std::vector<std::string> const schedules =
        g.pp > 1 ? search.schedules : std::vector<std::string>{"1f1b"};
    for (std::string const& sched : schedules)
      for (int m : search.microbatches) {
        LayoutCandidate c{g, stage, sched, m, recompute};
        if (g.dp == 1 && stage > 0)
          continue; // nothing to shard: listed once, by the NoSharding plan
        std::size_t const local = options.batch_size / std::size_t(g.dp);
        if (options.batch_size % std::size_t(g.dp) != 0) {
          c.reason = "the batch of " + std::to_string(options.batch_size) +
                     " does not divide over dp=" + std::to_string(g.dp);
          out.refused.push_back(c);
          continue;
        }
        if (local % std::size_t(m) != 0)
          continue; // micro-batches that do not divide the local batch: not a layout
        auto const key = std::make_pair(local / std::size_t(m), g.dp);
        if (!micro_refusals.count(key)) // a shape pass on a copy of the model: once per size
          micro_refusals[key] = detail::refused_micro_batch(model, in, key.first, g.dp);
        c.reason = micro_refusals[key];
        if (!c.reason.empty()) { // the Trainer would refuse it (BatchNorm)
          out.refused.push_back(c);
          continue;
        }
        LayoutOptions o = options;
        if (o.ranks_per_node == 0) // the memory plan's nodes: the profile's
          o.ranks_per_node = profile.ranks_per_node;
        o.grid_order = detail::planned_order(g, o.grid_order, world_size, o.ranks_per_node);
        o.grid = g;
        o.schedule = sched;
        o.microbatches = m;
        o.stage_boundaries.clear();
        o.custom_schedule.reset();
        try {
          for (int r = 0; r < world_size; ++r)
            c.memory_bytes =
                std::max(c.memory_bytes,
                         plan_memory<Model, StrategyT, Optimizer, Loss>(model, o, in, world_size, r)
                             .bytes.total());
          if (budget > 0 && c.memory_bytes > budget) {
            c.reason = "needs " + MemoryBytes::human(c.memory_bytes) + " per rank, over the " +
                       MemoryBytes::human(budget) + " budget";
            out.refused.push_back(c);
            continue;
          }
          c.prediction =
              predict_step<Model, StrategyT, Optimizer, Loss>(model, o, in, world_size, profile);
        } catch (std::exception const& e) {
          c.reason = e.what();
          out.refused.push_back(c);
          continue;
        }
        c.fits = true;
        c.predicted_step_ms = c.prediction.step_ms;
        out.ranked.push_back(c);
      }
  }
  detail::rank_candidates(out.ranked, out.plain_dp_margin);
  return out;
}
} // namespace detail

/*! \brief Every layout of \p world_size ranks a telar::Trainer<Model,
 *  StrategyT, Optimizer, Loss> can run (dp x pp x tp with the axes the
 *  strategy has, tp > 1 only for models with tensor-parallel layers; a
 *  schedule of PlannerOptions::schedules when pp > 1; micro-batches dividing
 *  the local batch), kept when the memory plan's largest rank fits the
 *  budget, ranked by predict_step(). The ZeRO stage is the strategy's and
 *  the model is as given: plan each strategy type or model variant an
 *  application can run and LayoutPlan::merge() them. Instantiates no Trainer.
 *  \code
 *  telar::TrainerOptions opts;
 *  opts.batch_size = 256;
 *  auto plan = telar::plan_layout<Model, Strategy, telar::AdamW<float>>(
 *      model, opts, 784, 4, telar::load_machine_profile());
 *  plan.merge(telar::plan_layout<Model, StrategyZeRO1, telar::AdamW<float>>(
 *      model, opts, 784, 4, telar::load_machine_profile()));
 *  std::cout << plan.best().str() << ": " << plan.best().reason << "\n";
 *  \endcode
 *  \tparam Model, StrategyT, Optimizer, Loss those of the Trainer to run
 *  \param model the model (not initialised; under a bf16 strategy rebound
 *  as the Trainer does, telar::with_precision) \param options run-time settings
 *  (batch_size must be set; grid, schedule and microbatches are replaced)
 *  \param in per-sample input shape \param world_size ranks of the run
 *  \param profile this machine's rates \param search what else to vary
 *  \throws telar::Error when batch_size is 0 */
template <
    class Model, class StrategyT, class Optimizer,
    class Loss = SoftmaxCrossEntropy<typename Model::value_type, typename Model::memory_space>>
LayoutPlan plan_layout(Model const& model, LayoutOptions const& options, Shape const& in,
                       int world_size, MachineProfile const& profile,
                       PlannerOptions const& search = {}) {
  using P = detail::strategy_precision_t<StrategyT>;
  if constexpr (!detail::trained_as_given_v<StrategyT, Model>) // plan the model it trains
    return detail::plan_layout_as_given<WithPrecision<Model, P>, StrategyT, Optimizer, Loss>(
        with_precision<P>(model), options, in, world_size, profile, search);
  else
    return detail::plan_layout_as_given<Model, StrategyT, Optimizer, Loss>(
        model, options, in, world_size, profile, search);
}

} // namespace telar
