#pragma once
// The cost model behind telar::predict_step: per-layer times from flops()
// and the machine profile, per-stage sums, the schedule simulator, then the
// data-parallel reduction and the optimizer.
#include <telar/comm/process_grid.hpp>
#include <telar/comm/topology.hpp>
#include <telar/core/recompute.hpp>
#include <telar/parallel/detail/comm_group.hpp>
#include <telar/parallel/machine_profile.hpp>
#include <telar/parallel/memory_plan.hpp>
#include <telar/parallel/precision.hpp>
#include <telar/parallel/run_layout.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/schedule/simulate.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace telar::detail {

// What predict() needs beyond the model: the resolved layout.
struct StepCostInput {
  GridShape grid{1, 1, 1};
  int zero_stage = 0;
  bool zero3_per_step = false; // ZeRO<3, PerStep>: one gather per step, not per micro-batch
  bool shared_zero1 = true;    // ZeRO<1> on one node reduces through shared memory
  std::size_t state_size = 0;  // optimizer state per parameter
  int world = 1;
  GridOrder order = default_grid_order; // rank layout (which groups span nodes)
  bool hierarchical_dp = false; // dp allreduce two-level across nodes (Hierarchical, TopologyAware)
  // Bytes a value takes on the wire: 2 where gradients are reduced in bf16
  // (Precision<..., bf16>) or ZeRO-3 gathers bf16 copies (bf16 compute).
  double reduce_bytes = 4, gather_bytes = 4;
};

// Whether the strategy's data-parallel allreduce goes two-level across
// nodes (HierarchicalAllreduce; TopologyAwareAllreduce, the default, does
// when its group spans nodes).
template <class StrategyT, class = void>
inline constexpr bool hierarchical_dp_v = false;
template <class StrategyT>
inline constexpr bool
    hierarchical_dp_v<StrategyT, std::void_t<typename StrategyT::data_parallel::algorithm>> =
        std::is_same_v<typename StrategyT::data_parallel::algorithm, HierarchicalAllreduce> ||
        std::is_same_v<typename StrategyT::data_parallel::algorithm, TopologyAwareAllreduce>;

// The bytes one of a node's links carries when `local` of its ranks send
// `bytes` across between them (1/local each) while every other rank of the
// node does the same for its own group (a data-parallel group per tensor-
// or pipeline-parallel coordinate reduces at once): the node's
// ranks_per_node streams (`local` when unknown) share its links_per_node
// links, a stream using one link at most.
inline double node_link_bytes(MachineProfile const& prof, int local, double bytes) {
  int const streams = std::max(local, prof.ranks_per_node);
  return bytes / std::max(1, local) *
         std::max(1.0, double(streams) / double(std::max(1, prof.links_per_node)));
}

// Seconds of a sum-allreduce of `bytes` over `g`: the same-node ring, or
// across nodes either one ring on the across link (consecutive ranks share a
// node, so one ring edge per node crosses; every step waits for it) or,
// `hierarchical`, IBM DDL's two levels: reduce-scatter among the `local`
// ranks of a node, allreduce of 1/local of the bytes across the nodes,
// all-gather on the node (telar::HierarchicalAllreduce). The across link is
// the node's (telar_probe measures it with one rank per node): the `local`
// rings of the middle phase cross at once and share it, or its links.
inline double allreduce_seconds(MachineProfile const& prof, CommGroup const& g, double bytes,
                                bool hierarchical) {
  if (g.size < 2)
    return 0.0;
  auto ring = [](int p) { return 2.0 * (p - 1) / p; };
  if (!g.spans)
    return prof.allreduce.seconds(bytes, ring(g.size));
  if (!hierarchical || g.local < 2)
    return prof.across.allreduce.seconds(bytes, ring(g.size));
  int const nodes = g.size / g.local;
  double const half = double(g.local - 1) / g.local; // one ring phase on the node
  LinkCost const& across = prof.across.allreduce;
  return 2 * prof.allreduce.seconds(bytes, half) + across.alpha +
         across.beta * node_link_bytes(prof, g.local, bytes) * ring(nodes);
}

