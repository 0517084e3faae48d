#pragma once
/*! \file
 *  \brief telar::MachineProfile: the compute rates and message costs the
 *  cost model (telar::predict_step) and the planner (telar::plan_layout) time
 *  a layout with, measured by `telar_probe` or written by hand. */
#include <telar/core/error.hpp>
#include <telar/parallel/detail/machine_profile_json.hpp>
#include <telar/parallel/detail/profile_file.hpp>
#include <telar/parallel/profile_staleness.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace telar {

/*! \brief One collective's alpha-beta cost on one link class:
 *  `alpha + beta * bytes * f(p)`, with f(p) the collective's traffic factor
 *  (ring allreduce 2(p-1)/p, reduce-scatter and all-gather (p-1)/p, send 1),
 *  so a fit at one rank count predicts the others. */
struct LinkCost {
  double alpha = 20e-6; //!< seconds per call (latency and software overhead)
  double beta = 1e-9;   //!< seconds per byte of traffic (after the factor f(p))

  /*! \brief Seconds for \p bytes at traffic factor \p factor (0 bytes: 0). */
  double seconds(double bytes, double factor = 1.0) const {
    return bytes > 0 ? alpha + beta * bytes * factor : 0.0;
  }
};

/*! \brief The five collectives' costs on one link class. */
struct LinkCosts {
  LinkCost allreduce;      //!< gradient and tensor-parallel allreduce (telar::RingAllreduce)
  LinkCost mpi_allreduce;  //!< MPI_Allreduce (telar::MpiAllreduce), for comparison
  LinkCost reduce_scatter; //!< ZeRO gradient reduce-scatter
  LinkCost all_gather;     //!< ZeRO parameter all-gather
  LinkCost send_recv;      //!< pipeline activation and gradient messages
};

/*! \brief Measured seconds of one layer call at one number of rows:
 *  forward, backward-input and backward-weight (0 for a layer without one). */
struct LayerTiming {
  double forward = 0;         //!< seconds of forward
  double backward_input = 0;  //!< seconds of backward_input (or the fused backward)
  double backward_weight = 0; //!< seconds of backward_weight
};

/*! \brief What this machine computes and moves per second, per rank.
 *
 *  Rates are those of one rank running alone (Kokkos' execution space as
 *  built); `cores` says how many ranks run at once before they share cores,
 *  and the cost model slows compute by `world / cores` beyond it. Written to
 *  and read from a flat JSON object (to_json(), from_json()), so a profile of
 *  another machine or of a link across nodes can be written by hand:
 *  \code
 *  {"name":"cluster-a","link":"across nodes","cores":64,
 *   "gemm_gflops_64":20,"gemm_gflops_256":80,"gemm_gflops_1024":120,
 *   "conv_gflops":40,"elementwise_gbs":30,"layer_overhead_us":5,
 *   "allreduce_alpha_us":15,"allreduce_beta_ns":0.1, ...}
 *  \endcode */
