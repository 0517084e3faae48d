// What telar/parallel/detail/slot_release.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/parallel/detail/slot_release.hpp>

namespace telar::detail {

TELAR_DECL std::size_t find_message(schedule::Schedule const& s, int rank, schedule::MessageKey key,
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

TELAR_DECL std::map<std::pair<int, int>, std::size_t>
slot_release_points(schedule::Schedule const& s, int rank) {
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

TELAR_DECL std::size_t schedule_slots(schedule::Schedule const& s, int rank, int chunk) {
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
