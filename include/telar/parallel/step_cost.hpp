#pragma once
/*! \file
 *  \brief telar::predict_step: the time of one training step of a layout,
 *  predicted from the layers' flops(), a telar::MachineProfile and the
 *  pipeline schedule simulator, before anything is built. */
#include <telar/parallel/detail/step_cost_detail.hpp>
#include <telar/parallel/machine_profile.hpp>
#include <telar/parallel/memory_plan.hpp>

#include <cstdio>
#include <string>

namespace telar {

/*! \brief A predicted step time and where it goes (milliseconds, on the
 *  rank that ends the step: with a pipeline, the stage last_stage). See
 *  docs/planner.md for what overlaps what. */
struct StepPrediction {
  double step_ms = 0;         //!< the whole step: pipeline + exposed sync + optimizer
  double pipeline_ms = 0;     //!< the simulated schedule: compute, messages, bubbles
  double compute_ms = 0;      //!< that rank's forward and backward (incl. tp, ZeRO-3)
  double bubble_fraction = 0; //!< of the simulated schedule (0 without pipelining)
  double recompute_ms = 0;    //!< extra forwards of recomputed layers (inside compute_ms)
  double tp_comm_ms = 0;      //!< tensor-parallel allreduces (inside compute_ms)
  double zero_gather_ms = 0;  //!< ZeRO parameter all-gathers (ZeRO-3's inside compute_ms)
  double dp_comm_ms = 0;      //!< data-parallel gradient reduction, all of it
  double dp_exposed_ms = 0;   //!< the part of dp_comm_ms not hidden behind backward
  double optimizer_ms = 0;    //!< the update: a bandwidth-bound pass over the rank's shard
  double fixed_ms = 0;        //!< per-step and per-micro-batch fixed costs (profile)
  int sync_points = 0;        //!< blocking synchronisations between ranks per step
  double sync_wait_ms = 0;    //!< their expected wait for descheduled peers (docs/planner.md)
  double contention = 1;      //!< compute slowdown of ranks sharing cores (1 / cpu share)
  int measured_layers = 0;    //!< layers timed by calibration (the rest: FLOP rates)
  int layers = 0;             //!< layers in the model
  /*! \brief The pipeline stage that ends the step, whose compute, sync and
   *  optimizer these are (a stage holding few parameters may end last with
   *  a short update); -1 without a pipeline. */
  int last_stage = -1;

  /*! \brief e.g. "compute 3.10 ms, bubble 12%, dp sync 0.40 ms exposed, optimizer 0.20 ms". */
  std::string summary() const {
    char buf[256];
    std::string s =
        last_stage >= 0 ? "stage " + std::to_string(last_stage) + " ends the step: " : "";
    std::snprintf(buf, sizeof buf, "compute %.2f ms, bubble %.0f%%, dp sync %.2f ms exposed",
                  compute_ms, 100 * bubble_fraction, dp_exposed_ms);
    s += buf;
    auto part = [&](char const* what, double ms) {
      if (ms > 0) {
        std::snprintf(buf, sizeof buf, ", %s %.2f ms", what, ms);
        s += buf;
      }
    };
    part("tp allreduce", tp_comm_ms);
    part("ZeRO gathers", zero_gather_ms);
    part("recompute", recompute_ms);
    part("optimizer", optimizer_ms);
    part("fixed", fixed_ms);
    if (sync_wait_ms > 0) {
      std::snprintf(buf, sizeof buf, ", %d syncs %.2f ms", sync_points, sync_wait_ms);
      s += buf;
    }
    if (contention > 1) {
      std::snprintf(buf, sizeof buf, ", %.1fx core sharing", contention);
      s += buf;
    }
    if (measured_layers < layers) {
      std::snprintf(buf, sizeof buf, ", %d of %d layers from FLOP rates", layers - measured_layers,
                    layers);
      s += buf;
    }
    return s;
  }
};

/*! \brief Predicts the time of one step of a telar::Trainer<Model, StrategyT,
 *  Optimizer, Loss> of \p world_size ranks built with \p options; builds
 *  nothing (no Kokkos allocation, no MPI).
 *
 *  Each layer's forward, backward-input and backward-weight time is its
 *  flops() at the profile's GEMM or convolution rate (element-wise layers:
 *  bytes at the profile's bandwidth) plus a fixed per-call cost; the stages'
 *  times run through schedule::simulate() with the profile's send/recv
 *  cost; tensor-parallel allreduces and ZeRO-3 gathers add to the stages;
 *  the data-parallel reduction hides a profile-given fraction behind
 *  backward; the optimizer is a bandwidth-bound pass over the rank's shard.
 *  \code
 *  telar::TrainerOptions opts;
 *  opts.grid = {0, 2, 1};
 *  opts.batch_size = 256;
 *  opts.microbatches = 4;
 *  auto const profile = telar::load_machine_profile();
 *  auto p = telar::predict_step<Model, Strategy, telar::AdamW<float>>(
 *      model, opts, telar::Shape{784}, 4, profile);
 *  std::cout << p.step_ms << " ms: " << p.summary() << "\n";
 *  \endcode
 *  \tparam Model, StrategyT, Optimizer, Loss those of the Trainer predicted
 *  \param model the model (not initialised; under a bf16 strategy rebound
 *  as the Trainer does, telar::with_precision) \param options the layout
 *  settings (batch_size must be set) \param in per-sample input shape
 *  \param world_size ranks of the run \param profile this machine's rates
 *  \throws GridError or Error when the layout cannot run */
template <
    class Model, class StrategyT, class Optimizer,
    class Loss = SoftmaxCrossEntropy<typename Model::value_type, typename Model::memory_space>>
StepPrediction predict_step(Model const& model, LayoutOptions const& options, Shape const& in,
                            int world_size, MachineProfile const& profile) {
  using P = detail::strategy_precision_t<StrategyT>;
  if constexpr (!detail::trained_as_given_v<StrategyT, Model>) { // predict the model it trains
    return predict_step<WithPrecision<Model, P>, StrategyT, Optimizer, Loss>(
        with_precision<P>(model), options, in, world_size, profile);
  } else {
    if (options.batch_size == 0)
      throw Error("telar::predict_step: LayoutOptions::batch_size must be set");
    // The plan resolves the grid and the sharding exactly as the Trainer does.
    MemoryPlan const plan =
        plan_memory<Model, StrategyT, Optimizer, Loss>(model, options, in, world_size, 0);
    detail::StepCostInput c;
    c.grid = plan.grid;
    c.zero_stage = plan.zero_stage;
    c.zero3_per_step = detail::zero3_gathers_per_step<StrategyT>();
    c.shared_zero1 = options.shared_memory;
    c.state_size = std::size_t(optimizer_traits<Optimizer>::state_size);
    c.world = world_size;
    c.order = options.grid_order;
    c.hierarchical_dp = detail::hierarchical_dp_v<StrategyT>;
    c.reduce_bytes = P::bf16_reduce ? 2 : 4;
    c.gather_bytes =
        P::bf16_compute && plan.zero_stage == 3 &&
                detail::bf16_gathers_v<typename Model::value_type, typename Model::memory_space>
            ? 2
            : 4;
    return detail::predict<StrategyT, Loss, StepPrediction>(model, options, in, c, profile);
  }
}

} // namespace telar
