#pragma once
/*! \file
 *  \brief The cost model at scale, on paper: data-parallel step time and
 *  scaling efficiency of a model given by its size (parameters, FLOPs per
 *  sample) on a machine given by a hardware profile written from published
 *  figures (bench/planner/profiles/), and the pipeline schedules' gain over
 *  1F1B from the schedule simulator. The same link classes, group placement
 *  (detail::comm_group), allreduce (detail::allreduce_seconds) and overlap
 *  rule (detail::exposed_reduction) as telar::predict_step; what it cannot
 *  take from a model's layers it takes from the FLOP count. docs/planner.md
 *  ("At scale, on paper") lists the published results it reproduces and what
 *  each assumed. */
#include <telar/core/error.hpp>
#include <telar/parallel/detail/step_cost_detail.hpp>
#include <telar/parallel/machine_profile.hpp>
#include <telar/schedule/simulate.hpp>
#include <telar/schedule/tags.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

namespace telar {

/*! \brief A model by its size only (e.g. ResNet-50: 25.6 M parameters,
 *  8.2 GFLOP forward per 224x224 image). */
struct PaperModel {
  std::string name;                //!< e.g. "ResNet-50"
  double parameters = 0;           //!< trained parameters (fp32 gradients: 4 bytes each)
  double forward_flops = 0;        //!< forward FLOPs per sample (2 per multiply-add)
  std::size_t batch_per_rank = 32; //!< samples per rank and step
  double bucket_bytes = 25e6;      //!< gradient bucket (PyTorch DDP's default 25 MB)
  bool hierarchical = true;        //!< two-level allreduce across nodes (IBM DDL, NCCL trees)
  /*! \brief 0: plain data parallelism; 1: ZeRO-1 (optimizer state sharded:
   *  the shard reduction after backward, the update of 1/ranks of the
   *  parameters, the all-gather). Accelerator memory has no shared windows,
   *  so on a GPU profile it runs reduce-scatter and all-gather messages. */
  int zero_stage = 0;
  /*! \brief The parameters live in host memory (ZeRO-1 may share windows
   *  on each node: telar::TrainerOptions::shared_memory). */
  bool host_memory = false;
};

/*! \brief One point of a data-parallel scaling curve (milliseconds). */
struct ScalingPoint {
  int ranks = 1;            //!< data-parallel ranks
  double step_ms = 0;       //!< compute + exposed reduction + optimizer + fixed
  double compute_ms = 0;    //!< forward and backward of one rank's batch
  double dp_comm_ms = 0;    //!< the whole gradient reduction
  double dp_exposed_ms = 0; //!< its part not hidden behind backward
  double publish_ms = 0;    //!< ZeRO-1: the all-gather of the updated shards
  double samples_per_s = 0; //!< of all ranks
};

/*! \brief Data-parallel step of \p model over \p ranks ranks on \p hw:
 *  forward, backward-input and backward-weight each forward_flops x batch
 *  at the profile's convolution rate (as predict_step's FLOP fallback for a
 *  convolution), the gradients reduced in buckets during backward with the
 *  profile's overlap, across nodes when the ranks outnumber
 *  hw.ranks_per_node, and the optimizer at optimizer_ns_per_parameter. No
 *  core sharing: each rank owns its accelerator. */
inline ScalingPoint predict_data_parallel(PaperModel const& model, MachineProfile const& hw,
                                          int ranks) {
  ScalingPoint r;
  r.ranks = ranks;
  double const pass = model.forward_flops * double(model.batch_per_rank) / (hw.conv_gflops * 1e9);
  double const compute = 3 * pass; // forward, backward-input, backward-weight
  double const last_backward = 2 * pass;
  double const bytes = 4 * model.parameters;
  double const buckets = std::max(1.0, std::ceil(bytes / model.bucket_bytes));
  detail::CommGroup const group =
      detail::comm_group({ranks, 1, 1}, default_grid_order, GridAxis::dp, hw.ranks_per_node);
  double sync = 0, exposed = 0, publish = 0, updated = model.parameters;
  if (model.zero_stage == 1 && ranks > 1) { // after backward, nothing hidden
    auto const z = detail::zero1_seconds(hw, group, bytes, model.host_memory, 1.0);
    sync = exposed = z.reduce;
    publish = z.publish;
    updated /= ranks;
  } else {
    double const one = detail::allreduce_seconds(hw, group, bytes / buckets, model.hierarchical);
    sync = buckets * one;
    exposed = ranks > 1 ? detail::exposed_reduction(sync, one, hw.overlap, last_backward) : 0.0;
  }
  double const optimizer = updated * hw.optimizer_ns_per_parameter * 1e-9;
  double const step = compute + exposed + publish + optimizer + hw.step_overhead_us * 1e-6;
  r.step_ms = 1e3 * step;
  r.compute_ms = 1e3 * compute;
  r.dp_comm_ms = 1e3 * sync;
  r.dp_exposed_ms = 1e3 * exposed;
  r.publish_ms = 1e3 * publish;
  r.samples_per_s = double(ranks) * double(model.batch_per_rank) / step;
  return r;
}

/*! \brief Scaling efficiency of \p ranks against \p baseline ranks: the
 *  throughput per rank at \p ranks over that at \p baseline (1: perfect;
 *  Goyal et al. measure from one 8-GPU server, IBM DDL and Horovod from
 *  one GPU). */
inline double scaling_efficiency(PaperModel const& model, MachineProfile const& hw, int ranks,
                                 int baseline = 1) {
  ScalingPoint const a = predict_data_parallel(model, hw, baseline);
  ScalingPoint const b = predict_data_parallel(model, hw, ranks);
  return (b.samples_per_s / ranks) / (a.samples_per_s / baseline);
}

/*! \brief ResNet-50 or ResNet-101 at 224x224 on paper: 25.6 M / 44.5 M
 *  parameters, 8.2 / 15.6 GFLOP forward per image (4.1 / 7.8 G
 *  multiply-adds), \p batch images per rank.
 *  \throws telar::Error for another depth */
inline PaperModel resnet_on_paper(int depth, std::size_t batch) {
  if (depth != 50 && depth != 101)
    throw Error("telar::resnet_on_paper: depth " + std::to_string(depth) + " (50 or 101)");
  PaperModel m;
  m.name = "ResNet-" + std::to_string(depth);
  m.parameters = depth == 50 ? 25.6e6 : 44.5e6;
  m.forward_flops = depth == 50 ? 8.2e9 : 15.6e9;
  m.batch_per_rank = batch;
  return m;
}

/*! \brief A published data-parallel scaling result and the setting that
 *  reproduces it (docs/planner.md, "At scale, on paper"). */
struct PublishedScaling {
  std::string source;    //!< who published it
  std::string profile;   //!< hardware profile file in bench/planner/profiles/
  PaperModel model;      //!< the network trained
  int ranks = 1;         //!< GPUs
  int baseline = 1;      //!< GPUs the efficiency is measured against
  double efficiency = 0; //!< published scaling efficiency
};

/*! \brief IBM DDL (95%, 256 P100, ResNet-101), Goyal et al. (~90%, 8 to
 *  256 P100, ResNet-50) and Horovod (~90%, 512 P100, ResNet-101, NCCL's flat
 *  ring with 64 MB tensor fusion). */
inline std::vector<PublishedScaling> published_scaling() {
  PaperModel hvd = resnet_on_paper(101, 64);
  hvd.hierarchical = false;
  hvd.bucket_bytes = 64e6;
  return {
      {"IBM DDL (Cho et al. 2017)", "p100_minsky_edr.json", resnet_on_paper(101, 32), 256, 1, 0.95},
      {"Goyal et al. 2017", "p100_bigbasin_50gbe.json", resnet_on_paper(50, 32), 256, 8, 0.90},
      {"Horovod (Sergeev and Del Balso 2018)", "p100_pcie_roce25.json", hvd, 512, 1, 0.90}};
}

/*! \brief Throughput gain of pipeline schedule \p name ("zb-h1", "zb-h2",
 *  ...) over 1F1B at \p p stages and \p m micro-batches, simulated with
 *  forward, backward-input and backward-weight of \p f, \p b, \p w per
 *  stage and free messages: period(1F1B) / period(name) - 1, the period
 *  being the time between iterations when consecutive ones tile (no
 *  synchronised optimizer step: Zero Bubble's post-validation), which is
 *  where ZB-H2's extra warm-up pays (TimelineStats::period). */
inline double schedule_gain_over_1f1b(std::string const& name, int p, int m, double f = 1,
                                      double b = 1, double w = 1) {
  auto const cost = schedule::CostModel::uniform(f, b, w);
  double const base = schedule::simulate(schedule::generate("1f1b", p, m), cost).period;
  double const other = schedule::simulate(schedule::generate(name, p, m), cost).period;
  return base / other - 1;
}

} // namespace telar
