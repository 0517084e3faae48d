#pragma once

#include <telar/core/detail/decl.hpp>
#include <telar/schedule/instruction.hpp>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

/*! \file
    \brief Schedule (per-rank instruction lists), its virtual-stage layout, message keys,
    and helpers to print it, count activations and add its messages. */

namespace telar::schedule {

/*! \brief A pipeline schedule: for every pipeline rank, the ordered list of what it does in one
    training iteration.

    Layout (Megatron's): the model is cut into `stages * chunks` virtual stages; rank `r` holds
    chunks `0..chunks-1`, and chunk `c` of rank `r` is virtual stage `c * stages + r`. Activations
    flow from virtual stage `s` to `s + 1`, gradients from `s + 1` to `s`.

    A rank's list contains compute instructions (Forward, Backward or BackwardInput +
    BackwardWeight, OptimizerStep last) and explicit messages: a Forward on a non-first virtual
    stage is preceded by its RecvActivation, one on a non-last virtual stage followed by its
    SendActivation; a Backward/BackwardInput on a non-last virtual stage is preceded by its
    RecvGrad and, unless on the first, followed by its SendGrad. When both virtual stages of a
    boundary live on the same rank (only possible with `stages == 1`) the data stays local and
    no message is listed. validate() checks all of this; with_communication() writes the
    messages for a list of compute instructions. */
struct Schedule {
  std::string name;     //!< a label for logs, tables and charts, e.g. "1f1b"
  int stages = 0;       //!< number of pipeline ranks p
  int microbatches = 0; //!< micro-batches per iteration m
  int chunks = 1;       //!< model chunks per rank v (1 without interleaving)
  std::vector<std::vector<Instruction>>
      ranks; //!< ranks[r] = ordered instructions of pipeline rank r

  /*! \brief Number of virtual stages, `stages * chunks`. */
  int virtual_stages() const { return stages * chunks; }
  /*! \brief Virtual stage of chunk `chunk` on pipeline rank `rank`. */
  int virtual_stage(int rank, int chunk) const { return chunk * stages + rank; }
  /*! \brief Pipeline rank holding virtual stage `vstage`. */
  int rank_of(int vstage) const { return vstage % stages; }
  /*! \brief Chunk index of virtual stage `vstage` on its rank. */
  int chunk_of(int vstage) const { return vstage / stages; }
};

/*! \brief What a message carries. */
enum class Channel {
  Activation, //!< a Forward output, from virtual stage s to s + 1
  Grad        //!< an input gradient, from virtual stage s + 1 to s
};

/*! \brief Identifies one message the same way on both sides: sender and receiver compute the same
    key (and tag) from their own Send/Recv instruction, so matching does not depend on order. */
struct MessageKey {
  Channel channel = Channel::Activation; //!< activation or gradient
  int microbatch = -1;                   //!< micro-batch index
  int boundary = -1; //!< lower virtual stage s of the boundary s | s + 1 the message crosses

  /*! \brief Keys are equal when all fields are. */
  friend bool operator==(MessageKey const& a, MessageKey const& b) {
    return a.channel == b.channel && a.microbatch == b.microbatch && a.boundary == b.boundary;
  }
};

/*! \brief The key of the message sent or received by instruction `in` on pipeline rank `rank`.
    \throws std::invalid_argument if `in` is not a Send/Recv. */
TELAR_DECL MessageKey message_key(Schedule const& s, int rank, Instruction const& in);

/*! \brief An MPI tag for a message, in `[0, 2 * microbatches * chunks)`.

    Unique among the messages between one ordered pair of ranks (which is all MPI matching
    needs): for a given source, destination and channel, the boundary's lower virtual stage
    always lives on the same rank, so its chunk index tells boundaries apart. */
inline int message_tag(Schedule const& s, MessageKey const& key) {
  int const lower_chunk = s.chunk_of(key.boundary);
  return (key.microbatch * 2 + (key.channel == Channel::Grad ? 1 : 0)) * s.chunks + lower_chunk;
}

/*! \brief One line per rank, e.g. "rank 0: F0 F1 B0 F2 B1 B2 Opt", for logs and error messages.
    \param s the schedule
    \param with_communication also list the Send/Recv instructions (see short_string()). */
TELAR_DECL std::string to_text(Schedule const& s, bool with_communication = false);

/*! \brief Peak number of (micro-batch, chunk) activations alive at once on each rank, counting
    from the Forward until the BackwardWeight or the fused Backward that frees them.

    Order-based (no times involved); out-of-range instructions are ignored. */
TELAR_DECL std::vector<int> peak_activations(Schedule const& s);

/*! \brief Returns `s` with the messages its compute instructions need, so a user can write only
    the order of F/B/W per rank.

    Existing Send/Recv and OptimizerStep instructions are dropped; then, following the layout of
    Schedule, each Forward gets its RecvActivation right before and SendActivation right after,
    each Backward/BackwardInput its RecvGrad right before and SendGrad right after (where the
    neighbouring virtual stage is on another rank), and OptimizerStep is appended to every rank.

    \code
    telar::schedule::Schedule s{"mine", 2, 2, 1, {}};
    using telar::schedule::Op;
    s.ranks = {{{Op::Forward, 0}, {Op::Forward, 1}, {Op::Backward, 0}, {Op::Backward, 1}},
               {{Op::Forward, 0}, {Op::Backward, 0}, {Op::Forward, 1}, {Op::Backward, 1}}};
    s = telar::schedule::with_communication(s);
    telar::schedule::check(s); // throws if the order cannot run
    \endcode */
TELAR_DECL Schedule with_communication(Schedule s);

} // namespace telar::schedule

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/schedule/schedule.ipp>
#endif
