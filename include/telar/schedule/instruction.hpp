#pragma once

#include <string>

/*! \file
    \brief The instruction set of Telar's pipeline schedules: Op and Instruction. */

/*! \brief Pipeline schedules as data, their validator, cost-model simulator and drawings.

    Standard C++17 only (no MPI, no Kokkos), so schedules can be built, checked and
    simulated anywhere. */
namespace telar::schedule {

/*! \brief The kind of one instruction in a rank's schedule. */
enum class Op {
  Forward, //!< forward pass of one micro-batch through one model chunk (loss included on the last
           //!< virtual stage)
  BackwardInput,  //!< input-gradient half of the backward pass (dL/dx); on the critical path
  BackwardWeight, //!< weight-gradient half (dL/dW); frees the micro-batch's saved activations
  Backward, //!< fused backward (BackwardInput then BackwardWeight); frees the saved activations
  SendActivation, //!< non-blocking send of a Forward output to the next virtual stage
  RecvActivation, //!< receive, blocking until it arrives, of a Forward input from the previous
                  //!< virtual stage
  SendGrad,       //!< non-blocking send of dL/dx to the previous virtual stage
  RecvGrad,       //!< receive, blocking until it arrives, of dL/dy from the next virtual stage
  OptimizerStep   //!< applies the accumulated gradients; the last instruction of every rank
};

/*! \brief One step of a rank's schedule.

    \code
    using telar::schedule::Op;
    telar::schedule::Instruction f{Op::Forward, 3};                // micro-batch 3, chunk 0
    telar::schedule::Instruction s{Op::SendActivation, 3, 0, 1};   // ... sent to pipeline rank 1
    \endcode */
struct Instruction {
  Op op;               //!< what to do
  int microbatch = -1; //!< micro-batch index in [0, microbatches); -1 for OptimizerStep
  int chunk = 0; //!< model chunk on this rank (virtual stage = chunk * stages + rank); 0 without
                 //!< interleaving
  int peer = -1; //!< pipeline rank on the other side of a Send or Recv; -1 otherwise
};

/*! \brief Instructions are equal when all four fields are. */
inline bool operator==(Instruction const& a, Instruction const& b) {
  return a.op == b.op && a.microbatch == b.microbatch && a.chunk == b.chunk && a.peer == b.peer;
}

/*! \brief Negation of operator==. */
inline bool operator!=(Instruction const& a, Instruction const& b) {
  return !(a == b);
}

/*! \brief True for Forward, BackwardInput, BackwardWeight, Backward and OptimizerStep: the
    operations that occupy the rank. */
constexpr bool is_compute(Op op) {
  return op == Op::Forward || op == Op::BackwardInput || op == Op::BackwardWeight ||
         op == Op::Backward || op == Op::OptimizerStep;
}

/*! \brief True for SendActivation and SendGrad. */
constexpr bool is_send(Op op) {
  return op == Op::SendActivation || op == Op::SendGrad;
}

/*! \brief True for RecvActivation and RecvGrad. */
constexpr bool is_recv(Op op) {
  return op == Op::RecvActivation || op == Op::RecvGrad;
}

/*! \brief True for the four message operations. */
constexpr bool is_communication(Op op) {
  return is_send(op) || is_recv(op);
}

/*! \brief True for the operations that consume the gradient from the next stage (Backward and
    BackwardInput). */
constexpr bool is_backward_input(Op op) {
  return op == Op::Backward || op == Op::BackwardInput;
}

namespace detail {
// Each Op's name and short code, in the order of the enumeration.
struct OpName {
  char const* name;
  char const* code;
};
inline constexpr OpName op_names[] = {
    {"Forward", "F"},   {"BackwardInput", "Bi"},  {"BackwardWeight", "W"},
    {"Backward", "B"},  {"SendActivation", "SA"}, {"RecvActivation", "RA"},
    {"SendGrad", "SG"}, {"RecvGrad", "RG"},       {"OptimizerStep", "Opt"}};
constexpr OpName const& op_name(Op op) {
  return op_names[static_cast<int>(op)];
}
} // namespace detail

/*! \brief The enumerator's name, e.g. "BackwardInput". */
constexpr char const* name(Op op) {
  return detail::op_name(op).name;
}

/*! \brief A short code for compact listings: F, Bi (BackwardInput), W, B (fused Backward), SA, RA,
    SG, RG, Opt. */
constexpr char const* short_name(Op op) {
  return detail::op_name(op).code;
}

/*! \brief Same as name(Op), as a std::string. */
inline std::string to_string(Op op) {
  return name(op);
}

/*! \brief Readable form for messages, e.g. "Forward(mb=3, chunk=1)",
    "SendGrad(mb=0, chunk=0, peer=2)", "OptimizerStep". */
inline std::string to_string(Instruction const& in) {
  std::string s = name(in.op);
  if (in.op == Op::OptimizerStep)
    return s;
  s += "(mb=" + std::to_string(in.microbatch) + ", chunk=" + std::to_string(in.chunk);
  if (is_communication(in.op))
    s += ", peer=" + std::to_string(in.peer);
  return s + ")";
}

/*! \brief Compact form used by to_text(): "F3", "Bi3", "W3", "B3"; "F3@1" for chunk 1; "SA3>2"
    (send to rank 2), "RG3<2" (receive from rank 2); "Opt". */
inline std::string short_string(Instruction const& in) {
  std::string s = short_name(in.op);
  if (in.op == Op::OptimizerStep)
    return s;
  s += std::to_string(in.microbatch);
  if (in.chunk != 0)
    s += "@" + std::to_string(in.chunk);
  if (is_send(in.op))
    s += ">" + std::to_string(in.peer);
  else if (is_recv(in.op))
    s += "<" + std::to_string(in.peer);
  return s;
}

} // namespace telar::schedule
