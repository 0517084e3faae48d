#pragma once

#include <vector>

/*! \file
    \brief CostModel: compute and message costs for simulate(). */

namespace telar::schedule {

/*! \brief Costs for simulate(): per-virtual-stage compute times and an alpha-beta message model.

    Each per-stage vector holds either one value (all virtual stages alike) or one value per
    virtual stage (`stages * chunks`). A fused Backward costs `backward_input + backward_weight`.
    Messages follow LogP/alpha-beta: a Send occupies its rank for `send_overhead` and the
    message, posted at the end of it (time t), arrives at `t + alpha + beta * bytes`; a Recv
    waits for the arrival, then occupies its rank for `recv_overhead`. The overheads are the
    ranks' own time per message (posting, matching, copying on shared memory), default 0:
    non-blocking sends that cost nothing. */
struct CostModel {
  std::vector<double> forward{1.0};         //!< time of a Forward, per virtual stage
  std::vector<double> backward_input{1.0};  //!< time of a BackwardInput, per virtual stage
  std::vector<double> backward_weight{1.0}; //!< time of a BackwardWeight, per virtual stage
  double optimizer_step = 0.0;              //!< time of the OptimizerStep
  double alpha = 0.0;                       //!< message latency
  double beta = 0.0;                        //!< time per byte
  double activation_bytes = 0.0;            //!< bytes of one micro-batch's activation message
  double grad_bytes = 0.0;                  //!< bytes of one micro-batch's gradient message
  double send_overhead = 0.0;               //!< sender's time per message (LogP's o)
  double recv_overhead = 0.0;               //!< receiver's time per message, after arrival

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
