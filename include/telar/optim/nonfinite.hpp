#pragma once
/*! \file
 *  \brief telar::NonFinite: what an update does with a step whose loss or
 *  gradient is not finite (telar::TrainerOptions::nonfinite,
 *  telar::SlabDataParallelOptions::nonfinite). */

namespace telar {

/*! \brief What a step does when its loss or a gradient is not finite
 *  (NaN or infinity); the same decision on every rank. */
enum class NonFinite {
  stop, //!< throw telar::NonFiniteError naming the step and the first such tensor
  skip  //!< leave parameters and optimizer state as they were (the step counts as skipped)
};

} // namespace telar
