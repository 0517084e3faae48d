#pragma once
// The pieces of telar::plan_memory (memory_plan.hpp): one rank's layers,
// slots, activations, model states; and the budget's search for a layout
// that fits. Nothing here allocates through Kokkos or talks to MPI.
#include <telar/comm/process_grid.hpp>
#include <telar/core/detail/activation_liveness.hpp>
#include <telar/core/detail/decl.hpp>
#include <telar/core/detail/layer_walk.hpp>
#include <telar/core/detail/shared_pool.hpp>
#include <telar/core/detail/type_traits.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/loss.hpp>
#include <telar/core/parameters.hpp>
#include <telar/optim/optimizer.hpp>
#include <telar/parallel/detail/bf16_weights.hpp>
#include <telar/parallel/detail/comm_group.hpp>
#include <telar/parallel/detail/plan_buffers.hpp>
#include <telar/parallel/detail/plan_model_states.hpp>
#include <telar/parallel/detail/slot_release.hpp>
#include <telar/parallel/run_layout.hpp>
#include <telar/parallel/strategy.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/profile/memory.hpp>
#include <telar/schedule/schedule.hpp>
#include <telar/schedule/tags.hpp>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace telar::detail {

// ZeRO<3, PerStep>: every group stays gathered for the step.
template <class StrategyT>
constexpr bool zero3_gathers_per_step() {
  if constexpr (StrategyT::has_data_parallel)
    if constexpr (StrategyT::data_parallel::sharding::stage == 3)
      return StrategyT::data_parallel::sharding::gather == ZeRO3Gather::PerStep;
  return false;
}

template <class L>
using rebuilt_bytes_t = decltype(std::size_t(
    std::declval<L const&>().rebuilt_bytes(std::size_t{}, std::declval<Shape const&>())));

// The sum of f(index, layer) over layers [first, last).
template <class Model, class F>
std::size_t sum_layers(Model const& model, std::size_t first, std::size_t last, F&& f) {
  std::size_t n = 0;
  model.for_each_layer([&](auto index, auto const& layer) {
    if (index >= first && index < last)
      n += f(index, layer);
  });
  return n;
}

// Bytes layers [first, last) keep per layer rather than per slot (the states
// telar::Recompute rebuilds in backward): `split` states each for a layer
// with a weight part (held from backward_input to backward_weight), else one.
template <class Model>
std::size_t plan_rebuilt(Model const& model, std::vector<Shape> const& shapes, std::size_t first,
                         std::size_t last, std::size_t rows, std::size_t split) {
  return sum_layers(model, first, last, [&](auto index, auto const& layer) -> std::size_t {
    using L = std::decay_t<decltype(layer)>;
    if constexpr (is_detected_v<rebuilt_bytes_t, L>)
      return layer.rebuilt_bytes(rows, shapes[index]) *
             (layer_traits<L>::has_backward_weight ? split : 1);
    else
      return 0;
  });
}

// Workspace layers [first, last) keep between calls (shared by the slots).
template <class Model>
std::size_t plan_layer_workspace(Model const& model, std::vector<Shape> const& shapes,
                                 std::size_t first, std::size_t last, std::size_t rows) {
  return sum_layers(model, first, last, [&](auto index, auto const& layer) {
    return workspace_bytes_of(layer, rows, shapes[index]);
  });
}

// Micro-batches of `chunk` at once between BackwardInput and BackwardWeight
// on `rank` (1 when backward runs fused): the rebuilt states a layer keeps.
TELAR_DECL std::size_t rebuilt_states(schedule::Schedule const& s, int rank, int chunk);
// Whether `chunk` on `rank` runs its backward split (BackwardInput, then
// BackwardWeight): its gradients between layers then stay with the slots.
TELAR_DECL bool splits_backward(schedule::Schedule const& s, int rank, int chunk);

// Saved-state bytes of layers [first, last) for `rows` samples (compact[k]:
// layer k keeps a compact copy, activation_liveness; blocks in the stage's
// shared pool, whose inner gradients stay with the slot when the backward
// runs `split`, and at the model's first layer, which runs it apart).
template <class Model>
std::size_t plan_saved(Model const& model, std::vector<Shape> const& shapes, std::size_t first,
                       std::size_t last, std::size_t rows, std::vector<bool> const& compact,
                       bool split, std::vector<std::string>& warnings) {
  return sum_layers(model, first, last, [&](auto index, auto const& layer) -> std::size_t {
    using L = std::decay_t<decltype(layer)>;
    if constexpr (!layer_traits<L>::has_saved_bytes &&
                  !std::is_same_v<typename layer_traits<L>::saved_type, NoSaved>)
      warnings.push_back("layer " + std::to_string(index) + " (" + layer_name(layer) +
                         ") has no saved_bytes(): its saved state is counted as 0");
    return pooled_saved_bytes_of(layer, rows, shapes[index], compact[index], split || index == 0);
  });
}

