#pragma once
/*! \file
 *  \brief telar::plan_memory: each rank's peak bytes per category, predicted
 *  from the model, the strategy, the degrees and the schedule before
 *  anything is allocated. */
#include <telar/core/layer.hpp>
#include <telar/core/loss.hpp>
#include <telar/core/parameters.hpp>
#include <telar/core/sequential.hpp>
#include <telar/layers/softmax_cross_entropy.hpp>
#include <telar/optim/optimizer.hpp>
#include <telar/parallel/detail/plan_model_states.hpp>
#include <telar/parallel/layout_options.hpp>
#include <telar/parallel/precision.hpp>
#include <telar/parallel/run_layout.hpp>
#include <telar/parallel/strategy.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/profile/memory.hpp>
#include <telar/schedule/tags.hpp>

#include <string>
#include <vector>

namespace telar {

/*! \brief A predicted memory footprint of one rank. */
struct MemoryPlan {
  MemoryBytes bytes;                 //!< predicted steady-state peak per category
  GridShape grid{1, 1, 1};           //!< the layout planned
  int zero_stage = 0;                //!< the sharding planned (0: NoSharding)
  int rank = 0;                      //!< the rank planned
  std::vector<std::string> warnings; //!< what the plan could not know (counted 0)

  /*! \brief e.g. "ZeRO<1> over dp=2 x pp=2 x tp=1". */
  std::string layout() const {
    return (zero_stage > 0 ? "ZeRO<" + std::to_string(zero_stage) + ">"
                           : std::string("NoSharding")) +
           " over " + ProcessGrid::describe(grid);
  }
};

} // namespace telar

#include <telar/parallel/detail/memory_plan_detail.hpp>

namespace telar {

/*! \brief Predicts the steady-state peak bytes per category of rank \p rank
 *  of a run of \p world_size ranks, as a telar::Trainer<Model, StrategyT,
 *  Optimizer, Loss> built with \p options would allocate them; allocates
 *  nothing (no Kokkos allocation, no MPI).
 *
 *  It sizes the rank's telar::RunLayout (the same one make_run_layout()
 *  returns): parameters, gradients and optimizer state follow the store's padding and
 *  the strategy's sharding (parallel/detail/plan_model_states.hpp);
 *  activations count one slot per micro-batch the schedule keeps in flight,
 *  each holding the stage's activations, their gradients and every layer's
 *  saved_bytes(); LayoutOptions::batch_size must be set for them. The
 *  workspace counts every layer's workspace_bytes(). Layers without
 *  parameter_count() / saved_bytes() are counted 0 and named in
 *  MemoryPlan::warnings (every built-in layer and block has them).
 *  ZeRO<1>'s shared mode assumes every data-parallel rank on one node.
 *  \code
 *  telar::LayoutOptions opts; // or a telar::TrainerOptions
 *  opts.grid = {0, 2, 1};
 *  opts.batch_size = 256;
 *  auto plan = telar::plan_memory<Model, Strategy, telar::AdamW<float>>(model, opts, 784, 4, 0);
 *  std::cout << plan.bytes.str() << "\n";
 *  \endcode
 *  \tparam Model, StrategyT, Optimizer, Loss those of the telar::Trainer
 *  planned (Loss defaults to the Trainer's default, SoftmaxCrossEntropy)
 *  \param model the model (not initialised; under a bf16 strategy rebound
 *  as the Trainer does, telar::with_precision) \param options the layout
 *  settings (a telar::TrainerOptions is one)
 *  \param in per-sample input shape \param world_size ranks of the run
 *  \param rank rank to plan
 *  \throws GridError or Error when the degrees or the schedule do not fit */
template <
    class Model, class StrategyT, class Optimizer,
    class Loss = SoftmaxCrossEntropy<typename Model::value_type, typename Model::memory_space>>
MemoryPlan plan_memory(Model const& model, LayoutOptions const& options, Shape const& in,
                       int world_size, int rank) {
  using P = detail::strategy_precision_t<StrategyT>;
  if constexpr (!detail::trained_as_given_v<StrategyT, Model>) { // plan the model it trains
    return plan_memory<WithPrecision<Model, P>, StrategyT, Optimizer, Loss>(
        with_precision<P>(model), options, in, world_size, rank);
  } else {
    GridShape const shape = detail::layout_grid<StrategyT>(options, world_size);
    return detail::plan_rank<Model, StrategyT, Optimizer, Loss>(
        model, options, in, shape, rank, detail::strategy_zero_stage<StrategyT>());
  }
}

} // namespace telar
