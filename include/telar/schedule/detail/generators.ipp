// What telar/schedule/detail/generators.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/schedule/detail/generators.hpp>

namespace telar::schedule::detail {

TELAR_DECL void require(bool ok, char const* function, std::string const& args,
                        std::string const& what) {
  if (!ok)
    throw std::invalid_argument(std::string("telar::schedule::") + function + "(" + args +
                                "): " + what);
}

TELAR_DECL void require_pm(char const* function, int p, int m, int v) {
  std::string const args = pm_args(p, m) + (v != 1 ? ", v=" + std::to_string(v) : "");
  require(p >= 1, function, args, "p (pipeline ranks) must be >= 1");
  require(m >= 1, function, args, "m (micro-batches) must be >= 1");
  require(v >= 1, function, args, "v (chunks per rank) must be >= 1");
  // Message tags go up to 2*m*v and virtual stages up to p*v; keep both in int.
  require(static_cast<long long>(m) * v <= INT_MAX / 4 &&
              static_cast<long long>(p) * v <= INT_MAX / 4,
          function, args, "p*v or m*v is too large");
}

TELAR_DECL Schedule finish(char const* name, int p, int m, int v,
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
