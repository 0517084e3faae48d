#pragma once
/*! \file
 *  \brief telar::TrainerOptions: run-time settings of a telar::Trainer. */
#include <telar/comm/process_grid.hpp>
#include <telar/optim/lr_schedule.hpp>
#include <telar/schedule/schedule.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace telar {

/*! \brief What a step does when its loss or a gradient is not finite
 *  (NaN or infinity); the same decision on every rank. */
enum class NonFinite {
  stop, //!< throw telar::NonFiniteError naming the step and the first such tensor
  skip  //!< leave parameters and optimizer state as they were (StepResult::skipped)
};

/*! \brief Run-time settings of a Trainer. */
struct TrainerOptions {
  std::uint64_t seed = 0;                    //!< parameter initialisation seed
  LRSchedule lr = constant_lr(0.01);         //!< learning rate per step
  double clip_grad_norm = 0;                 //!< clip the global gradient norm to this (0: off)
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
  bool trace = false; //!< record a timeline of every step (see Trainer::trace())
  /*! \brief Bytes each rank may use (0: no limit). A layout whose memory
   *  plan (telar::plan_memory) exceeds it on any rank is refused with a
   *  telar::MemoryError before anything is allocated. */
  std::size_t memory_budget = 0;
  /*! \brief Samples per step over all data-parallel ranks, for the memory
   *  plan's activations (0: activations are not planned). */
  std::size_t batch_size = 0;
  /*! \brief A step whose loss or gradient is not finite: stop (the default)
   *  or skip the update, as dynamic loss scaling does. */
  NonFinite nonfinite = NonFinite::stop;
};

} // namespace telar
