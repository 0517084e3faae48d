#pragma once
// The comparisons behind telar::profile_staleness(), one condition each:
// every one returns why the profile is stale, or nothing. Included by
// telar/parallel/profile_staleness.hpp between its structs and the function
// (include that header, not this one).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

namespace telar::detail {

inline std::optional<std::string> stale_by_build(ProfileConditions const& then,
                                                 ProfileConditions const& now) {
  if (now.build_id.empty() || now.build_id == then.build_id)
    return std::nullopt;
  return "measured by another build (" + then.build_id + ", now " + now.build_id + ")";
}

inline std::optional<std::string> stale_by_age(ProfileConditions const& then,
                                               ProfileConditions const& now,
                                               StalenessMargins const& m) {
  if (now.unix_time <= 0 || now.unix_time - then.unix_time <= m.max_age_days * 86400)
    return std::nullopt;
  char buf[96];
  std::snprintf(buf, sizeof buf, "measured %.0f days ago (over %.0f)",
                (now.unix_time - then.unix_time) / 86400, m.max_age_days);
  return std::string(buf);
}

// Either way: a probe that got less of a core than the run is as wrong as
// one that got more.
inline std::optional<std::string> stale_by_share(ProfileConditions const& then,
                                                 ProfileConditions const& now,
                                                 StalenessMargins const& m) {
  if (now.cpu_share <= 0 || then.cpu_share <= 0)
    return std::nullopt;
  double const r =
      std::max(now.cpu_share, then.cpu_share) / std::min(now.cpu_share, then.cpu_share);
  if (r <= m.cpu_share_ratio)
    return std::nullopt;
  char buf[128];
  std::snprintf(buf, sizeof buf, "measured at a share of a core of %.2f, now %.2f (over %.3gx)",
                then.cpu_share, now.cpu_share, m.cpu_share_ratio);
  return std::string(buf);
}

inline std::optional<std::string> stale_by_load(ProfileConditions const& then,
                                                ProfileConditions const& now,
                                                StalenessMargins const& m) {
  if (now.load_per_core < 0 || then.load_per_core < 0 ||
      std::abs(now.load_per_core - then.load_per_core) <= m.load_per_core)
    return std::nullopt;
  char buf[128];
  std::snprintf(buf, sizeof buf, "measured at a load of %.2f per core, now %.2f (over +-%.3g)",
                then.load_per_core, now.load_per_core, m.load_per_core);
  return std::string(buf);
}

} // namespace telar::detail
