#pragma once

#include <telar/core/detail/decl.hpp>
#include <telar/schedule/schedule.hpp>

#include <climits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace telar::schedule::detail {

// The canonical schedule names, written once: the generators stamp them on
// their schedules and the tags (telar/schedule/tags.hpp) return them
// (arrays, so that a tag can take one as a template argument).
struct names {
  static constexpr char gpipe[] = "gpipe";
  static constexpr char one_f_one_b[] = "1f1b";
  static constexpr char interleaved[] = "interleaved";
  static constexpr char zb_h1[] = "zb-h1";
  static constexpr char zb_h2[] = "zb-h2";
};

inline std::string pm_args(int p, int m) {
  return "p=" + std::to_string(p) + ", m=" + std::to_string(m);
}

TELAR_DECL void require(bool ok, char const* function, std::string const& args,
                        std::string const& what);

TELAR_DECL void require_pm(char const* function, int p, int m, int v = 1);

TELAR_DECL Schedule finish(char const* name, int p, int m, int v,
                           std::vector<std::vector<Instruction>> compute);

} // namespace telar::schedule::detail

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/schedule/detail/generators.ipp>
#endif
