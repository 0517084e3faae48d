#pragma once
/*! \file
 *  \brief The single-process parts of `telar_probe` (compute rates, the
 *  optimizer's update, the conditions they were measured under), shared by
 *  the probe and by runs that find their cached profile stale
 *  (telar::profile_staleness()) and measure them again
 *  (telar::refresh_stale_profile()). */
#include <telar/core/detail/decl.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/adam.hpp>
#include <telar/parallel/calibrate.hpp>
#include <telar/parallel/machine_profile.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace telar {

namespace detail {
// Bump when what telar_probe measures, or how, changes: profiles of
// another method are stale.
inline constexpr int probe_method = 2;
} // namespace detail

/*! \brief This binary's build as far as measured rates depend on it: the
 *  compiler, Kokkos' default execution space, and the probe method
 *  (e.g. "gcc 12.2.0, Serial, probe 2"). */
TELAR_DECL std::string profile_build_id();

/*! \brief The conditions of this process now, less the share of a core
 *  (measure_scheduling(), which the caller runs when it is alone): time,
 *  1-minute load average per core (/proc/loadavg; -1 where it cannot be
 *  read), profile_build_id(). */
TELAR_DECL ProfileConditions current_conditions(int cores);

namespace detail {

// GFLOP/s of a layer's forward over n samples of shape `in` (fastest of `reps`).
template <class L>
double forward_gflops(L layer, std::size_t n, Shape const& in, int reps) {
  if constexpr (is_detected_v<build_t, L>)
    layer.build(in);
  layer.initialize(1);
  std::size_t const out = layer.output_shape(in).size();
  Matrix<float> x("telar::probe::x", n, in.size()), y("telar::probe::y", n, out);
  Kokkos::deep_copy(x, 0.5f);
  typename L::saved_type saved;
  Kokkos::DefaultExecutionSpace exec;
  double const s = best_call_seconds(reps, [&] { layer.forward(exec, x, y, saved); });
  return layer.flops(n, in) / s * 1e-9;
}

} // namespace detail

/*! \brief Measures, on this process alone, the compute part of \p prof:
 *  GEMM rates (a Dense forward at n = 64, 256, 1024), a 3x3 Conv2D 32->32
 *  on 14x14 images, an element-wise ReLU pass and its per-call cost, and
 *  AdamW's update per parameter over 4 M parameters (out of cache); the
 *  fastest of \p reps calls each, in calibration_clock() time (thread CPU
 *  time on the serial backend). Records the conditions (with the share of a
 *  core this process gets now, measure_scheduling()) and marks the profile
 *  probed. About a second on one core. Messages and the Trainer's fixed
 *  costs need every rank: telar_probe measures those. */
TELAR_DECL void measure_compute(MachineProfile& prof, int reps = 5);

/*! \brief Why a refreshed profile is not written to \p path (empty: it
 *  is). A profile the user wrote is theirs and a run never rewrites it:
 *  kept as is are \p refreshed when it is not probed, a file at \p path
 *  that does not say it was probed (telar_probe's output, or `"probed": 1`:
 *  a profile written by hand, of this machine or another), and a file no one
 *  may write (`chmod a-w`: how to pin a probed profile; honoured for root
 *  too, who could write it). A missing file may be written. */
TELAR_DECL std::string profile_write_back_refusal(MachineProfile const& refreshed,
                                                  std::string const& path);

/*! \brief What refresh_stale_profile() did. */
struct ProfileRefresh {
  Staleness staleness; //!< why the profile was stale (`stale` false: nothing was done)
  double seconds = 0;  //!< time spent measuring again
  bool saved = false;  //!< written back to the file
  std::string kept;    //!< why the file was left as is (profile_write_back_refusal())
  std::string failed;  //!< why writing it failed (a warning: the run goes on)
};

/*! \brief Measures the compute part of \p profile again when it is stale
 *  under \p now (profile_staleness()) and writes it back to \p path, the
 *  file it was loaded from, so that the next run under like conditions finds
 *  it fresh instead of measuring again. The compute rates and optimizer
 *  (measure_compute()) and the conditions (\p now: those judged, not a
 *  second reading) are new; layer times, measured under the stale
 *  conditions too, are dropped (calibration times what a run needs);
 *  message costs and fixed step costs stay as they were (they need every
 *  rank: telar_probe). Written atomically (save_machine_profile()) unless
 *  profile_write_back_refusal() says no; a failed write is reported, not
 *  thrown. Call it from one process (rank 0), the others waiting.
 *  \param profile as loaded from the file \param path its file
 *  \param now this run's conditions (current_conditions() and the share of
 *  a core, measure_scheduling()) \param reps calls timed per rate */
TELAR_DECL ProfileRefresh refresh_stale_profile(MachineProfile& profile, std::string const& path,
                                                ProfileConditions const& now, int reps = 5);

} // namespace telar

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/parallel/machine_probe.ipp>
#endif