// ZeRO-1's two parts over the data-parallel group `g` (seconds), for
// `bytes` of gradients: the shard reduction after backward and the
// publishing of the updated shards (zero_sharding.hpp).
struct ZeroOneSeconds {
  double reduce = 0, publish = 0;
};
// With shared windows (`shared`: TrainerOptions::shared_memory) on one node,
// each rank sums its shard out of every rank's gradient buffer (a pass over
// one full buffer) and publishes nothing; per node (each holds the same
// number > 1 of the group's ranks), the same pass, then a reduce-scatter and
// an all-gather across the nodes, the node's `local` cross groups at once
// sharing the link (1/local of the bytes each); otherwise reduce-scatter and
// all-gather messages over the group's link class. `contention` stretches
// the pass as compute is stretched. `narrow`: the reduce-scatters' bytes per
// fp32 byte (1/2 for bf16 gradients; the shared-memory pass stays fp32).
inline ZeroOneSeconds zero1_seconds(MachineProfile const& prof, CommGroup const& g, double bytes,
                                    bool shared, double contention, double narrow = 1) {
  ZeroOneSeconds z;
  if (g.size < 2)
    return z;
  if (shared && (!g.spans || g.per_node())) {
    z.reduce = 2 * prof.allreduce.alpha + bytes / (prof.elementwise_gbs * 1e9) * contention;
    if (g.per_node()) {
      int const nodes = g.size / g.local;
      double const across = double(nodes - 1) / nodes;
      double const link = node_link_bytes(prof, g.local, bytes);
      z.reduce += prof.across.reduce_scatter.seconds(link * narrow, across);
      z.publish = prof.across.all_gather.seconds(link, across);
    }
    return z;
  }
  LinkCosts const links = prof.link_class(g.spans);
  double const f = double(g.size - 1) / g.size;
  z.reduce = links.reduce_scatter.seconds(bytes * narrow, f);
  z.publish = links.all_gather.seconds(bytes, f);
  return z;
}

// The part of a bucketed reduction of `sync` seconds (`one` per bucket)
// that backward does not hide: all but the last bucket may overlap the
// last backward (`last_backward` seconds), by the fraction `overlap`.
inline double exposed_reduction(double sync, double one, double overlap, double last_backward) {
  return sync - std::min(overlap * (sync - one), last_backward);
}

template <class L>
using tensor_parallel_sums_t = decltype(L::tensor_parallel_sums);

// The blocking tensor-parallel sums of `layer` per micro-batch, nested ones
// included (a transformer block's attention and MLP pair: 2 forward, 2
// backward). `dx`: whether the layer's backward_input runs (a leaf first
// layer's does not, nor its sum).
template <class L>
TensorParallelSums tensor_parallel_sums(L const& layer, bool dx = true) {
  TensorParallelSums n;
  auto leaf = [&](auto const& l) {
    using X = std::decay_t<decltype(l)>;
    if constexpr (is_detected_v<tensor_parallel_sums_t, X>) {
      n.forward += X::tensor_parallel_sums.forward;
      n.backward += dx ? X::tensor_parallel_sums.backward : 0;
    }
  };
  walk_layers(layer, leaf);
  return n;
}

// Whether `layer` runs as a tensor-parallel shard: it is one (ColumnParallel,
// RowParallel, the tensor-parallel attention) or nests one. Blocks take the
// context only to pass it on: a Residual of convolutions runs whole on every
// rank of the group (the cnn example's tp=2 was planned 30% fast when every
// block counted as split).
template <class L>
bool splits_over_tp(L const& layer) {
  bool any = false;
  auto leaf = [&](auto const& l) {
    using X = std::decay_t<decltype(l)>;
    if constexpr (!is_block_v<X>)
      any = any || layer_traits<X>::has_tensor_parallel;
  };
  walk_layers(layer, leaf);
  return any;
}

// Whether any layer of `model` runs as a tensor-parallel shard: the planner
// tries tp > 1 only then.
template <class Model>
bool has_tensor_parallel_layers(Model const& model) {
  bool any = false;
  model.for_each_layer([&](auto, auto const& layer) { any = any || splits_over_tp(layer); });
  return any;
}

// One layer's times (seconds) for `rows` samples.
struct LayerTimes {
  double forward = 0, backward_input = 0, backward_weight = 0;
  double tp = 0;         // tensor-parallel allreduces (forward + backward)
  double recompute = 0;  // the extra forward of a telar::Recompute layer
  double parameters = 0; // parameter elements on this rank
};

