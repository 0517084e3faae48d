// What telar/parallel/machine_profile.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/parallel/machine_profile.hpp>

namespace telar {

TELAR_DECL LinkCosts MachineProfile::link_class(bool across_nodes) const {
  if (across_nodes)
    return across;
  return LinkCosts{allreduce, mpi_allreduce, reduce_scatter, all_gather, send_recv};
}

TELAR_DECL std::optional<LayerTiming> MachineProfile::layer_timing(std::string const& group,
                                                                   std::size_t rows) const {
  auto const g = layer_times.find(group);
  if (g == layer_times.end() || g->second.empty())
    return std::nullopt;
  auto const& m = g->second;
  if (m.count(rows) > 0)
    return envelope(m, rows);
  if (m.size() == 1) { // one size: proportional in rows
    double const f = double(rows) / double(m.begin()->first);
    LayerTiming t = m.begin()->second;
    return LayerTiming{t.forward * f, t.backward_input * f, t.backward_weight * f};
  }
  auto hi = m.lower_bound(rows);
  if (hi == m.end())
    --hi;
  if (hi == m.begin())
    ++hi;
  auto lo = std::prev(hi);
  LayerTiming const a = envelope(m, lo->first), b = envelope(m, hi->first);
  double const x0 = double(lo->first), x1 = double(hi->first), x = double(rows);
  auto lerp = [&](double u, double v) { return std::max(0.0, u + (v - u) * (x - x0) / (x1 - x0)); };
  LayerTiming t{lerp(a.forward, b.forward), lerp(a.backward_input, b.backward_input),
                lerp(a.backward_weight, b.backward_weight)};
  if (x < x0) { // below the smallest: no cheaper than a fixed share of it
    t.forward = std::max(t.forward, a.forward * x / x0);
    t.backward_input = std::max(t.backward_input, a.backward_input * x / x0);
    t.backward_weight = std::max(t.backward_weight, a.backward_weight * x / x0);
  }
  return t;
}

TELAR_DECL LayerTiming MachineProfile::envelope(std::map<std::size_t, LayerTiming> const& sizes,
                                                std::size_t rows) {
  LayerTiming t = sizes.at(rows);
  for (auto const& [r, u] : sizes) {
    double const f = r > rows ? 1.0 : double(rows) / double(r);
    t.forward = std::min(t.forward, u.forward * f);
    t.backward_input = std::min(t.backward_input, u.backward_input * f);
    t.backward_weight = std::min(t.backward_weight, u.backward_weight * f);
  }
  return t;
}

TELAR_DECL double MachineProfile::gemm_gflops(double flops) const {
  double const n = std::cbrt(std::max(flops, 2.0) / 2.0);
  double const x = std::log2(std::clamp(n, 64.0, 1024.0));
  if (x <= 8.0)
    return gemm_gflops_64 + (gemm_gflops_256 - gemm_gflops_64) * (x - 6.0) / 2.0;
  return gemm_gflops_256 + (gemm_gflops_1024 - gemm_gflops_256) * (x - 8.0) / 2.0;
}

TELAR_DECL std::string MachineProfile::to_json() const {
  detail::FlatJsonWriter w;
  w.text("name", name).text("link", link).number("cores", cores);
  w.number("gemm_gflops_64", gemm_gflops_64)
      .number("gemm_gflops_256", gemm_gflops_256)
      .number("gemm_gflops_1024", gemm_gflops_1024)
      .number("conv_gflops", conv_gflops)
      .number("elementwise_gbs", elementwise_gbs)
      .number("layer_overhead_us", layer_overhead_us)
      .number("overlap", overlap)
      .number("shared_slowdown", shared_slowdown)
      .number("step_overhead_us", step_overhead_us)
      .number("microbatch_overhead_us", microbatch_overhead_us)
      .number("sync_wait_us", sync_wait_us)
      .number("optimizer_ns_per_parameter", optimizer_ns_per_parameter)
      .number("cpu_share", cpu_share)
      .number("slice_us", slice_us)
      .number("descheduled_us", descheduled_us)
      .number("ranks_per_node", ranks_per_node)
      .number("links_per_node", links_per_node)
      .number("probed", probed ? 1 : 0)
      .number("measured_unix_time", measured.unix_time, 12)
      .number("measured_load_per_core", measured.load_per_core)
      .number("measured_cpu_share", measured.cpu_share)
      .text("build_id", measured.build_id);
  for (auto const& [key, c] : links())
    w.number(std::string(key) + "_alpha_us", c->alpha * 1e6)
        .number(std::string(key) + "_beta_ns", c->beta * 1e9);
  // "time <group> r<rows>": "forward backward_input backward_weight" in µs.
  for (auto const& [group, sizes] : layer_times)
    for (auto const& [rows, t] : sizes) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.6g %.6g %.6g", t.forward * 1e6, t.backward_input * 1e6,
                    t.backward_weight * 1e6);
      w.text("time " + group + " r" + std::to_string(rows), buf);
    }
  return w.str();
}

