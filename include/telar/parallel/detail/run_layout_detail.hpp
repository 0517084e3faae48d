#pragma once
// The pieces of telar::make_run_layout (run_layout.hpp): the checked grid,
// this rank's coordinates, the schedule, the stage bounds, the owned layers
// and the flat store's sizes. Pure: no MPI, no Kokkos allocation. The
// Trainer, the memory plan and the planner all come through here, so a run
// and its plan cannot disagree on a layout.
#include <telar/comm/process_grid.hpp>
#include <telar/core/detail/type_traits.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/parallel/detail/partition.hpp>
#include <telar/parallel/layout_options.hpp>
#include <telar/parallel/strategy.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/schedule/schedule.hpp>
#include <telar/schedule/tags.hpp>
#include <telar/schedule/validate.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace telar::detail {

// The sharding stage of a strategy type (0 without data parallelism).
template <class StrategyT>
constexpr int strategy_zero_stage() {
  if constexpr (StrategyT::has_data_parallel)
    return StrategyT::data_parallel::sharding::stage;
  else
    return 0;
}

// Degrees a policy the strategy lacks cannot have; at least one micro-batch.
// `api` names the caller in the message (telar::Trainer, telar::plan_memory).
template <class StrategyT>
void check_layout_options(LayoutOptions const& options, char const* api) {
  static_assert(!StrategyT::has_spatial_parallel,
                "telar::SpatialParallel: the Trainer (and plan_memory, make_run_layout) take "
                "whole samples; a telar::SlabGraph splits them, trained by "
                "telar::SlabDataParallel (docs/spatial.md)");
  if (options.microbatches < 1)
    throw Error(std::string(api) + ": microbatches must be at least 1, got " +
                std::to_string(options.microbatches));
  auto lacking = [&](bool has, int degree, char const* axis, char const* policy) {
    if (!has && degree > 1)
      throw Error(std::string(api) + ": " + axis + "=" + std::to_string(degree) +
                  " but the strategy (" + StrategyT::name() + ") has no " + policy +
                  "; add telar::" + policy + "<> to the Strategy or set " + axis + "=1");
  };
  lacking(StrategyT::has_data_parallel, options.grid.dp, "dp", "DataParallel");
  lacking(StrategyT::has_pipeline_parallel, options.grid.pp, "pp", "PipelineParallel");
  lacking(StrategyT::has_tensor_parallel, options.grid.tp, "tp", "TensorParallel");
  // A sample split over ranks needs layers that exchange halos: a SlabGraph
  // of spatial wrappers, which the Trainer's models are not.
  if (options.grid.sp > 1)
    throw Error(std::string(api) + ": sp=" + std::to_string(options.grid.sp) +
                " but the Trainer's models take whole samples; a telar::SlabGraph splits them, "
                "updated by telar::SlabDataParallel over a telar::ProcessGrid with sp "
                "(docs/spatial.md), or set sp=1");
}

// The degrees of a run of `world_size` ranks (a policy the strategy lacks
// has degree 1); throws GridError as ProcessGrid does.
template <class StrategyT>
GridShape layout_grid(LayoutOptions const& options, int world_size) {
  GridShape want = options.grid;
  if (!StrategyT::has_data_parallel)
    want.dp = 1;
  return ProcessGrid::resolve(world_size, want, options.grid_order);
}

// The schedule every step runs over `p` stages: the custom one (its sizes
// checked) or the named one, built by its tag; validated.
template <class StrategyT>
schedule::Schedule layout_schedule(LayoutOptions const& options, int p, char const* api) {
  int const m = options.microbatches;
  schedule::Schedule s;
  if (options.custom_schedule) {
    s = *options.custom_schedule;
    if (s.stages != p || s.microbatches != m)
      throw Error(std::string(api) + ": the custom schedule has " + std::to_string(s.stages) +
                  " stages and " + std::to_string(s.microbatches) +
                  " micro-batches, the run has pp=" + std::to_string(p) + " and " +
                  std::to_string(m));
  } else {
    using Default = typename pipeline_schedule_of<StrategyT>::type;
    try {
      s = schedule::make_for_run<Default>(options.schedule, p, m, options.chunks);
    } catch (std::invalid_argument const& e) {
      throw Error(std::string(api) + ": " + e.what());
    }
  }
  schedule::check(s); // throws ScheduleError naming stage and instruction
  return s;
}