// The model's first layer computes no dL/dx in a step where its backward is
// split (StageRunner::input_part): nothing reads the gradient of the data.
// A fused layer, a Recompute (its forward again) and a block (its inner
// gradients, run by its weight part instead) still cost it.
template <class L>
inline constexpr bool skips_first_input_gradient_v =
    layer_traits<L>::has_split_backward && !layer_traits<L>::backward_input_first &&
    !is_recompute_v<L>;

// Threads a calibration runs with (and a prediction looks up): Kokkos'
// concurrency once initialised, else 1.
inline int calibration_threads() {
  return Kokkos::is_initialized() ? int(Kokkos::DefaultExecutionSpace().concurrency()) : 1;
}

// A layer's calibration group (a telar::Recompute layer: the layer it wraps).
template <class L>
std::string calibration_group(L const& layer, Shape const& in, Shape const& out, int threads) {
  std::string name;
  if constexpr (is_recompute_v<L>)
    name = layer_name(layer.inner());
  else
    name = layer_name(layer);
  if constexpr (computes_bf16_v<L>) // telar::Precision<bf16, float>: timed apart from fp32
    name += " bf16";
  return MachineProfile::layer_group(name, in.str(), out.str(), threads);
}

// `measured`: the calibrated times of the layer's unsharded shapes, if any
// (a tensor-parallel shard takes 1/tp of them); `first`: the model's first
// layer (skips_first_input_gradient_v).
template <class L>
LayerTimes layer_times(L const& layer, Shape const& in, Shape const& out, std::size_t rows, int tp,
                       MachineProfile const& prof, double contention,
                       std::optional<LayerTiming> const& measured = std::nullopt,
                       bool first = false) {
  bool const dx = !first || !skips_first_input_gradient_v<L>; // runs backward_input
  LayerTimes t;
  double const overhead = prof.layer_overhead_us * 1e-6;
  double const bytes = double(rows) * double(in.size() + out.size()) * sizeof(float);
  double const elementwise = bytes / (prof.elementwise_gbs * 1e9);
  double flops = 0;
  if constexpr (is_detected_v<flops_t, L>)
    flops = layer.flops(rows, in);
  if constexpr (layer_traits<L>::has_parameter_count)
    t.parameters = double(layer.parameter_count());
  if (measured) {
    double const shard = tp > 1 && splits_over_tp(layer) ? 1.0 / tp : 1.0;
    t.forward = measured->forward * shard;
    t.backward_input = measured->backward_input * shard;
    t.backward_weight = measured->backward_weight * shard;
  } else if (flops > 0) {
    // A convolution reuses each weight at every position: many more flops
    // per parameter than a dense layer, and another rate.
    double const per_sample = flops / double(std::max<std::size_t>(rows, 1));
    bool const conv = t.parameters > 0 && per_sample > 8.0 * t.parameters;
    double const rate = (conv ? prof.conv_gflops : prof.gemm_gflops(flops)) * 1e9;
    t.forward = flops / rate + overhead;
    // dX and dW are each a product of the forward's size; a layer without a
    // weight part does all of backward in backward_input.
    if constexpr (layer_traits<L>::has_backward_weight) {
      t.backward_input = flops / rate + overhead;
      t.backward_weight = flops / rate + overhead;
    } else
      t.backward_input = (t.parameters > 0 ? 2.0 : 1.0) * flops / rate + overhead;
  } else {
    t.forward = elementwise + overhead;
    t.backward_input = 1.5 * elementwise + overhead; // reads dY and X, writes dX
  }
  if (!dx)
    t.backward_input = 0;
  if constexpr (is_recompute_v<L>) {
    t.recompute = t.forward;
    t.backward_input += t.recompute;
  }
  t.forward *= contention;
  t.backward_input *= contention;
  t.backward_weight *= contention;
  t.recompute *= contention;
  // Megatron pairs: a row-parallel layer (and head-parallel attention) sums
  // its output in forward, a column-parallel one (and the attention) its
  // input gradient in backward: blocking, on the critical path. A nested
  // layer's sums are taken at the block's input and output sizes (a
  // transformer block keeps the width of its residual stream).
  if (tp > 1) {
    double const factor = 2.0 * (tp - 1) / tp;
    TensorParallelSums const n = tensor_parallel_sums(layer, dx);
    double const f =
        n.forward * prof.allreduce.seconds(double(rows) * double(out.size()) * 4, factor);
    double const b =
        n.backward * prof.allreduce.seconds(double(rows) * double(in.size()) * 4, factor);
    t.forward += f;
    t.backward_input += b;
    t.tp += f + b;
  }
  return t;
}