TELAR_DECL MachineProfile MachineProfile::from_json(std::string const& json) {
  MachineProfile p;
  bool said_probed = false;
  for (auto const& [key, value] : detail::parse_flat_json(json)) {
    auto number = [&, &value = value, &key = key] {
      if (!value.is_number)
        throw Error("telar::MachineProfile: \"" + key + "\" must be a number");
      return value.number;
    };
    if (key == "name")
      p.name = value.text;
    else if (key == "link")
      p.link = value.text;
    else if (key == "cores")
      p.cores = std::max(1, int(number()));
    else if (key == "gemm_gflops_64")
      p.gemm_gflops_64 = number();
    else if (key == "gemm_gflops_256")
      p.gemm_gflops_256 = number();
    else if (key == "gemm_gflops_1024")
      p.gemm_gflops_1024 = number();
    else if (key == "conv_gflops")
      p.conv_gflops = number();
    else if (key == "elementwise_gbs")
      p.elementwise_gbs = number();
    else if (key == "layer_overhead_us")
      p.layer_overhead_us = number();
    else if (key == "overlap")
      p.overlap = std::clamp(number(), 0.0, 1.0);
    else if (key == "shared_slowdown")
      p.shared_slowdown = std::max(1.0, number());
    else if (key == "step_overhead_us")
      p.step_overhead_us = number();
    else if (key == "microbatch_overhead_us")
      p.microbatch_overhead_us = number();
    else if (key == "sync_wait_us")
      p.sync_wait_us = number();
    else if (key == "optimizer_ns_per_parameter")
      p.optimizer_ns_per_parameter = number();
    else if (key == "cpu_share")
      p.cpu_share = std::clamp(number(), 0.0, 1.0);
    else if (key == "slice_us")
      p.slice_us = std::max(0.0, number());
    else if (key == "descheduled_us")
      p.descheduled_us = std::max(0.0, number());
    else if (key == "ranks_per_node")
      p.ranks_per_node = std::max(0, int(number()));
    else if (key == "links_per_node")
      p.links_per_node = std::max(1, int(number()));
    else if (key == "probed") {
      p.probed = number() != 0;
      said_probed = true;
    } else if (key == "measured_unix_time")
      p.measured.unix_time = number();
    else if (key == "measured_load_per_core")
      p.measured.load_per_core = number();
    else if (key == "measured_cpu_share")
      p.measured.cpu_share = std::clamp(number(), 0.0, 1.0);
    else if (key == "build_id")
      p.measured.build_id = value.text;
    else if (key.rfind("time ", 0) == 0)
      p.read_timing(key, value.text);
    else if (!p.read_link(key, number()))
      throw Error("telar::MachineProfile: unknown key \"" + key + "\"");
  }
  // Probe output from before the conditions were recorded: measured, under
  // unknown conditions (profile_staleness() calls it stale).
  if (!said_probed && p.name.find("telar_probe") != std::string::npos)
    p.probed = true;
  return p;
}

