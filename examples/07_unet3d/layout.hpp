// unet3d --layout auto and --dry-run: every dp x sp of the world (and, with
// dp > 1, every ZeRO stage over dp) ranked by the step time
// telar::predict_slab_step predicts for its slowest rank, with why the
// others cannot run (docs/spatial.md, "Choosing dp and sp").
#pragma once

#include <telar/core/error.hpp>
#include <telar/parallel/slab_step_cost.hpp>
#include <telar/profile/memory.hpp>
#include <telar/train/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace unet3d {

// What one rank of a layout costs: its step and its planned bytes.
struct RankCost {
  telar::SlabStepPrediction step;
  std::size_t bytes = 0;
};

// One dp x sp layout of the world, with its ZeRO stage over dp.
struct Layout {
  int dp = 1, sp = 1, zero = 0;
  std::size_t batch = 0;         // volumes per data-parallel replica
  bool fits = false;             // it can run (and fits the budget)
  double predicted_ms = 0;       // its slowest rank's step
  std::size_t bytes = 0;         // the largest rank's planned bytes
  telar::SlabStepPrediction why; // that rank's parts
  std::string reason;            // chosen, slower by how much, or refused

  std::string str() const {
    std::string s = "dp=" + std::to_string(dp) + " x sp=" + std::to_string(sp) +
                    (zero > 0 ? " ZeRO-" + std::to_string(zero) : "");
    return batch == 0 ? s : s + ", batch " + std::to_string(batch) + " per replica";
  }
};

// What to search: the world's ranks, the global batch they share, the
// budget (0: none), the ZeRO stages to try (over dp x sp), and the margin
// within which plain data parallelism (sp = 1, no ZeRO) is preferred
// (PlannerOptions::plain_dp_margin: the model cannot separate layouts
// closer than that on a shared machine).
struct Search {
  int world = 1;
  std::size_t global_batch = 1;
  std::size_t budget = 0;
  std::vector<int> stages{0, 1, 2, 3};
  double plain_dp_margin = 0.10;
};

namespace detail {
inline std::string ms(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f ms", v);
  return b;
}

// The layout's slowest rank (`cost(sp, rank, batch, zero)` for each rank
// of its sp group, throwing telar::ShapeError for a split the layers
// refuse), or why it cannot run.
template <class Cost>
Layout evaluate(Search const& s, int sp, int zero, Cost& cost) {
  Layout l;
  l.sp = sp;
  l.zero = zero;
  l.dp = s.world / sp;
  l.batch = s.global_batch / std::size_t(l.dp);
  if (l.batch * std::size_t(l.dp) != s.global_batch) {
    l.batch = 0;
    l.reason = "dp=" + std::to_string(l.dp) + " does not divide the global batch of " +
               std::to_string(s.global_batch);
    return l;
  }
  try {
    for (int r = 0; r < sp; ++r) {
      RankCost const c = cost(sp, r, l.batch, zero);
      if (1e3 * c.step.seconds() > l.predicted_ms)
        l.predicted_ms = 1e3 * c.step.seconds(), l.why = c.step;
      l.bytes = std::max(l.bytes, c.bytes);
    }
  } catch (telar::ShapeError const& e) {
    l.reason = e.what();
    return l;
  }
  l.fits = s.budget == 0 || l.bytes <= s.budget;
  if (!l.fits)
    l.reason = "plans " + telar::MemoryBytes::human(l.bytes) + " per rank, over the budget of " +
               telar::MemoryBytes::human(s.budget);
  return l;
}

// Fitting layouts fastest first (plain data parallelism first when within
// the margin), then the refused; each with its reason.
inline void rank(Search const& s, std::vector<Layout>& all) {
  std::stable_sort(all.begin(), all.end(), [](Layout const& a, Layout const& b) {
    return a.fits != b.fits ? a.fits : a.fits && a.predicted_ms < b.predicted_ms;
  });
  if (all.empty() || !all.front().fits)
    return;
  double const best = all.front().predicted_ms;
  auto plain = std::find_if(all.begin(), all.end(), [&](Layout const& l) {
    return l.fits && l.sp == 1 && l.zero == 0 && l.predicted_ms <= (1 + s.plain_dp_margin) * best;
  });
  if (plain != all.end() && plain != all.begin()) {
    plain->reason = "plain data parallelism, predicted within " +
                    std::to_string(int(100 * s.plain_dp_margin + 0.5)) + "% of the fastest (" +
                    all.front().str() + ", " + ms(best) + ")";
    std::rotate(all.begin(), plain, plain + 1);
  } else
    all.front().reason = "the fastest of the layouts that fit";
  for (auto it = all.begin() + 1; it != all.end() && it->fits; ++it)
    it->reason =
        "+" + std::to_string(int(100 * (it->predicted_ms / best - 1) + 0.5)) + "% over the fastest";
}
} // namespace detail