// The stage's shared pool: its blocks' inner tensors by nesting depth
// (core/detail/shared_pool.hpp), once for every slot.
template <class Model>
std::size_t plan_pool(Model const& model, std::vector<Shape> const& shapes, std::size_t first,
                      std::size_t last, std::size_t rows, bool split) {
  PoolExtents most;
  model.for_each_layer([&](auto index, auto const& layer) {
    if (index >= first && index < last)
      pool_extents_of(layer, shapes[index], split || index == 0, most, 0);
  });
  return pool_bytes<typename Model::value_type>(most, rows);
}

// The two buffers the slots share (stage_runner.hpp): room for `rows`
// samples of the largest tensor of each parity where `shared(k)` (the
// activations no backward reads, and every gradient between layers when
// backward runs fused).
template <class T, class Shared>
std::size_t plan_shared(std::vector<Shape> const& shapes, std::size_t first, std::size_t last,
                        std::size_t rows, Shared shared) {
  auto const most = shared_extents(feature_sizes(shapes), first, last, shared);
  return view_bytes<T>(rows * most.first) + view_bytes<T>(rows * most.second);
}

// Activations and workspace of one pipeline rank (see stage_runner.hpp).
template <class Model, class Loss>
void plan_activations(Model const& model, std::vector<Shape> const& shapes,
                      std::vector<std::size_t> const& bounds, schedule::Schedule const& sched,
                      int pp_rank, std::size_t local_batch, MemoryPlan& plan) {
  using T = typename Model::value_type;
  if (local_batch == 0) {
    plan.warnings.push_back("TrainerOptions::batch_size is 0: activations are not planned");
    return;
  }
  std::size_t const rows = local_batch / std::size_t(sched.microbatches);
  auto feat = [&](std::size_t k) { return view_bytes<T>(rows * shapes[k].size()); };
  std::size_t act = 0, work = 0;
  for (int c = 0; c < sched.chunks; ++c) {
    int const vs = sched.virtual_stage(pp_rank, c);
    std::size_t const first = bounds[std::size_t(vs)], last = bounds[std::size_t(vs) + 1];
    if (first == last)
      continue;
    Liveness const live = activation_liveness(model, first, last);
    std::vector<bool> const& kept = live.kept;
    bool const split = splits_backward(sched, pp_rank, c);
    std::size_t slot =
        plan_saved(model, shapes, first, last, rows, live.compact, split, plan.warnings);
    for (std::size_t k = first + 1; k <= last; ++k)
      slot += (kept[k] ? feat(k) : 0) + (split || k == last ? feat(k) : 0);
    if (first > 0)
      slot += 2 * feat(first); // received input and its gradient
    act += slot * schedule_slots(sched, pp_rank, c) +
           plan_rebuilt(model, shapes, first, last, rows, rebuilt_states(sched, pp_rank, c)) +
           plan_shared<T>(shapes, first, last, rows,
                          [&](std::size_t k) { return !split || !kept[k]; }) +
           plan_pool(model, shapes, first, last, rows, split);
    work += plan_layer_workspace(model, shapes, first, last, rows);
    if (first == 0) // a fused first layer's dx goes to a scratch buffer
      model.for_each_layer([&](auto index, auto const& layer) {
        using L = std::decay_t<decltype(layer)>;
        if constexpr (!layer_traits<L>::has_split_backward)
          if (index == 0)
            work += feat(0);
      });
    if (vs == sched.virtual_stages() - 1) // the loss's own (per-row sums and flags)
      work += loss_workspace_bytes<Loss>(rows, shapes.back());
  }
  plan.bytes[MemoryCategory::activations] = act;
  plan.bytes[MemoryCategory::workspace] = work;
}

// The sizes of one rank's layout: `model` built as that rank sees it (its
// tensor-parallel shard; the Trainer's own model, or a shape-only copy).
template <class Model, class StrategyT, class Optimizer, class Loss>
MemoryPlan plan_of_layout(Model const& model, RunLayout const& layout,
                          LayoutOptions const& options) {
  MemoryPlan plan;
  plan.grid = layout.grid;
  plan.zero_stage = layout.zero_stage;
  plan.rank = layout.rank;
  plan.warnings = layout.warnings;
  using T = typename Model::value_type;
  ModelStateInput ms;
  ms.elements = layout.parameter_elements;
  ms.alignment = ParameterStore<T, typename Model::memory_space>::alignment;
  ms.value_bytes = sizeof(T);
  ms.dp = layout.grid.dp;
  ms.stage = layout.zero_stage;
  // ZeRO-1's windows: on one node, or per node when every node holds the
  // same number (> 1) of the group's ranks (else messages, as zero_sharding.hpp).
  CommGroup const dp =
      comm_group(layout.grid, layout.grid_order, GridAxis::dp, options.ranks_per_node);
  ms.shared =
      layout.zero_stage == 1 && options.shared_memory && (!dp.spans || dp.per_node()) &&
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Model::memory_space>::accessible;
  ms.node_dp = dp.per_node() ? dp.local : 0;
  ms.node_leader = layout.coords.dp % dp.local == 0;
  ms.state_size = std::size_t(optimizer_traits<Optimizer>::state_size);
  ms.layerwise = optimizer_traits<Optimizer>::layerwise;
  ms.groups = layout.bucket_groups;
  ms.microbatches = layout.schedule.microbatches;
  ms.gather_per_step = zero3_gathers_per_step<StrategyT>();
  ms.gather_words = ms.gather_per_step && StrategyT::precision::bf16_compute &&
                    bf16_gathers_v<T, typename Model::memory_space>;
  ms.bf16_copy =
      keeps_bf16_copy<StrategyT, T, typename Model::memory_space>(options, layout.zero_stage);
  plan.bytes = plan_model_states(ms);
  plan.bytes[MemoryCategory::parameters] += plan_buffer_bytes(model, layout.owned);
  std::size_t const local = options.batch_size / std::size_t(layout.grid.dp);
  plan_activations<Model, Loss>(model, layout.shapes, layout.stage_bounds, layout.schedule,
                                layout.coords.pp, local, plan);
  return plan;
}

