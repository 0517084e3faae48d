#pragma once
/*! \file
 *  \brief telar::MachineProfile: the compute rates and message costs the
 *  cost model (telar::predict_step) and the planner (telar::plan_layout) time
 *  a layout with, measured by `telar_probe` or written by hand. */
#include <telar/core/detail/decl.hpp>
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
  /*! \brief Links from each node to the others (network ports: a DGX A100
   *  server has eight, one per GPU). Where a node's ranks send across at
   *  once (a two-level allreduce's across phase, ZeRO-1's per-node windows)
   *  min(their number, links) streams run side by side, each at the across
   *  costs. 1: one link per node (what telar_probe measures); a hardware
   *  profile names more. */
  int links_per_node = 1;
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
  TELAR_DECL LinkCosts link_class(bool across_nodes) const;

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
  TELAR_DECL std::optional<LayerTiming> layer_timing(std::string const& group,
                                                     std::size_t rows) const;

  /*! \brief The time measured at \p rows (a key of \p sizes), each part
   *  capped by what the other sizes bound it to: no more than any larger
   *  size's time, and no more than a smaller size's time scaled by the
   *  ratio of rows. A call descheduled through all its repetitions (a 42 ms
   *  backward between a 1 ms and a 36 ms neighbour, on a loaded machine)
   *  would otherwise decide the ranking of the layouts that run that size.
   *  \param sizes rows -> measured time \param rows a key of \p sizes */
  TELAR_DECL static LayerTiming envelope(std::map<std::size_t, LayerTiming> const& sizes,
                                         std::size_t rows);

  /*! \brief GEMM GFLOP/s for a product of \p flops (sized as a cube of
   *  `cbrt(flops / 2)`), interpolated between the measured sizes. */
  TELAR_DECL double gemm_gflops(double flops) const;

  /*! \brief The profile as one flat JSON object (times in µs and ns per byte). */
  TELAR_DECL std::string to_json() const;

  /*! \brief Reads what to_json() writes; keys left out keep their defaults,
   *  unknown keys are an error (a misspelt key must not go unnoticed).
   *  \param json a flat JSON object \throws telar::Error when malformed */
  TELAR_DECL static MachineProfile from_json(std::string const& json);

private:
  TELAR_DECL void read_timing(std::string const& key, std::string const& text);
  TELAR_DECL std::vector<std::pair<char const*, LinkCost*>> links();
  std::vector<std::pair<char const*, LinkCost const*>> links() const {
    auto l = const_cast<MachineProfile*>(this)->links();
    return {l.begin(), l.end()};
  }
  // "[across_]<collective>_alpha_us" / "..._beta_ns".
  TELAR_DECL bool read_link(std::string const& key, double v);
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
TELAR_DECL SchedulingSample measure_scheduling(double seconds = 0.05);

/*! \brief Where the profile of this machine is cached: `$TELAR_PROFILE`, else
 *  `$XDG_CACHE_HOME/telar/profile.json`, else `~/.cache/telar/profile.json`. */
TELAR_DECL std::string default_profile_path();

/*! \brief The profile at \p path (default_profile_path() when empty); a
 *  missing file gives the built-in defaults, named "default (run
 *  telar_probe)", so a plan says its rates were not measured.
 *  \throws telar::Error when the file exists but does not parse */
TELAR_DECL MachineProfile load_machine_profile(std::string path = {});

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

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/parallel/machine_profile.ipp>
#endif