// Blocking tensor-parallel allreduces of one micro-batch (forward and backward).
template <class Model>
int tp_allreduces_per_microbatch(Model const& model) {
  int n = 0;
  model.for_each_layer([&](auto index, auto const& layer) {
    using L = std::decay_t<decltype(layer)>;
    // The first layer's input gradient (and its allreduce) does not run.
    bool const dx = index > 0 || !skips_first_input_gradient_v<L>;
    TensorParallelSums const s = tensor_parallel_sums(layer, dx);
    n += s.forward + s.backward;
  });
  return n;
}

// What one virtual stage costs per micro-batch, and its parameters.
struct StageTimes {
  LayerTimes sum;
  double activation_bytes = 0; // of the message into the next stage
};

// The share of a core each of `world` busy ranks gets: measured at the start
// of the run (cpu_share), else the ranks alone on the machine.
inline double core_share(MachineProfile const& prof, int world) {
  if (prof.cpu_share > 0)
    return prof.cpu_share;
  return std::min(1.0, double(std::max(1, prof.cores)) / double(std::max(1, world)));
}

// The profile as seen by a rank with `share` of a core: every message is
// copied by the CPU (shared memory), so its costs stretch as compute does.
inline MachineProfile on_share(MachineProfile prof, double share) {
  for (LinkCost* l :
       {&prof.allreduce, &prof.mpi_allreduce, &prof.reduce_scatter, &prof.all_gather,
        &prof.send_recv, &prof.across.allreduce, &prof.across.mpi_allreduce,
        &prof.across.reduce_scatter, &prof.across.all_gather, &prof.across.send_recv}) {
    l->alpha /= share;
    l->beta /= share;
  }
  return prof;
}

// Expected scheduling waits (seconds) of a step of `busy` seconds whose
// messages make `hops` sequential hand-offs between ranks (a ring allreduce
// over g ranks: 2(g-1); a pipeline message: 1), across `world` ranks with
// `share` of a core each. A hand-off finds its receiver descheduled with
// probability 1 - share and then waits out the rest of the receiver's gap
// (descheduled_us, measured; else round robin: half of
// slice (1/share - 1)). Ranks that each have a core (world <= cores; the
// share is lost to other work) run in step for about a slice after a wait,
// so hand-offs closer together than a slice wait once: at most
// 1 + busy / slice of them are independent (tp=2 with its many allreduces
// measured faster than dp=2 under load). More ranks than cores can never all
// run at once: every hand-off waits, and for a whole gap, slice
// (1/share - 1): the receiver went off the core spinning in its own wait,
// so its turn comes a full round later, not at a random point of its gap
// (4-rank rings measured 0.2-3 s per MLP step at a load of 15, 40-110 ms
// per hand-off; on a quiet machine, 4 ranks on 2 cores, charging only the
// 1 - share of hand-offs that find the receiver away planned 13 layouts of
// the MLP at 13-68% of their measured time, every hand-off at 25-132%).
// The ranks that share `cores` are those of one node (ranks_per_node, when
// the world spans nodes). A rank with a whole core (share 1) never waits:
// the quiet dp=2 step the old per-step charge put at 12.2 ms measured
// 1.55 ms. `hops` are hand-offs on one node (shared memory, where waiting
// ranks spin); see same_node_hops() for those across nodes.
inline double scheduling_wait(MachineProfile const& prof, int world, int hops, double busy,
                              double share) {
  if (world < 2 || share >= 1.0 || hops <= 0)
    return 0.0;
  double const slice = (prof.slice_us > 0 ? prof.slice_us : 3000.0) * 1e-6;
  double const round = slice * (1.0 / share - 1.0); // mean descheduled gap
  int const here = prof.ranks_per_node > 0 ? std::min(world, prof.ranks_per_node) : world;
  if (here > prof.cores)
    return hops * round;
  double const rest = prof.descheduled_us > 0 ? prof.descheduled_us * 1e-6 : 0.5 * round;
  return std::min(double(hops), 1.0 + busy / slice) * (1.0 - share) * rest;
}