// The plan of `rank` for degrees `shape` and ZeRO stage `stage`: its layout
// (a shape-only copy of the model built for it), sized.
template <class Model, class StrategyT, class Optimizer, class Loss>
MemoryPlan plan_rank(Model model, LayoutOptions const& options, Shape const& in, GridShape shape,
                     int rank, int stage) {
  std::vector<Shape> shapes = layout_shapes<StrategyT>(
      model, shape, ProcessGrid::coords_in(shape, options.grid_order, rank), in);
  RunLayout const layout = run_layout_of<StrategyT>(model, std::move(shapes), options, shape, rank,
                                                    stage, "telar::plan_memory");
  return plan_of_layout<Model, StrategyT, Optimizer, Loss>(model, layout, options);
}

// The rank with the largest planned total of a layout.
template <class Model, class StrategyT, class Optimizer, class Loss>
MemoryPlan plan_worst(Model const& model, LayoutOptions const& options, Shape const& in,
                      GridShape shape, int stage) {
  int const world = shape.dp * shape.pp * shape.tp;
  MemoryPlan worst;
  for (int r = 0; r < world; ++r) {
    MemoryPlan p =
        plan_rank<Model, StrategyT, Optimizer, Loss>(model, options, in, shape, r, stage);
    if (r == 0 || p.bytes.total() > worst.bytes.total())
      worst = std::move(p);
  }
  return worst;
}

// The cheapest layout of the same world that fits `budget`: ZeRO stages at
// the current degrees first, then every other factorisation with the axes
// the strategy has; nullopt-like (total 0, rank -1) when none fits, with the
// smallest in `smallest`.
template <class Model, class StrategyT, class Optimizer, class Loss>
MemoryPlan plan_fitting(Model const& model, LayoutOptions const& options, Shape const& in,
                        GridShape current, std::size_t budget, MemoryPlan& smallest) {
  int const world = current.dp * current.pp * current.tp;
  int const max_stage = StrategyT::has_data_parallel ? 3 : 0;
  MemoryPlan best;
  best.rank = -1;
  bool have_smallest = false;
  auto consider = [&](GridShape g, int stage) {
    LayoutOptions o = options;
    o.grid = g;
    o.stage_boundaries.clear();
    o.custom_schedule.reset();
    MemoryPlan p;
    try {
      p = plan_worst<Model, StrategyT, Optimizer, Loss>(model, o, in, g, stage);
    } catch (std::exception const&) {
      return; // this layout cannot run (schedule, partition, shapes)
    }
    if (!have_smallest || p.bytes.total() < smallest.bytes.total()) {
      smallest = p;
      have_smallest = true;
    }
    if (p.bytes.total() <= budget && (best.rank < 0 || p.bytes.total() < best.bytes.total()))
      best = p;
  };
  for (int s = 0; s <= max_stage; ++s)
    consider(current, s);
  if (best.rank >= 0)
    return best;
  for (int pp = 1; pp <= world; ++pp)
    for (int tp = 1; tp <= world / pp; ++tp) {
      if (world % (pp * tp) != 0 || (pp > 1 && !StrategyT::has_pipeline_parallel) ||
          (tp > 1 && !StrategyT::has_tensor_parallel))
        continue;
      GridShape const g{world / (pp * tp), pp, tp};
      if (g.dp > 1 && !StrategyT::has_data_parallel)
        continue;
      for (int s = 0; s <= (g.dp > 1 ? max_stage : 0); ++s)
        consider(g, s);
    }
  return best;
}

// The refusal, the same text on every rank (it depends only on the plans).
TELAR_DECL std::string budget_message(MemoryPlan const& worst, std::size_t budget,
                                      MemoryPlan const& fits, MemoryPlan const& smallest,
                                      int world);

} // namespace telar::detail

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/parallel/detail/memory_plan_detail.ipp>
#endif
