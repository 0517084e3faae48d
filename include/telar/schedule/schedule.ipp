// What telar/schedule/schedule.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/schedule/schedule.hpp>

namespace telar::schedule {

TELAR_DECL MessageKey message_key(Schedule const& s, int rank, Instruction const& in) {
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

TELAR_DECL std::string to_text(Schedule const& s, bool with_communication) {
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

TELAR_DECL std::vector<int> peak_activations(Schedule const& s) {
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

TELAR_DECL Schedule with_communication(Schedule s) {
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