// Sequential hand-offs of a ring collective over `g` ranks.
inline int ring_hops(int g) {
  return 2 * (g - 1);
}

// The hand-offs of a collective that scheduling_wait() charges: none when
// its group spans nodes. A rank waiting on a link between nodes waits on a
// socket: it sleeps, leaves its core to others, and the kernel wakes it
// when the bytes arrive, so no hand-off queues behind a scheduler round
// (4 ranks on 2 cores in 4 emulated nodes left the cores half idle; charging
// their ring a round per hand-off planned 157 ms for a 27 ms step). The
// wire's own time is the link's alpha-beta cost.
inline int same_node_hops(CommGroup const& g, int hops) {
  return g.spans ? 0 : hops;
}

template <class StrategyT, class Loss, class Result, class Model>
Result predict(Model const& given, LayoutOptions const& options, Shape const& in,
               StepCostInput const& c, MachineProfile const& measured) {
  // Ranks sharing the machine: compute and messages at the share of a core
  // each rank gets, and the probe's slowdown of concurrent ranks (memory).
  double const share = core_share(measured, c.world);
  MachineProfile const prof = on_share(measured, share);
  Model unsharded = given; // the shapes calibration timed
  std::vector<Shape> const full = unsharded.build(in);
  Model model = given;
  if constexpr (StrategyT::has_tensor_parallel) {
    TensorParallelContext ctx;
    ctx.size = c.grid.tp;
    ctx.rank = 0;
    ctx.shape_only = true;
    set_tensor_parallel(model, ctx);
  }
  std::vector<Shape> const shapes = model.build(in);
  // The schedule and the stage bounds the Trainer runs: rank 0's RunLayout of
  // this candidate grid (every rank of a pipeline shares them).
  LayoutOptions candidate = options;
  candidate.grid = c.grid;
  RunLayout const layout =
      make_run_layout<StrategyT>(given, candidate, in, c.grid.dp * c.grid.pp * c.grid.tp, 0);
  schedule::Schedule const& sched = layout.schedule;
  int const S = sched.virtual_stages();
  std::vector<std::size_t> const& bounds = layout.stage_bounds;
  std::size_t const local = options.batch_size / std::size_t(c.grid.dp);
  std::size_t const rows =
      (local + std::size_t(sched.microbatches) - 1) / std::size_t(sched.microbatches);
  double const contention = (c.world > 1 ? prof.shared_slowdown : 1.0) / share;
  int const threads = calibration_threads();
  int measured_layers = 0, layers = 0;

  // Each group's link class: a group spanning nodes takes the across links
  // (tp allreduces and pipeline messages wholly; dp as allreduce_seconds()).
  // The Trainer's order: left at the default, it follows the nodes
  // (ProcessGrid::node_aware_order: dp outermost when the world spans nodes).
  int const rpn = prof.ranks_per_node;
  GridOrder const order = planned_order(c.grid, c.order, c.world, rpn);
  CommGroup const dp_group = comm_group(c.grid, order, GridAxis::dp, rpn);
  CommGroup const tp_group = comm_group(c.grid, order, GridAxis::tp, rpn);
  CommGroup const pp_group = comm_group(c.grid, order, GridAxis::pp, rpn);
  LinkCosts const dp_links = prof.link_class(dp_group.spans);
  MachineProfile tp_prof = prof; // layer_times() costs tp allreduces with `allreduce`
  tp_prof.allreduce = prof.link_class(tp_group.spans).allreduce;
  std::vector<StageTimes> stages(static_cast<std::size_t>(S));
  model.for_each_layer([&](auto index, auto const& layer) {
    std::size_t const vs = std::size_t(
        std::upper_bound(bounds.begin(), bounds.end(), std::size_t(index)) - bounds.begin() - 1);
    std::optional<LayerTiming> const measured = prof.layer_timing(
        detail::calibration_group(layer, full[index], full[index + 1], threads), rows);
    LayerTimes const t = layer_times(layer, shapes[index], shapes[index + 1], rows, c.grid.tp,
                                     tp_prof, contention, measured, index == 0);
    measured_layers += measured ? 1 : 0;
    ++layers;
    LayerTimes& s = stages[vs].sum;
    s.forward += t.forward;
    s.backward_input += t.backward_input;
    s.backward_weight += t.backward_weight;
    s.tp += t.tp;
    s.recompute += t.recompute;
    s.parameters += t.parameters;
    if (std::size_t(index) + 1 == bounds[vs + 1])
      stages[vs].activation_bytes = double(rows) * double(shapes[index + 1].size()) * 4;
  });
  // The loss runs on the last stage after each micro-batch's forward.
  if (auto const loss =
          prof.layer_timing(MachineProfile::layer_group("loss " + layer_name(Loss{}),
                                                        shapes.back().str(), "[]", threads),
                            rows))
    stages.back().sum.forward += loss->forward * contention;
  Result r;
  r.contention = contention;
  r.measured_layers = measured_layers;
  r.layers = layers;
  int const dp = c.grid.dp;
  double const ag = double(dp - 1) / dp; // all-gather and reduce-scatter traffic factor
  schedule::CostModel cost;
  cost.forward.clear();
  cost.backward_input.clear();
  cost.backward_weight.clear();
  for (auto& st : stages) {
    // ZeRO-3 gathers the stage's parameters for each micro-batch's forward
    // and again for its backward (PerStep: once per step, counted below).
    if (c.zero_stage == 3 && dp > 1 && !c.zero3_per_step) {
      double const g = dp_links.all_gather.seconds(st.sum.parameters * c.gather_bytes, ag);
      st.sum.forward += g;
      st.sum.backward_input += g;
      r.zero_gather_ms += 2e3 * g * sched.microbatches;
    }
    cost.forward.push_back(st.sum.forward);
    cost.backward_input.push_back(st.sum.backward_input);
    cost.backward_weight.push_back(st.sum.backward_weight);
    cost.activation_bytes = std::max(cost.activation_bytes, st.activation_bytes);
  }
  cost.grad_bytes = cost.activation_bytes;
  LinkCost const send = prof.link_class(pp_group.spans).send_recv;
  cost.alpha = send.alpha;
  cost.beta = send.beta;
  schedule::SimulationResult const sim = schedule::simulate(sched, cost);
  r.pipeline_ms = 1e3 * sim.makespan;
  r.bubble_fraction = c.grid.pp > 1 ? sim.bubble_fraction : 0.0;

  // Per pipeline rank: the data-parallel reduction after (or during) its
  // last backward, then the optimizer; the step ends with the slowest rank.
  std::vector<double> finish(std::size_t(c.grid.pp), 0.0);
  for (auto const& e : sim.timeline.events)
    if (e.rank >= 0 && e.rank < c.grid.pp)
      finish[std::size_t(e.rank)] = std::max(finish[std::size_t(e.rank)], e.end - sim.start);
  double step = 0;
  int dp_buckets = 0;
  for (int p = 0; p < c.grid.pp; ++p) {
    double params = 0, last_backward = 0, tp = 0, recompute = 0;
    for (int ch = 0; ch < sched.chunks; ++ch) {
      StageTimes const& st = stages[std::size_t(sched.virtual_stage(p, ch))];
      params += st.sum.parameters;
      tp += st.sum.tp * sched.microbatches;
      recompute += st.sum.recompute * sched.microbatches;
      last_backward += st.sum.backward_input + st.sum.backward_weight;
    }
    // Buckets are cut in fp32 bytes; each travels in c.reduce_bytes a value.
    double const bytes = params * 4;
    double const buckets = std::max(1.0, std::ceil(bytes / double(options.bucket_bytes)));
    double const bucket = params * c.reduce_bytes / buckets;
    double sync = 0, exposed = 0, gather = 0;
    if (dp > 1) {
      if (c.zero_stage == 0 || c.zero_stage >= 2) {
        // Bucketed during backward: allreduce (0) or reduce-scatter (2, 3);
        // all but the last bucket may hide behind the last backward, by
        // the profile's overlap fraction.
        double const one = c.zero_stage == 0
                               ? allreduce_seconds(prof, dp_group, bucket, c.hierarchical_dp)
                               : dp_links.reduce_scatter.seconds(bucket, ag);
        sync = buckets * one;
        exposed = exposed_reduction(sync, one, prof.overlap, last_backward);
      } else { // ZeRO-1: after backward, then published after the update
        ZeroOneSeconds const z =
            zero1_seconds(prof, dp_group, bytes, c.shared_zero1, contention, c.reduce_bytes / 4);
        sync = exposed = z.reduce;
        gather = z.publish;
      }
      // ZeRO-2 publishes the updated shards; ZeRO-3 PerStep gathers once per step.
      if (c.zero_stage == 2)
        gather = dp_links.all_gather.seconds(bytes, ag);
      else if (c.zero_stage == 3 && c.zero3_per_step)
        gather = dp_links.all_gather.seconds(params * c.gather_bytes, ag);
    }
    // The update reads parameters, gradients and state, writes parameters and state.
    double const updated = c.zero_stage >= 1 && dp > 1 ? params / dp : params;
    double const opt =
        (prof.optimizer_ns_per_parameter > 0
             ? updated * prof.optimizer_ns_per_parameter * 1e-9
             : updated * 4 * double(3 + 2 * c.state_size) / (prof.elementwise_gbs * 1e9)) *
            contention +
        prof.layer_overhead_us * 1e-6;
    // Fixed costs of a step and of each micro-batch (checks, the non-finite
    // flag's allreduce, bookkeeping), measured by telar_probe per whole
    // core: CPU work, stretched by core sharing as compute is (a probe
    // under load had stored 28 ms for a 4-parameter step).
    double const fixed =
        (prof.step_overhead_us + prof.microbatch_overhead_us * sched.microbatches) * 1e-6 *
        contention;
    double const end = finish[std::size_t(p)] + exposed + gather + opt + fixed;
    if (end >= step) {
      step = end;
      dp_buckets = dp > 1 ? int(buckets) : 0;
      r.last_stage = c.grid.pp > 1 ? p : -1;
      r.compute_ms = p < int(sim.busy.size()) ? 1e3 * sim.busy[std::size_t(p)] : 0.0;
      r.dp_comm_ms = 1e3 * sync;
      r.dp_exposed_ms = 1e3 * exposed;
      r.optimizer_ms = 1e3 * opt;
      r.fixed_ms = 1e3 * fixed;
      r.tp_comm_ms = 1e3 * tp;
      r.recompute_ms = 1e3 * recompute;
      if (gather > 0)
        r.zero_gather_ms = 1e3 * gather;
    }
  }
  // Blocking synchronisations of the busiest rank and their hand-offs (the
  // non-finite flag's allreduce over every rank; data parallel: each
  // bucket's reduction and any gather; tensor parallel: every blocking
  // allreduce; pipeline: each micro-batch's messages per stage boundary),
  // and what they wait for descheduled peers (scheduling_wait()).
  if (c.world > 1) {
    CommGroup const world_group{c.world, 1, rpn > 0 && c.world > rpn}; // the non-finite flag
    int syncs = 1, hops = same_node_hops(world_group, ring_hops(c.world));
    if (dp > 1) {
      int const gathers = c.zero_stage == 3 && !c.zero3_per_step
                              ? 2 * sched.microbatches * sched.chunks
                          : r.zero_gather_ms > 0 ? 1
                                                 : 0;
      syncs += 1 + gathers;
      hops += same_node_hops(dp_group, dp_buckets * ring_hops(dp) + gathers * (dp - 1));
    }
    if (c.grid.tp > 1) {
      int const n = tp_allreduces_per_microbatch(model) * sched.microbatches;
      syncs += n;
      hops += same_node_hops(tp_group, n * ring_hops(c.grid.tp));
    }
    if (c.grid.pp > 1) {
      syncs += 2 * sched.microbatches * sched.chunks;
      hops += same_node_hops(pp_group, 2 * sched.microbatches * sched.chunks);
    }
    r.sync_points = syncs;
    double const wait = scheduling_wait(measured, c.world, hops, step, share);
    r.sync_wait_ms = 1e3 * wait;
    step += wait;
  }
  r.step_ms = 1e3 * step;
  return r;
}

} // namespace telar::detail
