#pragma once

#include <telar/schedule/schedule.hpp>

#include <unordered_map>
#include <utility>
#include <vector>

namespace telar::schedule::detail {

//! Position of one instruction: rank and index in that rank's list.
struct Site {
  int rank = -1;
  int index = -1;
};

//! The instruction a Send/Recv must meet on the other side, and that side's rank.
inline std::pair<int, Instruction> counterpart(Schedule const& s, int rank, Instruction const& in) {
  int const vs = s.virtual_stage(rank, in.chunk);
  int const other = (in.op == Op::SendActivation || in.op == Op::RecvGrad) ? vs + 1 : vs - 1;
  Op op = Op::SendActivation;
  switch (in.op) {
  case Op::SendActivation:
    op = Op::RecvActivation;
    break;
  case Op::RecvActivation:
    op = Op::SendActivation;
    break;
  case Op::SendGrad:
    op = Op::RecvGrad;
    break;
  default:
    op = Op::SendGrad;
    break;
  }
  return {s.rank_of(other), Instruction{op, in.microbatch, s.chunk_of(other), rank}};
}

//! Pairs Sends with Recvs by MessageKey. `usable(rank, index)` says which communication
//! instructions take part (the validator leaves out those with a wrong layout);
//! `unmatched(site)` is called for each one without a partner. Returns partner[rank][index]
//! (rank -1 where there is none).
template <class Usable, class Unmatched>
std::vector<std::vector<Site>> match_messages(Schedule const& s, Usable&& usable,
                                              Unmatched&& unmatched) {
  std::vector<std::vector<Site>> partner(s.ranks.size());
  // key -> (send, recv); one of each at most, since the layout fixes both ranks and the
  // validator rejects duplicates per rank.
  std::unordered_map<long long, std::pair<Site, Site>> pending;
  long long const vstages = s.virtual_stages();
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    partner[r].assign(s.ranks[r].size(), Site{});
    for (std::size_t i = 0; i < s.ranks[r].size(); ++i) {
      Instruction const& in = s.ranks[r][i];
      if (!is_communication(in.op) || !usable(static_cast<int>(r), static_cast<int>(i)))
        continue;
      MessageKey const k = message_key(s, static_cast<int>(r), in);
      long long const code =
          (static_cast<long long>(k.microbatch) * 2 + (k.channel == Channel::Grad)) * vstages +
          k.boundary;
      auto& entry = pending[code];
      (is_send(in.op) ? entry.first : entry.second) =
          Site{static_cast<int>(r), static_cast<int>(i)};
    }
  }
  for (auto const& kv : pending) {
    Site const& snd = kv.second.first;
    Site const& rcv = kv.second.second;
    if (snd.rank >= 0 && rcv.rank >= 0) {
      partner[snd.rank][snd.index] = rcv;
      partner[rcv.rank][rcv.index] = snd;
    } else {
      unmatched(snd.rank >= 0 ? snd : rcv);
    }
  }
  return partner;
}

} // namespace telar::schedule::detail
