#pragma once
/*! \file
 *  \brief telar::LayoutOptions: the run-time settings that say how a run is
 *  laid out over its ranks (degrees, schedule, stages, buckets), as opposed
 *  to how it trains. telar::TrainerOptions derives from it; the memory plan,
 *  telar::make_run_layout and a planner read it without knowing train/. */
#include <telar/comm/process_grid.hpp>
#include <telar/schedule/schedule.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace telar {

/*! \brief How a run is laid out over its ranks: the input of
 *  telar::make_run_layout and telar::plan_memory.
 *  \code
 *  telar::LayoutOptions layout;
 *  layout.grid = {0, 2, 1}; // dp from the world size, pp = 2, tp = 1
 *  layout.schedule = "1f1b";
 *  layout.microbatches = 4;
 *  \endcode */
struct LayoutOptions {
  int microbatches = 1;                      //!< micro-batches per step (pipeline / accumulation)
  GridShape grid{};                          //!< dp x pp x tp; dp = 0 takes the ranks left over
  GridOrder grid_order = default_grid_order; //!< rank layout, outermost axis first
  /*! \brief Pipeline schedule by name (gpipe, 1f1b, interleaved, zb-h1,
   *  zb-h2; any case, `_` for `-`, see schedule::canonical_name()); empty:
   *  the strategy's PipelineParallel default. */
  std::string schedule;
  int chunks = 2; //!< model chunks per rank for the interleaved schedule
  /*! \brief A hand-made schedule to run instead (validated first). */
  std::optional<schedule::Schedule> custom_schedule;
  /*! \brief Layer boundaries of the p*v pipeline stages (p*v + 1 values from
   *  0 to the layer count); empty: balanced by the layers' flops(). */
  std::vector<std::size_t> stage_boundaries;
  std::size_t bucket_bytes = std::size_t(8) << 20; //!< data-parallel gradient bucket size
  /*! \brief With ZeRO<1>, let the data-parallel ranks of one node share
   *  parameters and read each other's gradients through MPI-3 shared memory
   *  (false: reduce-scatter and all-gather messages, as across nodes). */
  bool shared_memory = true;
  /*! \brief Consecutive ranks per node (0: every rank on one node), for the
   *  memory plan: ZeRO<1> shares one copy of the parameters per node. A
   *  Trainer left at 0 sets it from its run (telar::node_layout) when the
   *  nodes hold the same number of consecutive ranks. */
  int ranks_per_node = 0;
  /*! \brief Under telar::Precision<telar::bf16, float>: round the parameters
   *  to bf16 once per step into a copy (2 bytes per parameter, counted with
   *  the parameters) that the bf16 matmuls read, instead of converting each
   *  weight in every forward and backward (docs/precision.md). false: no
   *  copy, the same results. Not used under ZeRO-3 or off the host. */
  bool bf16_weight_copy = true;
  /*! \brief Samples per step over all data-parallel ranks, for the memory
   *  plan's activations (0: activations are not planned). */
  std::size_t batch_size = 0;
};

} // namespace telar
