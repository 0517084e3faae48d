#pragma once

#include <vector>

/*! \file
    \brief CostModel: compute and message costs for simulate(). */

namespace telar::schedule {

/*! \brief Costs for simulate(): per-virtual-stage compute times and an alpha-beta message model.

    Each per-stage vector holds either one value (all virtual stages alike) or one value per
    virtual stage (`stages * chunks`). A fused Backward costs `backward_input + backward_weight`.
    A message posted at time t arrives at `t + alpha + beta * bytes`; posting costs the sender
    nothing (non-blocking sends). */
struct CostModel {
  std::vector<double> forward{1.0};         //!< time of a Forward, per virtual stage
  std::vector<double> backward_input{1.0};  //!< time of a BackwardInput, per virtual stage
  std::vector<double> backward_weight{1.0}; //!< time of a BackwardWeight, per virtual stage
  double optimizer_step = 0.0;              //!< time of the OptimizerStep
  double alpha = 0.0;                       //!< message latency
  double beta = 0.0;                        //!< time per byte
  double activation_bytes = 0.0;            //!< bytes of one micro-batch's activation message
  double grad_bytes = 0.0;                  //!< bytes of one micro-batch's gradient message

  /*! \brief The same F, B (input part) and W (weight part) time on every virtual stage, free
      messages. */
  static CostModel uniform(double f, double b, double w) {
    CostModel c;
    c.forward = {f};
    c.backward_input = {b};
    c.backward_weight = {w};
    return c;
  }
};

} // namespace telar::schedule
