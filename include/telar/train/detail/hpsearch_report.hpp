#pragma once
// The leaderboard of a hyper-parameter search as a text table and as JSON.
#include <telar/train/json.hpp>
#include <telar/train/trial.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace telar::detail {

// "finished", "stopped after round 2", the divergence, or "failed: <error>".
inline std::string status_text(TrialRecord const& r) {
  switch (r.status) {
  case TrialStatus::finished:
    return "finished";
  case TrialStatus::stopped:
  case TrialStatus::diverged:
    return r.reason;
  default:
    return "failed: " + r.reason;
  }
}

inline bool has_result(TrialRecord const& r) {
  return r.status == TrialStatus::finished || r.status == TrialStatus::stopped;
}

inline std::string leaderboard_table(std::vector<TrialRecord> const& board) {
  std::size_t width = 6;
  for (auto const& r : board)
    width = std::max(width, r.config.str().size());
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%4s  %-*s  %9s  %8s  %6s  %8s  %s\n", "rank", int(width),
                "config", "val loss", "val acc", "steps", "seconds", "status");
  out += line;
  for (std::size_t i = 0; i < board.size(); ++i) {
    auto const& r = board[i];
    char loss[32] = "-", acc[32] = "-";
    if (has_result(r)) {
      std::snprintf(loss, sizeof loss, r.val_loss < 1e4 ? "%.4f" : "%.3e", r.val_loss);
      std::snprintf(acc, sizeof acc, "%.2f%%", 100 * r.val_accuracy);
    }
    std::snprintf(line, sizeof line, "%4zu  %-*s  %9s  %8s  %6lld  %8.2f  ", i + 1, int(width),
                  r.config.str().c_str(), loss, acc, r.steps, r.seconds);
    out += line + status_text(r) + "\n";
  }
  return out;
}

inline std::string json_config(HyperParams const& p) {
  JsonObject o;
  for (auto const& [name, value] : p.items())
    o.add(name, value);
  return o.str();
}

// One leaderboard entry; results of failed configurations are null.
inline std::string json_record(TrialRecord const& r, std::size_t rank) {
  JsonObject o;
  o.add("rank", (long long)rank).add("id", r.id).raw("config", json_config(r.config));
  if (has_result(r))
    o.add("val_loss", r.val_loss).add("val_accuracy", r.val_accuracy);
  else
    o.raw("val_loss", "null").raw("val_accuracy", "null");
  o.add("steps", r.steps)
      .add("rounds", r.rounds)
      .add("group", r.group)
      .add("seconds", r.seconds)
      .add("status", status_name(r.status))
      .add("reason", r.reason);
  return o.str();
}

inline std::string json_array(std::vector<std::string> const& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i)
    out += (i ? "," : "") + items[i];
  return out + "]";
}

} // namespace telar::detail
