// What telar/parallel/machine_probe.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/parallel/machine_probe.hpp>

namespace telar {

TELAR_DECL std::string profile_build_id() {
#if defined(__clang__)
  std::string cc = "clang " __clang_version__;
#elif defined(__GNUC__)
  std::string cc = "gcc " __VERSION__;
#else
  std::string cc = "c++";
#endif
  return cc + ", " + Kokkos::DefaultExecutionSpace::name() + ", probe " +
         std::to_string(detail::probe_method);
}

TELAR_DECL ProfileConditions current_conditions(int cores) {
  ProfileConditions c;
  c.unix_time = double(std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count());
  std::ifstream in("/proc/loadavg");
  double load = 0;
  if (in >> load)
    c.load_per_core = load / double(std::max(1, cores));
  c.build_id = profile_build_id();
  return c;
}

TELAR_DECL void measure_compute(MachineProfile& prof, int reps) {
  using D = Dense<float>;
  prof.measured = current_conditions(prof.cores);
  prof.measured.cpu_share = measure_scheduling(0.1).cpu_share;
  prof.probed = true;
  prof.gemm_gflops_64 = detail::forward_gflops(D(64, 64), 64, Shape{64}, reps);
  prof.gemm_gflops_256 = detail::forward_gflops(D(256, 256), 256, Shape{256}, reps);
  prof.gemm_gflops_1024 = detail::forward_gflops(D(1024, 1024), 256, Shape{1024}, reps);
  prof.conv_gflops =
      detail::forward_gflops(Conv2D<float>(32, 32, 3, 1, 1), 16, Shape{32, 14, 14}, reps);
  Kokkos::DefaultExecutionSpace exec;
  {
    // ReLU over 1M floats: 8 MB read and written; a tiny one gives the per-call cost.
    ReLU<float> relu;
    std::size_t const n = 1024, w = 1024;
    Matrix<float> x("telar::probe::x", n, w), y("telar::probe::y", n, w);
    Kokkos::deep_copy(x, 0.5f);
    typename ReLU<float>::saved_type saved;
    double const s = detail::best_call_seconds(reps, [&] { relu.forward(exec, x, y, saved); });
    prof.elementwise_gbs = double(n * w * 2 * sizeof(float)) / s * 1e-9;
    Matrix<float> xs("telar::probe::xs", 1, 16), ys("telar::probe::ys", 1, 16);
    prof.layer_overhead_us = 1e6 *
                             detail::best_call_seconds(reps,
                                                       [&] {
                                                         for (int i = 0; i < 100; ++i)
                                                           relu.forward(exec, xs, ys, saved);
                                                       }) /
                             100;
  }
  {
    // AdamW (2 state slots) over 4 M parameters, out of cache.
    std::size_t const n = std::size_t(4) << 20;
    Kokkos::View<float*> w("telar::probe::w", n), g("telar::probe::g", n),
        st("telar::probe::st", 2 * n);
    AdamW<float> opt;
    StepInfo<float> info;
    info.lr = 1e-3f;
    double const s = detail::best_call_seconds(reps, [&] {
      Kokkos::parallel_for(
          "telar::probe::adamw", n, KOKKOS_LAMBDA(std::size_t i) {
            opt.update(w(i), g(i), OptimizerState<float>{&st(i), n}, info);
          });
    });
    prof.optimizer_ns_per_parameter = s / double(n) * 1e9;
  }
}

TELAR_DECL std::string profile_write_back_refusal(MachineProfile const& refreshed,
                                                  std::string const& path) {
  namespace fs = std::filesystem;
  if (!refreshed.probed)
    return "written by hand";
  std::error_code ec;
  fs::path const file = detail::written_path(path);
  if (!fs::exists(file, ec))
    return {};
  if (detail::write_protected(file))
    return "read-only";
  try {
    if (!load_machine_profile(path).probed)
      return "written by hand";
  } catch (Error const&) {
    return "not a profile this build reads";
  }
  return {};
}

TELAR_DECL ProfileRefresh refresh_stale_profile(MachineProfile& profile, std::string const& path,
                                                ProfileConditions const& now, int reps) {
  ProfileRefresh r;
  r.staleness = profile_staleness(profile.measured, profile.probed, now);
  if (!r.staleness.stale)
    return r;
  auto const t0 = std::chrono::steady_clock::now();
  measure_compute(profile, reps);
  // The conditions judged, not measure_compute()'s second reading: the next
  // run is compared with what this one was compared on.
  profile.measured = now;
  profile.layer_times.clear(); // timed under the stale conditions too
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.kept = profile_write_back_refusal(profile, path);
  if (!r.kept.empty())
    return r;
  try {
    save_machine_profile(profile, path);
    r.saved = true;
  } catch (Error const& e) {
    r.failed = e.what();
  }
  return r;
}

} // namespace telar
