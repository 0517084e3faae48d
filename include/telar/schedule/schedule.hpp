#pragma once

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
inline MessageKey message_key(Schedule const& s, int rank, Instruction const& in) {
  int const vs = s.virtual_stage(rank, in.chunk);
  switch (in.op) {
  case Op::SendActivation:
    return {Channel::Activation, in.microbatch, vs};
  case Op::RecvActivation:
    return {Channel::Activation, in.microbatch, vs - 1};
  case Op::SendGrad:
    return {Channel::Grad, in.microbatch, vs - 1};
  case Op::RecvGrad:
    return {Channel::Grad, in.microbatch, vs};
  default:
    break;
  }
  throw std::invalid_argument("telar::schedule::message_key: " + to_string(in) +
                              " is not a Send or Recv instruction");
}

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
inline std::string to_text(Schedule const& s, bool with_communication = false) {
  std::string out;
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    out += "rank " + std::to_string(r) + ":";
    for (auto const& in : s.ranks[r]) {
      if (!with_communication && is_communication(in.op))
        continue;
      out += ' ';
      out += short_string(in);
    }
    out += '\n';
  }
  return out;
}

/*! \brief Peak number of (micro-batch, chunk) activations alive at once on each rank, counting
    from the Forward until the BackwardWeight or the fused Backward that frees them.

    Order-based (no times involved); out-of-range instructions are ignored. */
inline std::vector<int> peak_activations(Schedule const& s) {
  std::vector<int> peak(s.ranks.size(), 0);
  if (s.microbatches <= 0 || s.chunks <= 0)
    return peak;
  std::size_t const slots = static_cast<std::size_t>(s.microbatches) * s.chunks;
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    std::vector<char> alive(slots, 0);
    int now = 0;
    for (auto const& in : s.ranks[r]) {
      if (in.microbatch < 0 || in.microbatch >= s.microbatches || in.chunk < 0 ||
          in.chunk >= s.chunks)
        continue;
      char& a = alive[static_cast<std::size_t>(in.chunk) * s.microbatches + in.microbatch];
      if (in.op == Op::Forward && !a) {
        a = 1;
        peak[r] = std::max(peak[r], ++now);
      } else if ((in.op == Op::BackwardWeight || in.op == Op::Backward) && a) {
        a = 0;
        --now;
      }
    }
  }
  return peak;
}

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
inline Schedule with_communication(Schedule s) {
  int const last = s.virtual_stages() - 1;
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    int const rank = static_cast<int>(r);
    std::vector<Instruction> out;
    out.reserve(s.ranks[r].size() * 2 + 1);
    for (auto const& in : s.ranks[r]) {
      if (is_communication(in.op) || in.op == Op::OptimizerStep)
        continue;
      int const vs = s.virtual_stage(rank, in.chunk);
      // Neighbours on the same rank (stages == 1) hand data over locally.
      bool const prev_remote = vs > 0 && s.stages > 1;
      bool const next_remote = vs < last && s.stages > 1;
      if (in.op == Op::Forward) {
        if (prev_remote)
          out.push_back({Op::RecvActivation, in.microbatch, in.chunk, s.rank_of(vs - 1)});
        out.push_back(in);
        if (next_remote)
          out.push_back({Op::SendActivation, in.microbatch, in.chunk, s.rank_of(vs + 1)});
      } else if (is_backward_input(in.op)) {
        if (next_remote)
          out.push_back({Op::RecvGrad, in.microbatch, in.chunk, s.rank_of(vs + 1)});
        out.push_back(in);
        if (prev_remote)
          out.push_back({Op::SendGrad, in.microbatch, in.chunk, s.rank_of(vs - 1)});
      } else {
        out.push_back(in);
      }
    }
    out.push_back({Op::OptimizerStep});
    s.ranks[r] = std::move(out);
  }
  return s;
}

} // namespace telar::schedule