struct MachineProfile {
  std::string name = "default";   //!< where it came from (host name, "default", ...)
  std::string link = "same node"; //!< the link class the message costs are for
  int cores = 1;                  //!< ranks that run at once without sharing a core
  // GEMM GFLOP/s at square sizes 64, 256 and 1024, interpolated in log size
  // by gemm_gflops().
  double gemm_gflops_64 = 2.0;    //!< GEMM GFLOP/s at 64 x 64 x 64
  double gemm_gflops_256 = 5.0;   //!< GEMM GFLOP/s at 256 x 256 x 256
  double gemm_gflops_1024 = 8.0;  //!< GEMM GFLOP/s at 1024 x 1024 x 1024
  double conv_gflops = 3.0;       //!< convolution GFLOP/s (the layer's flops() per second)
  double elementwise_gbs = 5.0;   //!< GB/s of an element-wise pass (bytes read + written)
  double layer_overhead_us = 3.0; //!< fixed cost of one layer call (kernel launches, views)
  LinkCost allreduce;             //!< gradient and tensor-parallel allreduce (telar::RingAllreduce)
  LinkCost mpi_allreduce;         //!< MPI_Allreduce (telar::MpiAllreduce), for comparison
  LinkCost reduce_scatter;        //!< ZeRO gradient reduce-scatter
  LinkCost all_gather;            //!< ZeRO parameter all-gather
  LinkCost send_recv;             //!< pipeline activation and gradient messages
  /*! \brief The same collectives across nodes (JSON keys "across_<collective>_alpha_us"
   *  and "_beta_ns"; telar_probe measures them when its ranks span nodes);
   *  the members above are the same-node class. Used for every collective
   *  whose group spans nodes (ranks_per_node). */
  LinkCosts across;
  /*! \brief Ranks on each node (consecutive ranks share a node); 0: every
   *  rank on one node. A run sets it (MPI_Comm_split_type), a hardware
   *  profile names it (GPUs per node). */
  int ranks_per_node = 0;
  /*! \brief What the measured parts were measured under (telar_probe, or a
   *  run that re-measured them): see profile_staleness(). */
  ProfileConditions measured;
  /*! \brief Written by telar_probe (or re-measured by a run): its rates
   *  are this machine's and may go stale. A profile written by hand (of
   *  another machine, from published figures) is not and never goes stale. */
  bool probed = false;
  /*! \brief Fraction of the data-parallel allreduce that hides behind
   *  backward (0: none, 1: all but the last bucket); the cores compute and
   *  reduce at once, so this machine overlaps only part of it. */
  double overlap = 0.45;
  /*! \brief Compute slowdown of ranks that share `cores` (measured by
   *  telar_probe: two concurrent calibration runs against one); the cost
   *  model multiplies compute by it once world >= 2, and by world / cores
   *  beyond the cores. */
  double shared_slowdown = 1.0;
  /*! \brief Fixed cost of a Trainer step (µs) beyond layers, loss, messages
   *  and optimizer: checks, the non-finite flag's allreduce, bookkeeping,
   *  hooks (telar_probe: a step of a 1-parameter model, less its parts). */
  double step_overhead_us = 0;
  double microbatch_overhead_us = 0; //!< fixed cost per micro-batch (µs)
  /*! \brief Expected wait (µs) of one blocking synchronisation between ranks
   *  beyond its message cost: on a machine whose cores are shared (by the
   *  ranks or by other work) the peer is often not running when a rank
   *  reaches the sync point (telar_probe: compute + 8-byte allreduce loops
   *  against compute alone, on every rank at once). A record of the load
   *  at probe time, kept to check the model against: the cost model does
   *  not charge it (it took 12 ms from a probe under load where a quiet
   *  dp=2 step measured 1.55 ms); it derives the wait from cpu_share,
   *  slice_us and descheduled_us of the run (docs/planner.md). */
  double sync_wait_us = 0;
  double optimizer_ns_per_parameter = 0; //!< measured update cost (0: bandwidth model)
  /*! \brief Fraction of a core each rank gets while every rank is busy,
   *  measured at the start of a run (measure_scheduling(), every rank at
   *  once): 4 ranks on 2 idle cores give 0.5, 2 ranks beside 8 compiler
   *  processes about 0.2. 0: not measured; the cost model then takes
   *  min(1, cores / world), the ranks alone on the machine. */
  double cpu_share = 0;
  /*! \brief Mean time (µs) a rank runs between two deschedulings, from the
   *  same measurement (0: not measured; the model takes 3000 µs). */
  double slice_us = 0;
  /*! \brief Expected wait (µs) of a rank that needs a peer which is
   *  descheduled: the length-biased mean remaining of a descheduled gap,
   *  E[gap^2] / (2 E[gap]), from the same measurement (0 with cpu_share
   *  not measured: the model takes slice_us (1/cpu_share - 1) / 2, round
   *  robin). */
  double descheduled_us = 0;
  /*! \brief Measured layer times (calibrate_layers()): group key
   *  "name in->out tT" (layer_group()) -> rows -> seconds. */
  std::map<std::string, std::map<std::size_t, LayerTiming>> layer_times;

