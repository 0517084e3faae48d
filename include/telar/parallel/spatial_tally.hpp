#pragma once
/*! \file
 *  \brief telar::GroupSumTally: what the spatial wrappers' sums of weight
 *  gradients over their group cost this process (figures, not control). */
#include <cstddef>

namespace telar {

/*! \brief What this process's sums of weight gradients over a spatial group
 *  did since the counters were last reset (telar::group_sum_tally(); reset
 *  by assigning `{}`). Each wrapper with parameters sums once per backward
 *  (one blocking allreduce): `seconds` is the time spent in those
 *  allreduces, waiting for the group's slowest rank included, which is the
 *  most that posting them early (non-blocking) could hide. For figures
 *  (docs/spatial.md), not for control. */
struct GroupSumTally {
  std::size_t sums = 0;   //!< allreduces (one per wrapper with parameters per backward)
  std::size_t values = 0; //!< gradient values summed
  double seconds = 0;     //!< seconds inside the allreduces
};

/*! \brief The process's telar::GroupSumTally (one per process: every
 *  wrapper adds to it). */
inline GroupSumTally& group_sum_tally() {
  static GroupSumTally t;
  return t;
}

} // namespace telar
