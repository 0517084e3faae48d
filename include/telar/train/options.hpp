#pragma once
/*! \file
 *  \brief telar::TrainerOptions: run-time settings of a telar::Trainer. */
#include <telar/optim/lr_schedule.hpp>
#include <telar/optim/nonfinite.hpp>
#include <telar/parallel/layout_options.hpp>

#include <cstddef>
#include <cstdint>

namespace telar {

/*! \brief Run-time settings of a Trainer: how the run is laid out
 *  (telar::LayoutOptions: grid, schedule, stages, buckets, batch size; set
 *  them here as `opts.grid = ...`) and how it trains. */
struct TrainerOptions : LayoutOptions {
  std::uint64_t seed = 0;            //!< parameter initialisation seed
  LRSchedule lr = constant_lr(0.01); //!< learning rate per step
  double clip_grad_norm = 0;         //!< clip the global gradient norm to this (0: off)
  bool trace = false;                //!< record a timeline of every step (see Trainer::trace())
  /*! \brief Bytes each rank may use (0: no limit). A layout whose memory
   *  plan (telar::plan_memory) exceeds it on any rank is refused with a
   *  telar::MemoryError before anything is allocated. */
  std::size_t memory_budget = 0;
  /*! \brief A step whose loss or gradient is not finite: stop (the default)
   *  or skip the update, as dynamic loss scaling does. */
  NonFinite nonfinite = NonFinite::stop;
};

} // namespace telar
