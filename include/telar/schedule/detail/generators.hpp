#pragma once

#include <telar/schedule/schedule.hpp>

#include <climits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace telar::schedule::detail {

// The canonical schedule names, written once: the generators stamp them on
// their schedules and the tags (telar/schedule/tags.hpp) return them.
struct names {
  static constexpr char const* gpipe = "gpipe";
  static constexpr char const* one_f_one_b = "1f1b";
  static constexpr char const* interleaved = "interleaved";
  static constexpr char const* zb_h1 = "zb-h1";
  static constexpr char const* zb_h2 = "zb-h2";
};

inline std::string pm_args(int p, int m) {
  return "p=" + std::to_string(p) + ", m=" + std::to_string(m);
}

inline void require(bool ok, char const* function, std::string const& args,
                    std::string const& what) {
  if (!ok)
    throw std::invalid_argument(std::string("telar::schedule::") + function + "(" + args +
                                "): " + what);
}

inline void require_pm(char const* function, int p, int m, int v = 1) {
  std::string const args = pm_args(p, m) + (v != 1 ? ", v=" + std::to_string(v) : "");
  require(p >= 1, function, args, "p (pipeline ranks) must be >= 1");
  require(m >= 1, function, args, "m (micro-batches) must be >= 1");
  require(v >= 1, function, args, "v (chunks per rank) must be >= 1");
  // Message tags go up to 2*m*v and virtual stages up to p*v; keep both in int.
  require(static_cast<long long>(m) * v <= INT_MAX / 4 &&
              static_cast<long long>(p) * v <= INT_MAX / 4,
          function, args, "p*v or m*v is too large");
}

inline Schedule finish(char const* name, int p, int m, int v,
                       std::vector<std::vector<Instruction>> compute) {
  Schedule s;
  s.name = name;
  s.stages = p;
  s.microbatches = m;
  s.chunks = v;
  s.ranks = std::move(compute);
  return with_communication(std::move(s));
}

} // namespace telar::schedule::detail
