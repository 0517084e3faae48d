#pragma once

#include <telar/schedule/detail/messages.hpp>
#include <telar/schedule/schedule.hpp>

#include <vector>

namespace telar::schedule::detail {

//! Runs every rank's list as far as the send semantics allow and returns where each rank
//! stopped (its list's size when it finished). Eager: a send never blocks, a receive waits
//! until its matching send has run. Rendezvous: a send and its receive run together, once
//! both ranks have reached them. `step(rank, index)` is called for each instruction executed,
//! a send always before its receive, so callers can carry data (times) along messages.
template <class Step>
std::vector<int> execute(Schedule const& s, std::vector<std::vector<Site>> const& partner,
                         bool rendezvous, Step&& step) {
  int const p = s.stages;
  std::vector<int> pc(p, 0);
  std::vector<int> work;
  std::vector<char> queued(p, 1);
  for (int r = p - 1; r >= 0; --r)
    work.push_back(r);
  auto run = [&](int r) { step(r, pc[r]++); };
  auto wake = [&](int q) {
    if (!queued[q]) {
      queued[q] = 1;
      work.push_back(q);
    }
  };
  while (!work.empty()) {
    int const r = work.back();
    work.pop_back();
    queued[r] = 0;
    auto const& list = s.ranks[r];
    while (pc[r] < static_cast<int>(list.size())) {
      Op const op = list[pc[r]].op;
      if (!is_communication(op)) {
        run(r);
        continue;
      }
      Site const other = partner[r][pc[r]];
      if (!rendezvous && is_send(op)) {
        run(r);
        wake(other.rank); // its receive may be waiting
      } else if (!rendezvous && pc[other.rank] > other.index) {
        run(r); // the matching send has run
      } else if (rendezvous && pc[other.rank] == other.index) {
        run(is_send(op) ? r : other.rank); // both sides meet, the send first
        run(is_send(op) ? other.rank : r);
        wake(other.rank);
      } else {
        break; // resumed by wake() when the other side moves
      }
    }
  }
  return pc;
}

} // namespace telar::schedule::detail