  /*! \brief The collectives' costs on one link class: same node (the
   *  plain members) or \p across_nodes (`across`). */
  LinkCosts link_class(bool across_nodes) const {
    if (across_nodes)
      return across;
    return LinkCosts{allreduce, mpi_allreduce, reduce_scatter, all_gather, send_recv};
  }

  /*! \brief The calibration group of a layer: its name, per-sample input and
   *  output shapes (two Dense layers of one input width differ in output)
   *  and the thread count it ran with. */
  static std::string layer_group(std::string const& name, std::string const& in,
                                 std::string const& out, int threads) {
    return name + " " + in + "->" + out + " t" + std::to_string(threads);
  }

  /*! \brief The measured time of \p group at \p rows: linear in rows
   *  between the nearest measured sizes, linear through the two nearest
   *  beyond them (never below 0, nor below the smallest size's time when
   *  fewer rows are asked); empty when the group was not measured. Each
   *  measured size counts as its lower envelope over the others
   *  (envelope()): calibration noise only ever adds time. */
  std::optional<LayerTiming> layer_timing(std::string const& group, std::size_t rows) const {
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
    auto lerp = [&](double u, double v) {
      return std::max(0.0, u + (v - u) * (x - x0) / (x1 - x0));
    };
    LayerTiming t{lerp(a.forward, b.forward), lerp(a.backward_input, b.backward_input),
                  lerp(a.backward_weight, b.backward_weight)};
    if (x < x0) { // below the smallest: no cheaper than a fixed share of it
      t.forward = std::max(t.forward, a.forward * x / x0);
      t.backward_input = std::max(t.backward_input, a.backward_input * x / x0);
      t.backward_weight = std::max(t.backward_weight, a.backward_weight * x / x0);
    }
    return t;
  }

  /*! \brief The time measured at \p rows (a key of \p sizes), each part
   *  capped by what the other sizes bound it to: no more than any larger
   *  size's time, and no more than a smaller size's time scaled by the
   *  ratio of rows. A call descheduled through all its repetitions (a 42 ms
   *  backward between a 1 ms and a 36 ms neighbour, on a loaded machine)
   *  would otherwise decide the ranking of the layouts that run that size.
   *  \param sizes rows -> measured time \param rows a key of \p sizes */
  static LayerTiming envelope(std::map<std::size_t, LayerTiming> const& sizes, std::size_t rows) {
    LayerTiming t = sizes.at(rows);
    for (auto const& [r, u] : sizes) {
      double const f = r > rows ? 1.0 : double(rows) / double(r);
      t.forward = std::min(t.forward, u.forward * f);
      t.backward_input = std::min(t.backward_input, u.backward_input * f);
      t.backward_weight = std::min(t.backward_weight, u.backward_weight * f);
    }
    return t;
  }

  /*! \brief GEMM GFLOP/s for a product of \p flops (sized as a cube of
   *  `cbrt(flops / 2)`), interpolated between the measured sizes. */
  double gemm_gflops(double flops) const {
    double const n = std::cbrt(std::max(flops, 2.0) / 2.0);
    double const x = std::log2(std::clamp(n, 64.0, 1024.0));
    if (x <= 8.0)
      return gemm_gflops_64 + (gemm_gflops_256 - gemm_gflops_64) * (x - 6.0) / 2.0;
    return gemm_gflops_256 + (gemm_gflops_1024 - gemm_gflops_256) * (x - 8.0) / 2.0;
  }