TELAR_DECL void MachineProfile::read_timing(std::string const& key, std::string const& text) {
  std::size_t const r = key.rfind(" r");
  LayerTiming t;
  if (r == std::string::npos || r <= 5 ||
      std::sscanf(text.c_str(), "%lf %lf %lf", &t.forward, &t.backward_input, &t.backward_weight) !=
          3)
    throw Error("telar::MachineProfile: \"" + key +
                "\" must be \"time <layer> r<rows>\": "
                "\"forward backward_input backward_weight\" (µs)");
  layer_times[key.substr(5, r - 5)][std::size_t(std::stoull(key.substr(r + 2)))] =
      LayerTiming{t.forward * 1e-6, t.backward_input * 1e-6, t.backward_weight * 1e-6};
}

TELAR_DECL std::vector<std::pair<char const*, LinkCost*>> MachineProfile::links() {
  return {{"allreduce", &allreduce},
          {"mpi_allreduce", &mpi_allreduce},
          {"reduce_scatter", &reduce_scatter},
          {"all_gather", &all_gather},
          {"send_recv", &send_recv},
          {"across_allreduce", &across.allreduce},
          {"across_mpi_allreduce", &across.mpi_allreduce},
          {"across_reduce_scatter", &across.reduce_scatter},
          {"across_all_gather", &across.all_gather},
          {"across_send_recv", &across.send_recv}};
}

TELAR_DECL bool MachineProfile::read_link(std::string const& key, double v) {
  for (auto const& [name, c] : links()) {
    if (key == std::string(name) + "_alpha_us")
      c->alpha = v * 1e-6;
    else if (key == std::string(name) + "_beta_ns")
      c->beta = v * 1e-9;
    else
      continue;
    return true;
  }
  return false;
}

TELAR_DECL SchedulingSample measure_scheduling(double seconds) {
  using clock = std::chrono::steady_clock;
  auto const start = clock::now();
  auto const end =
      start + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
  auto last = start;
  double gaps = 0, gaps2 = 0, wall = 0;
  int count = 0;
  for (auto now = clock::now(); now < end; now = clock::now()) {
    double const g = std::chrono::duration<double, std::micro>(now - last).count();
    if (g > 50) {
      gaps += g;
      gaps2 += g * g;
      ++count;
    }
    last = now;
  }
  wall = std::chrono::duration<double, std::micro>(last - start).count();
  SchedulingSample s;
  s.cpu_share = wall > 0 ? std::clamp(1.0 - gaps / wall, 0.01, 1.0) : 1.0;
  s.slice_us = count > 0 ? (wall - gaps) / count : 0.0;
  s.descheduled_us = count > 0 ? gaps2 / (2 * gaps) : 0.0;
  return s;
}

TELAR_DECL std::string default_profile_path() {
  if (char const* p = std::getenv("TELAR_PROFILE"); p != nullptr && *p != 0)
    return p;
  if (char const* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != 0)
    return std::string(x) + "/telar/profile.json";
  if (char const* h = std::getenv("HOME"); h != nullptr && *h != 0)
    return std::string(h) + "/.cache/telar/profile.json";
  return "telar_profile.json";
}

TELAR_DECL MachineProfile load_machine_profile(std::string path) {
  if (path.empty())
    path = default_profile_path();
  std::ifstream in(path);
  if (!in) {
    MachineProfile p;
    p.name = "default (run telar_probe)";
    p.cores = std::max(1, int(std::thread::hardware_concurrency()));
    return p;
  }
  std::stringstream text;
  text << in.rdbuf();
  try {
    return MachineProfile::from_json(text.str());
  } catch (Error const& e) {
    throw Error(std::string(e.what()) + " (in " + path + ")");
  }
}

} // namespace telar
