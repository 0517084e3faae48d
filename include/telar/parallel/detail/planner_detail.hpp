#pragma once
// What telar::plan_layout enumerates and how it words its answer.
#include <telar/comm/process_grid.hpp>
#include <telar/core/detail/layer_walk.hpp>
#include <telar/core/error.hpp>
#include <telar/core/recompute.hpp>
#include <telar/core/sequential.hpp>
#include <telar/core/shape.hpp>
#include <telar/layers/dropout.hpp>
#include <telar/parallel/data_parallel.hpp>
#include <telar/parallel/strategy.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

namespace telar::detail {

// Every top-level layer recomputed (telar::RecomputeAll).
template <class Model>
inline constexpr bool recomputes_v = false;
template <class... Ls>
inline constexpr bool recomputes_v<Sequential<Ls...>> = (sizeof...(Ls) > 0) &&
                                                        (is_recompute_v<Ls> && ...);

// Why the Trainer would refuse micro-batches of `samples` on each of `dp`
// ranks ("" if it would not): the shape pass it runs before training, with
// every BatchNorm told the micro-batch (one value per channel in training
// is refused, as PyTorch refuses it).
template <class Model>
std::string refused_micro_batch(Model const& model, Shape const& in, std::size_t samples, int dp) {
  Model copy = model;
  set_training_batch(copy, samples);
  DataParallelContext group; // no communicator: only its size is read before training
  group.size = dp;
  pass_data_parallel(copy, group);
  try {
    (void)copy.output_shape(in);
  } catch (ShapeError const& e) {
    return "micro-batches of " + std::to_string(samples) + " sample(s): " + e.what();
  }
  return {};
}

// dp x pp x tp of `world` with the axes the strategy has (tp > 1 only with
// tensor-parallel layers).
template <class StrategyT>
std::vector<GridShape> grids(int world, bool tp_layers) {
  std::vector<GridShape> out;
  for (int pp = 1; pp <= world; ++pp)
    for (int tp = 1; tp <= world / pp; ++tp) {
      if (world % (pp * tp) != 0)
        continue;
      GridShape const g{world / (pp * tp), pp, tp};
      if ((g.pp > 1 && !StrategyT::has_pipeline_parallel) ||
          (g.tp > 1 && !(StrategyT::has_tensor_parallel && tp_layers)) ||
          (g.dp > 1 && !StrategyT::has_data_parallel))
        continue;
      out.push_back(g);
    }
  return out;
}

// Plain data parallelism: every rank a replica (dp = world), no sharding,
// no recomputation, one micro-batch.
template <class Candidate>
bool is_plain_dp(Candidate const& c) {
  return c.grid.pp == 1 && c.grid.tp == 1 && c.zero_stage == 0 && !c.recompute &&
         c.microbatches == 1;
}

// Fastest first; each says why it is where it is. Plain data parallelism
// goes first when it is predicted within `margin` (a fraction) of the
// fastest: a difference the cost model cannot resolve (its median error on
// this machine, docs/planner.md) must not buy a layout that may be slower
// than the one every user would try first.
template <class Candidate>
void rank_candidates(std::vector<Candidate>& c, double margin = 0) {
  std::stable_sort(c.begin(), c.end(), [](Candidate const& a, Candidate const& b) {
    return a.predicted_step_ms < b.predicted_step_ms;
  });
  if (c.empty())
    return;
  double const best = c.front().predicted_step_ms;
  auto const plain = std::find_if(c.begin(), c.end(), is_plain_dp<Candidate>);
  bool const tie =
      plain != c.begin() && plain != c.end() && plain->predicted_step_ms <= best * (1 + margin);
  if (tie)
    std::rotate(c.begin(), plain, plain + 1);
  char buf[200];
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (i == 0 && tie) {
      std::snprintf(buf, sizeof buf,
                    "plain data parallelism, predicted within %.0f%% of the fastest "
                    "(%.2f ms, %s): inside the model's error, so the simplest; ",
                    100 * margin, best, c[1].str().c_str());
      c[i].reason = buf + c[i].prediction.summary();
    } else if (i == 0) {
      std::snprintf(buf, sizeof buf, "fastest of %zu that fit", c.size());
      std::string why = buf;
      if (c.size() > 1) {
        std::snprintf(buf, sizeof buf, "; next %.2f ms (+%.0f%%) ", c[1].predicted_step_ms,
                      100 * (c[1].predicted_step_ms / best - 1));
        why += buf + c[1].str();
      }
      c[i].reason = why + "; " + c[i].prediction.summary();
    } else {
      std::snprintf(buf, sizeof buf, "+%.0f%% over the fastest; ",
                    100 * (c[i].predicted_step_ms / best - 1));
      c[i].reason = buf + c[i].prediction.summary();
    }
  }
}

inline std::string json_quote(std::string const& s) {
  std::string q = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\')
      q += '\\';
    if (static_cast<unsigned char>(ch) >= 0x20)
      q += ch;
  }
  return q + "\"";
}

template <class Candidate>
std::string candidates_json(std::vector<Candidate> const& cs) {
  std::string s = "[";
  char buf[256];
  for (auto const& c : cs) {
    std::snprintf(buf, sizeof buf,
                  "{\"dp\":%d,\"pp\":%d,\"tp\":%d,\"zero\":%d,\"microbatches\":%d,"
                  "\"recompute\":%s,\"fits\":%s,\"predicted_step_ms\":%.4g,\"memory_bytes\":%zu,",
                  c.grid.dp, c.grid.pp, c.grid.tp, c.zero_stage, c.microbatches,
                  c.recompute ? "true" : "false", c.fits ? "true" : "false", c.predicted_step_ms,
                  c.memory_bytes);
    s += (s.size() > 1 ? "," : "") + std::string(buf) + "\"schedule\":" + json_quote(c.schedule) +
         ",\"reason\":" + json_quote(c.reason) + "}";
  }
  return s + "]";
}

} // namespace telar::detail
