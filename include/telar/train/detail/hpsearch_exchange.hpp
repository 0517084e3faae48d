#pragma once
// The messages of a hyper-parameter search: a group agreeing on one
// configuration's result, and the world gathering a round's results.
#include <telar/comm/communicator.hpp>
#include <telar/train/trial.hpp>

#include <cstring>
#include <string>
#include <vector>

namespace telar::detail {

// One configuration's result in one round, as its group agreed on it.
struct RoundResult {
  int id = 0;
  TrialStatus status = TrialStatus::finished; // finished, diverged or failed
  std::string reason;
  double val_loss = 0, val_accuracy = 0;
  long long steps = 0;
  double seconds = 0;
  int group = 0;
};

// Fixed fields as doubles (exact for these magnitudes), then the reason's bytes.
inline void pack(RoundResult const& r, std::string& out) {
  double const head[8] = {double(r.id),    double(int(r.status)),  r.val_loss,
                          r.val_accuracy,  double(r.steps),        r.seconds,
                          double(r.group), double(r.reason.size())};
  out.append(reinterpret_cast<char const*>(head), sizeof head);
  out += r.reason;
}

inline std::vector<RoundResult> unpack(std::string const& in) {
  std::vector<RoundResult> out;
  for (std::size_t at = 0; at < in.size();) {
    double head[8];
    std::memcpy(head, in.data() + at, sizeof head);
    at += sizeof head;
    RoundResult r;
    r.id = int(head[0]);
    r.status = TrialStatus(int(head[1]));
    r.val_loss = head[2];
    r.val_accuracy = head[3];
    r.steps = (long long)head[4];
    r.seconds = head[5];
    r.group = int(head[6]);
    r.reason = in.substr(at, std::size_t(head[7]));
    at += std::size_t(head[7]);
    out.push_back(std::move(r));
  }
  return out;
}

// Every rank of the group ends with the same result: that of the lowest rank
// that failed, else rank 0's. Trainer errors and non-finite losses are the
// same on every rank already; this also covers an error raised on one rank.
inline RoundResult agree_in_group(Communicator const& group, RoundResult const& mine) {
  if (group.size() == 1)
    return mine;
  int src = mine.status == TrialStatus::finished ? group.size() : group.rank();
  group.allreduce(&src, 1, ReduceOp::min);
  if (src == group.size())
    src = 0;
  std::string bytes;
  pack(mine, bytes);
  unsigned long long n = bytes.size();
  group.broadcast(&n, 1, src);
  bytes.resize(std::size_t(n));
  group.broadcast(bytes.data(), bytes.size(), src);
  return unpack(bytes).front();
}

// The round's results from every group, on every rank: each group's rank 0
// contributes the results of its configurations (the others nothing).
inline std::vector<RoundResult> gather_round(Communicator const& world,
                                             std::vector<RoundResult> const& mine) {
  std::string bytes;
  for (auto const& r : mine)
    pack(r, bytes);
  int const n = int(bytes.size());
  std::vector<int> counts(std::size_t(world.size()));
  world.allgather(&n, 1, counts.data());
  std::size_t total = 0;
  for (int c : counts)
    total += std::size_t(c);
  std::string all(total, '\0');
  world.allgatherv(bytes.data(), counts, all.data());
  return unpack(all);
}

} // namespace telar::detail
