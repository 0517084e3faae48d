#pragma once
/*! \file
 *  \brief telar::MemoryCategory: what a byte of a rank's memory is for. */

namespace telar {

/*! \brief What a byte of a rank's memory is for. */
enum class MemoryCategory : int {
  parameters,      //!< parameter values (and shards of them)
  gradients,       //!< gradient buffers (full, shards, bucket groups)
  optimizer_state, //!< the optimizer's state (moments, directions)
  activations,     //!< activations, their gradients and layers' saved state
  communication,   //!< message staging and gathered parameters
  workspace        //!< everything else Telar allocates while training
};

} // namespace telar
