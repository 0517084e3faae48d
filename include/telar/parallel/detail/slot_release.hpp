#pragma once
// When a pipeline rank gives a micro-batch's slot back (PipelineExecutor and
// the memory plan both use this, so the slot count is the schedule's, never
// MPI's timing's). A slot can be reused once the micro-batch's last
// instruction has run AND every message sent from its buffers has been
// received. The rank cannot see the second, but it can know that the peer
// has POSTED the matching receive: when a message the peer sent after that
// receive (in the peer's instruction order) has arrived here. From then on
// waiting for the send cannot deadlock, so the slot is released right there,
// waiting for its sends; otherwise it is kept to the end of the step.
#include <telar/schedule/schedule.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <map>
#include <utility>
#include <vector>

namespace telar::detail {

inline constexpr std::size_t keep_to_end = std::numeric_limits<std::size_t>::max();

// Index of the Send / Recv instruction of `rank` that carries `key` (npos if none).
inline std::size_t find_message(schedule::Schedule const& s, int rank, schedule::MessageKey key,
                                bool send) {
  using schedule::Op;
  auto const& list = s.ranks[std::size_t(rank)];
  for (std::size_t i = 0; i < list.size(); ++i) {
    Op const op = list[i].op;
    bool const is = send ? (op == Op::SendActivation || op == Op::SendGrad)
                         : (op == Op::RecvActivation || op == Op::RecvGrad);
    if (is && schedule::message_key(s, rank, list[i]) == key)
      return i;
  }
  return keep_to_end;
}

// For each (micro-batch, chunk) of `rank`: the instruction index after which
// its slot is released (keep_to_end: at the end of the step).
inline std::map<std::pair<int, int>, std::size_t> slot_release_points(schedule::Schedule const& s,
                                                                      int rank) {
  using schedule::Channel;
  using schedule::Op;
  auto const& list = s.ranks[std::size_t(rank)];
  int const last_vs = s.virtual_stages() - 1;
  std::map<std::pair<int, int>, std::size_t> release;
  // Messages whose data this rank has used by index a: (a, sender, sender's index).
  struct Arrival {
    std::size_t at;
    int peer;
    std::size_t sent;
  };
  std::vector<Arrival> arrivals;
  for (std::size_t i = 0; i < list.size(); ++i) {
    auto const& in = list[i];
    if (in.microbatch < 0)
      continue;
    release[{in.microbatch, in.chunk}] = i;
    int const vs = s.virtual_stage(rank, in.chunk);
    schedule::MessageKey key;
    int from = -1;
    if (in.op == Op::Forward && vs > 0) {
      key = {Channel::Activation, in.microbatch, vs - 1};
      from = s.rank_of(vs - 1);
    } else if ((in.op == Op::Backward || in.op == Op::BackwardInput) && vs < last_vs) {
      key = {Channel::Grad, in.microbatch, vs};
      from = s.rank_of(vs + 1);
    }
    if (from >= 0)
      arrivals.push_back({i, from, find_message(s, from, key, true)});
  }
  for (std::size_t i = 0; i < list.size(); ++i) {
    auto const& in = list[i];
    if (in.op != Op::SendActivation && in.op != Op::SendGrad)
      continue;
    std::size_t const posted = find_message(s, in.peer, schedule::message_key(s, rank, in), false);
    std::size_t known = keep_to_end;
    for (Arrival const& a : arrivals)
      if (a.peer == in.peer && a.sent != keep_to_end && posted != keep_to_end && a.sent > posted)
        known = std::min(known, std::max(a.at, i));
    std::size_t& r = release[{in.microbatch, in.chunk}];
    r = known == keep_to_end ? keep_to_end : std::max(r, known);
  }
  return release;
}

// Slots `rank` allocates for `chunk`: a micro-batch takes a free slot (or a
// new one) at its first instruction and gives it back at its release point.
inline std::size_t schedule_slots(schedule::Schedule const& s, int rank, int chunk) {
  auto const release = slot_release_points(s, rank);
  auto const& list = s.ranks[std::size_t(rank)];
  std::map<int, bool> held;
  std::size_t most = 0;
  for (std::size_t i = 0; i < list.size(); ++i) {
    int const mb = list[i].microbatch;
    if (mb >= 0 && list[i].chunk == chunk && !held.count(mb)) {
      held[mb] = true;
      most = std::max(most, held.size());
    }
    for (auto it = held.begin(); it != held.end();)
      it = release.at({it->first, chunk}) == i ? held.erase(it) : std::next(it);
  }
  return most;
}

} // namespace telar::detail