// Layer boundaries of the S virtual stages: the options' or balanced by flops.
template <class Model>
std::vector<std::size_t> layout_stage_bounds(Model const& model, std::vector<Shape> const& shapes,
                                             std::size_t S, LayoutOptions const& options) {
  if (!options.stage_boundaries.empty()) {
    check_partition(options.stage_boundaries, model.layer_count(), S);
    return options.stage_boundaries;
  }
  std::vector<double> costs;
  model.for_each_layer([&](auto index, auto const& layer) {
    using L = std::decay_t<decltype(layer)>;
    double c = 1e-3; // element-wise layers: small but not free
    if constexpr (is_detected_v<flops_t, L>)
      c = std::max(c, layer.flops(1, shapes[index]));
    costs.push_back(c);
  });
  return balanced_partition(costs, S);
}

// The layers of pipeline rank `pp`: those of its virtual stages.
inline std::vector<bool> layout_owned(schedule::Schedule const& s,
                                      std::vector<std::size_t> const& bounds, int pp,
                                      std::size_t layers) {
  std::vector<bool> owned(layers, false);
  for (int c = 0; c < s.chunks; ++c) {
    int const vs = s.virtual_stage(pp, c);
    for (std::size_t k = bounds[std::size_t(vs)]; k < bounds[std::size_t(vs) + 1]; ++k)
      owned[k] = true;
  }
  return owned;
}

// Parameter elements of the owned layers, each padded to `alignment` as the
// ParameterStore lays them out, in backward order (how buckets form).
template <class Model>
std::vector<std::size_t> layout_layer_elements(Model const& model, std::vector<bool> const& owned,
                                               std::size_t alignment,
                                               std::vector<std::string>& warnings) {
  std::vector<std::size_t> out;
  model.for_each_layer([&](auto index, auto const& layer) {
    using L = std::decay_t<decltype(layer)>;
    if constexpr (layer_traits<L>::has_parameters) {
      if (!owned[index])
        return;
      std::size_t n = 0;
      if constexpr (layer_traits<L>::has_parameter_count)
        n = (layer.parameter_count() + alignment - 1) / alignment * alignment;
      else
        warnings.push_back("layer " + std::to_string(index) + " (" + layer_name(layer) +
                           ") has no parameter_count(): its parameters are counted as 0");
      out.insert(out.begin(), n);
    }
  });
  return out;
}

// Bucket groups' elements in backward order, as BucketPlan forms them: whole
// layers, last first, until a group reaches `bucket_elements`.
inline std::vector<std::size_t> layout_groups(std::vector<std::size_t> const& layers,
                                              std::size_t bucket_elements) {
  std::vector<std::size_t> groups;
  std::size_t cur = 0;
  bool open = false;
  for (std::size_t n : layers) {
    cur += n;
    open = true;
    if (cur >= bucket_elements) {
      groups.push_back(cur);
      cur = 0;
      open = false;
    }
  }
  if (open)
    groups.push_back(cur);
  return groups;
}

// Per-sample shapes of `model` as rank `at` of a grid `shape` sees them:
// tensor-parallel layers learn their shard's size only (no communicator).
template <class StrategyT, class Model>
std::vector<Shape> layout_shapes(Model& model, GridShape shape, GridCoord at, Shape const& in) {
  if constexpr (StrategyT::has_tensor_parallel) {
    TensorParallelContext ctx;
    ctx.size = shape.tp;
    ctx.rank = at.tp;
    ctx.shape_only = true;
    set_tensor_parallel(model, ctx);
  } else {
    (void)shape, (void)at;
  }
  return model.build(in);
}

} // namespace telar::detail
