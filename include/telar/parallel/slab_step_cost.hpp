#pragma once
/*! \file
 *  \brief telar::predict_slab_step: the step time of one rank of a
 *  telar::SlabGraph (a U-Net on slabs) at a dp x sp layout, from its layers
 *  timed on their slabs (telar::calibrate_slab_layers; else their flops()
 *  at a telar::MachineProfile's rates, telar::predict_step's per-layer
 *  rule), its halo exchanges, the sums over the spatial group and the
 *  data-parallel average of the gradients. Ranks the spatial layouts of a
 *  world (unet3d --layout auto; docs/spatial.md, "Choosing dp and sp"). */
#include <telar/parallel/calibrate.hpp>
#include <telar/parallel/detail/step_cost_detail.hpp>
#include <telar/parallel/machine_profile.hpp>
#include <telar/parallel/slab_graph.hpp>
#include <telar/parallel/spatial_conv.hpp>
#include <telar/parallel/spatial_local.hpp>
#include <telar/parallel/spatial_norm.hpp>
#include <telar/profile/memory.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>

namespace telar {

/*! \brief Where one rank's predicted step goes (seconds). */
struct SlabStepPrediction {
  double compute = 0;    //!< every node's forward and backward, face rows recomputed
  double halo = 0;       //!< halo exchanges, forward and reverse, none assumed hidden
  double group_sums = 0; //!< weight-gradient and statistics sums over the spatial group
  double dp = 0; //!< the gradients' average over the data-parallel group (and ZeRO's gathers)
  double optimizer = 0;  //!< the update of every parameter
  double loss = 0;       //!< the caller's loss and its gradient (0 unless the caller sets it)
  double halo_bytes = 0; //!< bytes this rank sends in its exchanges per step
  int exchanges = 0;     //!< halo exchanges that move rows, per step (forward and reverse)
  int sums = 0;          //!< weight-gradient sums over the spatial group per step
  int statistics = 0;    //!< statistics sums over the spatial group per step
  /*! \brief The whole step. */
  double seconds() const { return compute + halo + group_sums + dp + optimizer + loss; }
};

/*! \brief How the gradients of a telar::SlabGraph travel
 *  (telar::SlabDataParallel): the ZeRO stage, the bucket size, and whether
 *  the slabs' parts are summed with the dp average over every rank. */
struct SlabSyncShape {
  int zero_stage = 0; //!< 0: allreduce buckets; 1: reduce-scatter, all-gather; 2, 3: by groups
  std::size_t bucket_bytes = std::size_t(8) << 20; //!< allreduce buckets, ZeRO-2 groups
  /*! \brief true: the sync runs over dp x sp ranks and no layer sums its
   *  gradients over sp (SlabDataParallelOptions::sum_over_world with a
   *  world); false: one allreduce over sp per layer with parameters, then
   *  the sync over dp (the graph trained without a world). */
  bool over_world = true;
};

namespace detail {
template <class L>
struct is_spatial_conv : std::false_type {};
template <class C>
struct is_spatial_conv<SpatialConv<C>> : std::true_type {};
template <class L>
struct is_group_norm_slab : std::false_type {};
template <class T, class M>
struct is_group_norm_slab<SpatialGroupNorm<T, M>> : std::true_type {};

// The calibration group of a wrapper on its slab: "slab Conv3D [8, 16, 32,
// 32]->[8, 16, 32, 32] t1". The wrapper is timed, not its layer: the
// wrappers copy halo-extended slabs, and SpatialGroupNorm has its own loops
// (5x faster than GroupNorm's kernels on the development machine).
template <class W>
std::string slab_group(W const& w) {
  return MachineProfile::layer_group(std::string("slab ") + W::name(), w.input_shape().str(),
                                     w.output_shape().str(), calibration_threads());
}

// Forward, backward-input and backward-weight of a copy of wrapper `w`
// alone (a group of one rank on MPI_COMM_SELF: no messages, its statistics
// sums included) on its slab at `rows` samples, each the fastest of `reps`.
template <class W>
LayerTiming time_slab_layer(W const& w, std::size_t rows, int reps) {
  Communicator const self(MPI_COMM_SELF, "telar::calibrate_slab_layers");
  SpatialPlanAs const one(1, 0); // inside a plan for another rank: build for a group of one
  W alone(self, w.layer);
  alone.build(w.input_shape());
  alone.initialize(1);
  return time_calls<layer_traits<W>::has_backward_weight>(alone, w.input_shape().size(),
                                                          alone.output_shape().size(), rows, reps);
}

// Allreduces over the spatial group a wrapper runs per step besides its
// weight-gradient sum: a layer's statistics, in forward and in backward
// (GroupNorm's per-sample sums, a synchronised BatchNorm's).
template <class W>
int statistics_sums(W const&) {
  if constexpr (is_group_norm_slab<W>::value)
    return 2;
  else if constexpr (!is_spatial_conv<W>::value)
    return layer_traits<std::decay_t<decltype(std::declval<W const&>().layer)>>::has_data_parallel
               ? 2
               : 0;
  else
    return 0;
}

// One wrapper's part of a step on `rows` samples, on `prof` as a rank with
// its share of a core sees it (`contention`: compute's stretch; `group`:
// the spatial group's link class); `first`: it reads the graph's input (no
// input gradient, no reverse exchange), `read`: with its halo rows (no
// forward exchange either: SpatialConv::forward_extended); `sums`: it sums
// its weight gradients over the group itself.
template <class W>
void add_slab_layer(SlabStepPrediction& p, W const& w, std::size_t rows, bool first, bool read,
                    int sp, MachineProfile const& prof, LinkCosts const& group, double contention,
                    bool sums) {
  using V = typename W::value_type;
  Shape const in = w.input_shape();
  std::optional<LayerTiming> const measured = prof.layer_timing(slab_group(w), rows);
  LayerTimes const t =
      layer_times(w.layer, in, w.output_shape(), rows, 1, prof, contention, measured);
  double forward = t.forward;
  if constexpr (is_spatial_conv<W>::value) {
    bool const fetched = first && read; // its halo rows came with the input
    // With overlap, the face rows are computed twice (after the halo came).
    std::size_t const out = w.output_shape()[1];
    std::size_t const faces =
        w.overlap_rows(0)[1] - w.overlap_rows(0)[0] + w.overlap_rows(2)[1] - w.overlap_rows(2)[0];
    if (!fetched)
      forward *= 1.0 + double(faces) / double(std::max<std::size_t>(out, 1));
    HaloPlan const& h = w.slab().halo;
    double const row = double(rows * in.size() / in[1] * sizeof(V)); // one row of the batch
    double const larger = row * double(std::max({h.send_lo, h.send_hi, h.recv_lo, h.recv_hi}));
    // Forward (unless fetched) and reverse (unless first, which returns no
    // input gradient).
    int const directions = (fetched ? 0 : 1) + (first ? 0 : 1);
    if (h.exchanged_rows() > 0) {
      p.exchanges += directions;
      p.halo += directions * group.send_recv.seconds(larger);
      // Forward sends the rows its neighbours read; reverse, the gradient
      // of the rows it received.
      if (!fetched)
        p.halo_bytes += row * double(h.send_lo + h.send_hi);
      if (!first)
        p.halo_bytes += row * double(h.recv_lo + h.recv_hi);
    }
  }
  p.compute += forward + t.backward_weight + (first ? 0.0 : t.backward_input);
  if (sp < 2)
    return;
  double const ring = 2.0 * (sp - 1) / sp;
  int const stats = statistics_sums(w);
  p.statistics += stats;
  p.group_sums += stats * group.allreduce.seconds(double(rows) * 16, ring); // a few doubles each
  if (t.parameters > 0 && sums) {
    p.sums += 1;
    p.group_sums += group.allreduce.seconds(t.parameters * sizeof(V), ring);
  }
}

// Seconds of the gradients' reduction over `dp` ranks (the replicas, or
// every rank when the slabs' parts are summed too) of `bytes` on `link`
// (telar::SlabDataParallel): NoSharding allreduces its buckets,
// ZeRO-1 reduce-scatters the whole buffer and ZeRO-2 and -3 each group;
// ZeRO-1 and -2 all-gather the updated shards, ZeRO-3 gathers every group
// before its forward and again before its backward. None is assumed hidden:
// a U-Net's parameters fill one bucket, which completes with backward.
inline double slab_dp_seconds(double bytes, int dp, SlabSyncShape sync, LinkCosts const& link) {
  if (dp <= 1 || bytes <= 0)
    return 0;
  double const share = double(dp - 1) / dp;
  double const groups =
      std::max(1.0, std::ceil(bytes / double(std::max<std::size_t>(1, sync.bucket_bytes))));
  if (sync.zero_stage == 0)
    return groups * link.allreduce.alpha + link.allreduce.beta * bytes * 2 * share;
  double const scatters = sync.zero_stage >= 2 ? groups : 1.0;
  double const gathers = sync.zero_stage == 3 ? 2 * groups : 1.0;
  return scatters * link.reduce_scatter.alpha + link.reduce_scatter.beta * bytes * share +
         gathers * link.all_gather.alpha +
         link.all_gather.beta * bytes * share * (sync.zero_stage == 3 ? 2 : 1);
}
} // namespace detail

/*! \brief Times, on this process alone, forward, backward-input and
 *  backward-weight of each layer of \p graph (built for some rank, e.g.
 *  under a telar::SpatialPlanAs) at \p rows samples on its slab, for what
 *  \p profile lacks (groups "slab <layer> <in>-><out> tT"): the wrapper
 *  itself on a group of one rank, so its copies and its own loops count.
 *  \return layers timed */
template <class Graph>
std::size_t calibrate_slab_layers(Graph const& graph, std::size_t rows, MachineProfile& profile,
                                  int reps = 3) {
  MemoryMeter::Uncounted uncounted; // timing buffers are no run's
  std::size_t timed = 0;
  graph.for_each_node([&](int, auto const& w, int) {
    auto& times = profile.layer_times[detail::slab_group(w)];
    if (times.count(rows) == 0) {
      times[rows] = detail::time_slab_layer(w, rows, reps);
      ++timed;
    }
  });
  return timed;
}

/*! \brief One rank's step on \p graph (built for that rank, e.g. under a
 *  telar::SpatialPlanAs) for \p rows samples per data-parallel replica, in
 *  a layout of \p dp replicas of spatial groups of \p sp ranks (world rank
 *  = dp rank x sp + sp rank), \p dp x \p sp ranks sharing the profile's
 *  cores (telar::predict_step's rule, shared_slowdown included): each
 *  node's forward, backward-input (not the first node's) and
 *  backward-weight as calibrated on its slab (calibrate_slab_layers; else
 *  by flops()), a convolution's face rows twice with overlap, a
 *  concatenation's copies at the element-wise bandwidth, every halo
 *  exchange as one message of its larger direction (none hidden: on a
 *  shared machine the wait is mostly neighbour skew, docs/spatial.md), two
 *  allreduces over the group per normalisation (statistics), the gradients
 *  reduced as \p sync says (detail::slab_dp_seconds): over every rank
 *  (SlabSyncShape::over_world), or one allreduce over the group per layer
 *  with parameters and then over dp; and the optimizer's pass over the
 *  parameters (ZeRO: this rank's share of them, 1/(ranks of the sync)). A
 *  group that spans nodes (the profile's ranks_per_node) takes the across
 *  link class. \p input_with_halo: the input comes with its halo rows
 *  (SlabGraph::input_halo, read from the file), so the first node
 *  exchanges nothing. */
template <class Graph>
SlabStepPrediction predict_slab_step(Graph& graph, std::size_t rows, int dp, int sp,
                                     MachineProfile const& prof, SlabSyncShape sync = {},
                                     bool input_with_halo = false) {
  int const world = dp * sp;
  double const share = detail::core_share(prof, world);
  MachineProfile const seen = detail::on_share(prof, share);
  // Ranks sharing the machine slow each other's compute (memory): the
  // probe's shared_slowdown, as telar::predict_step applies it.
  double const contention = (world > 1 ? prof.shared_slowdown : 1.0) / share;
  auto spans = [&](int ranks) { return seen.ranks_per_node > 0 && ranks > seen.ranks_per_node; };
  LinkCosts const group = seen.link_class(spans(sp)), replicas = seen.link_class(spans(world));
  using V = typename Graph::value_type;
  SlabStepPrediction p;
  graph.for_each_node([&](int, auto const& w, int from) {
    detail::add_slab_layer(p, w, rows, from == Graph::input, input_with_halo, sp, seen, group,
                           contention, !sync.over_world);
  });
  for (int i = 1; i < graph.size(); ++i)
    if (graph.name(i) == std::string("Concat")) // copied in forward, split in backward
      p.compute += 4.0 * double(rows * graph.slab_shape(i).size() * sizeof(V)) /
                   (seen.elementwise_gbs * 1e9) * contention;
  double parameters = 0;
  graph.parameters([&](char const*, auto& v, auto&) { parameters += double(v.span()); });
  int const ranks = sync.over_world ? world : dp; // the sync's
  p.dp = detail::slab_dp_seconds(parameters * sizeof(V), ranks, sync, replicas);
  double const updated = sync.zero_stage > 0 ? parameters / std::max(1, ranks) : parameters;
  p.optimizer = updated * prof.optimizer_ns_per_parameter * 1e-9 / share;
  return p;
}

} // namespace telar