  /*! \brief The profile as one flat JSON object (times in µs and ns per byte). */
  std::string to_json() const {
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

  /*! \brief Reads what to_json() writes; keys left out keep their defaults,
   *  unknown keys are an error (a misspelt key must not go unnoticed).
   *  \param json a flat JSON object \throws telar::Error when malformed */
  static MachineProfile from_json(std::string const& json) {
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

private:
  void read_timing(std::string const& key, std::string const& text) {
    std::size_t const r = key.rfind(" r");
    LayerTiming t;
    if (r == std::string::npos || r <= 5 ||
        std::sscanf(text.c_str(), "%lf %lf %lf", &t.forward, &t.backward_input,
                    &t.backward_weight) != 3)
      throw Error("telar::MachineProfile: \"" + key +
                  "\" must be \"time <layer> r<rows>\": "
                  "\"forward backward_input backward_weight\" (µs)");
    layer_times[key.substr(5, r - 5)][std::size_t(std::stoull(key.substr(r + 2)))] =
        LayerTiming{t.forward * 1e-6, t.backward_input * 1e-6, t.backward_weight * 1e-6};
  }
  std::vector<std::pair<char const*, LinkCost*>> links() {
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
  std::vector<std::pair<char const*, LinkCost const*>> links() const {
    auto l = const_cast<MachineProfile*>(this)->links();
    return {l.begin(), l.end()};
  }
  // "[across_]<collective>_alpha_us" / "..._beta_ns".
  bool read_link(std::string const& key, double v) {
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
};

/*! \brief What one busy process sees of the scheduler (see measure_scheduling()). */
struct SchedulingSample {
  double cpu_share = 1;      //!< fraction of the wall time it ran
  double slice_us = 0;       //!< mean run between two deschedulings (µs; 0: never descheduled)
  double descheduled_us = 0; //!< length-biased mean remaining of a descheduled gap (µs)
};

/*! \brief Spins for \p seconds reading the clock and reads the scheduler off
 *  the gaps: a gap over 50 µs between two readings is time this process was
 *  descheduled (a reading costs well under 1 µs; interrupts take a few µs).
 *  Call it on every rank at once, so that it sees what a step sees: every
 *  rank busy (computing, or polling in MPI). Pure CPU; no MPI.
 *  \param seconds how long to spin (50 ms sees several slices at a load of 10) */
inline SchedulingSample measure_scheduling(double seconds = 0.05) {
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

/*! \brief Where the profile of this machine is cached: `$TELAR_PROFILE`, else
 *  `$XDG_CACHE_HOME/telar/profile.json`, else `~/.cache/telar/profile.json`. */
inline std::string default_profile_path() {
  if (char const* p = std::getenv("TELAR_PROFILE"); p != nullptr && *p != 0)
    return p;
  if (char const* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != 0)
    return std::string(x) + "/telar/profile.json";
  if (char const* h = std::getenv("HOME"); h != nullptr && *h != 0)
    return std::string(h) + "/.cache/telar/profile.json";
  return "telar_profile.json";
}

/*! \brief The profile at \p path (default_profile_path() when empty); a
 *  missing file gives the built-in defaults, named "default (run
 *  telar_probe)", so a plan says its rates were not measured.
 *  \throws telar::Error when the file exists but does not parse */
inline MachineProfile load_machine_profile(std::string path = {}) {
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

/*! \brief Writes \p profile to \p path (creating nothing but the file),
 *  whole: under a temporary name in the same directory, renamed over \p path,
 *  so a run reading it meanwhile reads the old profile or the new one.
 *  \throws telar::Error when it cannot be written (\p path is then
 *  unchanged), or when nobody may write it (`chmod a-w`: pinned, also
 *  against root) */
inline void save_machine_profile(MachineProfile const& profile, std::string const& path) {
  if (std::string const why = detail::replace_file(path, profile.to_json() + "\n"); !why.empty())
    throw Error("telar::save_machine_profile: cannot write " + path + " (" + why + ")");
}

} // namespace telar
