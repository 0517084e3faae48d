#pragma once
/*! \file
 *  \brief When a machine profile's measured parts no longer describe the
 *  machine: the conditions they were measured under (telar::ProfileConditions,
 *  part of telar::MachineProfile and of its JSON) and the rule that compares
 *  them with a run's (telar::profile_staleness()). */
#include <string>
#include <utility>

namespace telar {

/*! \brief What a profile's measured parts were measured under, so that a
 *  run can tell when they no longer describe the machine (profile_staleness()).
 *  Fields left at their defaults were not recorded. */
struct ProfileConditions {
  double unix_time = 0;      //!< when (seconds since 1970; 0: not recorded)
  double load_per_core = -1; //!< 1-minute load average / cores (-1: not recorded)
  double cpu_share = 0;      //!< share of a core the measuring rank got alone (0: not recorded)
  std::string build_id;      //!< compiler, backend and probe method (empty: not recorded)
};

/*! \brief How far the conditions of a run may be from those a profile was
 *  measured under before its measured parts count as stale. */
struct StalenessMargins {
  /*! \brief Largest ratio between the share of a core then and now (1.25:
   *  a probe that got 0.6 of a core is stale for a run that gets 0.8). The
   *  probe times compute in CPU time, but memory bandwidth and caches are
   *  shared with the load: an AdamW pass probed at a load of 15 cost 39 ns
   *  per parameter, 3 on the quiet machine. */
  double cpu_share_ratio = 1.25;
  double load_per_core = 0.5; //!< largest difference of load average per core
  double max_age_days = 30;   //!< older profiles are stale (software and firmware change)
};

/*! \brief Whether a profile's measured parts are stale, and why. */
struct Staleness {
  bool stale = false; //!< whether the measured parts should be measured again
  std::string reason; //!< e.g. "measured at a share of a core of 0.21, now 0.97 (over 1.25x)"
};

} // namespace telar

// The one check per condition, on the structs above.
#include <telar/parallel/detail/profile_staleness_detail.hpp>

namespace telar {

/*! \brief Whether a profile measured under \p then describes a machine
 *  now under \p now (pure: the caller measures \p now). Stale when the
 *  profile was probed but recorded no conditions, when another build (or
 *  probe method) measured it, when older than the margin, or when its share
 *  of a core or its load per core differ beyond the margins; a hand-written
 *  profile (\p probed false) is never stale. Fields not recorded in \p now
 *  are not compared.
 *  \param then the profile's conditions \param probed MachineProfile::probed
 *  \param now the run's conditions \param m the margins */
inline Staleness profile_staleness(ProfileConditions const& then, bool probed,
                                   ProfileConditions const& now, StalenessMargins const& m = {}) {
  if (!probed)
    return {};
  if (then.unix_time <= 0 || then.build_id.empty())
    return {true, "measured under unrecorded conditions (an older telar_probe)"};
  for (auto const& why :
       {detail::stale_by_build(then, now), detail::stale_by_age(then, now, m),
        detail::stale_by_share(then, now, m), detail::stale_by_load(then, now, m)})
    if (why)
      return {true, *why};
  return {};
}

} // namespace telar