// Every sp dividing the world (dp = world / sp), with every stage of
// s.stages where there are ranks to shard over, ranked.
template <class Cost>
std::vector<Layout> rank_layouts(Search const& s, Cost cost) {
  std::vector<Layout> all;
  for (int sp = 1; sp <= s.world; ++sp)
    if (s.world % sp == 0)
      for (int zero : s.world > 1 ? s.stages : std::vector<int>{0}) // one rank: no ZeRO
        all.push_back(detail::evaluate(s, sp, zero, cost));
  detail::rank(s, all);
  return all;
}

// The ranking as a table (--dry-run) and as JSON (--dry-run --json).
inline std::string table(std::vector<Layout> const& all) {
  std::string t = "  layout                                      step (predicted)  compute  halo  "
                  "sums  dp    loss  memory/rank  why\n";
  for (Layout const& l : all) {
    char row[256];
    if (l.fits)
      std::snprintf(row, sizeof row, "  %-43s %10.1f ms %9.1f %5.1f %5.1f %5.1f %5.1f  %11s  ",
                    l.str().c_str(), l.predicted_ms, 1e3 * l.why.compute, 1e3 * l.why.halo,
                    1e3 * l.why.group_sums, 1e3 * l.why.dp, 1e3 * l.why.loss,
                    telar::MemoryBytes::human(l.bytes).c_str());
    else
      std::snprintf(row, sizeof row, "  %-43s %10s %9s %5s %5s %5s %5s  %11s  ", l.str().c_str(),
                    "refused", "", "", "", "", "",
                    l.bytes ? telar::MemoryBytes::human(l.bytes).c_str() : "");
    t += row + l.reason + "\n";
  }
  return t;
}

inline std::string json(std::vector<Layout> const& all, std::string const& profile) {
  std::string rows;
  for (Layout const& l : all) {
    telar::JsonObject j;
    j.add("dp", l.dp)
        .add("sp", l.sp)
        .add("zero", l.zero)
        .add("batch_per_replica", (long long)l.batch)
        .add("fits", l.fits)
        .add("predicted_step_ms", l.predicted_ms)
        .add("compute_ms", 1e3 * l.why.compute)
        .add("halo_ms", 1e3 * l.why.halo)
        .add("halo_bytes", l.why.halo_bytes)
        .add("group_sum_ms", 1e3 * l.why.group_sums)
        .add("dp_ms", 1e3 * l.why.dp)
        .add("optimizer_ms", 1e3 * l.why.optimizer)
        .add("loss_ms", 1e3 * l.why.loss)
        .add("memory_bytes", (long long)l.bytes)
        .add("reason", l.reason);
    rows += (rows.empty() ? "" : ",") + j.str();
  }
  telar::JsonObject out;
  out.add("program", "unet3d").add("profile", profile).raw("layouts", "[" + rows + "]");
  return out.str();
}

} // namespace unet3d
