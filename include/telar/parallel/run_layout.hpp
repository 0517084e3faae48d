#pragma once
/*! \file
 *  \brief telar::RunLayout and telar::make_run_layout: how a run of a model
 *  under a strategy is laid out on one of its ranks (grid, schedule, stages,
 *  owned layers, buckets, the sharding of the flat buffers), computed before
 *  anything is allocated, with no MPI. */
#include <telar/comm/process_grid.hpp>
#include <telar/core/parameters.hpp>
#include <telar/core/sequential.hpp>
#include <telar/core/shape.hpp>
#include <telar/parallel/detail/plan_model_states.hpp>
#include <telar/parallel/detail/run_layout_detail.hpp>
#include <telar/parallel/layout_options.hpp>
#include <telar/parallel/strategy.hpp>
#include <telar/schedule/schedule.hpp>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace telar {

/*! \brief One rank's layout of a run: everything about where the model's
 *  layers, micro-batches and flat buffers go that follows from the model's
 *  sizes, the strategy type, the telar::LayoutOptions, the world size and
 *  the rank. A plain value: the Trainer builds its components from it
 *  (Trainer::run_layout()), telar::plan_memory sizes it, a planner computes
 *  one per candidate layout and rank (telar::make_run_layout). */
struct RunLayout {
  GridShape grid{1, 1, 1};                   //!< degrees dp x pp x tp (dp resolved)
  GridOrder grid_order = default_grid_order; //!< rank layout, outermost axis first
  int rank = 0;                              //!< the rank laid out
  GridCoord coords{};                        //!< its coordinates in the grid
  /*! \brief The ZeRO stage in effect: the strategy's, except that ZeRO<1>
   *  and ZeRO<2> over one data-parallel rank are the plain store (0). */
  int zero_stage = 0;
  schedule::Schedule schedule; //!< the validated schedule every step runs
  /*! \brief Per-sample shapes along the model as this rank sees them (its
   *  tensor-parallel shard): entry k is layer k's input, the last the output. */
  std::vector<Shape> shapes;
  /*! \brief Layer boundaries of the virtual pipeline stages (p*v + 1 values). */
  std::vector<std::size_t> stage_bounds;
  std::vector<bool> owned; //!< owned[k]: layer k runs (and keeps its parameters) here
  /*! \brief Parameter elements of each owned layer with parameters, tensors
   *  padded as the ParameterStore lays them out, in backward order. */
  std::vector<std::size_t> layer_elements;
  /*! \brief Data-parallel gradient buckets (and ZeRO-3's gather groups):
   *  elements of each, whole layers, in backward order. */
  std::vector<std::size_t> bucket_groups;
  std::size_t parameter_elements = 0; //!< the flat store: the sum of layer_elements
  /*! \brief The flat store with the sharding's padding (a multiple of dp
   *  times the alignment when sharded). */
  std::size_t padded_elements = 0;
  /*! \brief Elements of the flat buffers this rank keeps a shard of
   *  (optimizer state; ZeRO-2 gradients; ZeRO-3 values and gradients). */
  std::size_t shard_elements = 0;
  /*! \brief What the layout could not know (layers without parameter_count(),
   *  counted 0). */
  std::vector<std::string> warnings;

  /*! \brief Ranks of the run. */
  int world_size() const { return grid.dp * grid.pp * grid.tp; }
  /*! \brief Whether each rank keeps a shard of the flat buffers (ZeRO). */
  bool sharded() const { return zero_stage > 0; }
  /*! \brief [begin, end) of the flat store whose optimizer state this rank
   *  keeps and updates (the whole store without sharding). */
  std::pair<std::size_t, std::size_t> shard_range() const {
    std::size_t const b = sharded() ? std::size_t(coords.dp) * shard_elements : 0;
    return {b, b + shard_elements};
  }
  /*! \brief This rank's virtual pipeline stages, chunk by chunk. */
  std::vector<int> virtual_stages() const {
    std::vector<int> out;
    for (int c = 0; c < schedule.chunks; ++c)
      out.push_back(schedule.virtual_stage(coords.pp, c));
    return out;
  }
  /*! \brief Indices of the layers this rank runs, in model order. */
  std::vector<std::size_t> owned_layers() const {
    std::vector<std::size_t> out;
    for (std::size_t k = 0; k < owned.size(); ++k)
      if (owned[k])
        out.push_back(k);
    return out;
  }
};

namespace detail {

// The layout of `rank` from a model already built for it (`shapes` its
// per-sample shapes, layout_shapes()) and the degrees `grid` (layout_grid()),
// at ZeRO stage `stage` (the strategy's, or one the memory budget tries).
// `api` names the caller in errors.
template <class StrategyT, class Model>
RunLayout run_layout_of(Model const& model, std::vector<Shape> shapes, LayoutOptions const& options,
                        GridShape grid, int rank, int stage, char const* api) {
  using T = typename Model::value_type;
  using Store = ParameterStore<T, typename Model::memory_space>;
  RunLayout l;
  l.grid = grid;
  l.grid_order = options.grid_order;
  l.rank = rank;
  l.coords = ProcessGrid::coords_in(grid, options.grid_order, rank);
  l.shapes = std::move(shapes);
  l.schedule = layout_schedule<StrategyT>(options, grid.pp, api);
  l.stage_bounds =
      layout_stage_bounds(model, l.shapes, std::size_t(l.schedule.virtual_stages()), options);
  l.owned = layout_owned(l.schedule, l.stage_bounds, l.coords.pp, model.layer_count());
  l.layer_elements = layout_layer_elements(model, l.owned, Store::alignment, l.warnings);
  l.bucket_groups = layout_groups(l.layer_elements, options.bucket_bytes / sizeof(T));
  for (std::size_t n : l.layer_elements)
    l.parameter_elements += n;
  FlatShard const f = flat_shard(l.parameter_elements, Store::alignment, grid.dp, stage);
  l.zero_stage = f.sharded ? stage : 0;
  l.padded_elements = f.padded;
  l.shard_elements = f.shard;
  return l;
}

} // namespace detail

/*! \brief The layout of rank \p rank of a run of \p world_size ranks, as a
 *  telar::Trainer of \p model under \p StrategyT with \p options would lay
 *  it out (the Trainer calls the same code). Pure: no MPI, no Kokkos
 *  allocation; a planner calls it for every candidate layout and rank.
 *  \code
 *  telar::LayoutOptions opts;
 *  opts.grid = {2, 2, 1};
 *  opts.microbatches = 4;
 *  for (int r = 0; r < 4; ++r) {
 *    telar::RunLayout l = telar::make_run_layout<Strategy>(model, opts, telar::Shape{784}, 4, r);
 *    // l.stage_bounds, l.owned_layers(), l.schedule, l.bucket_groups, l.shard_range() ...
 *  }
 *  \endcode
 *  \tparam StrategyT a telar::Strategy
 *  \tparam Model a telar::Sequential (or DynamicSequential, DynamicGraph)
 *  \param model the model (not initialised; copied, not changed)
 *  \param options the layout settings (a telar::TrainerOptions is one)
 *  \param in per-sample input shape \param world_size ranks of the run
 *  \param rank the rank to lay out, in [0, world_size)
 *  \throws GridError when the degrees do not fit the world; Error when
 *  \p rank is not one of its ranks, or when the degrees
 *  need a policy the strategy lacks, or the schedule or the stage
 *  boundaries do not fit; ScheduleError for an invalid custom schedule;
 *  ShapeError when the model's shapes do not chain */
template <class StrategyT, class Model>
RunLayout make_run_layout(Model model, LayoutOptions const& options, Shape const& in,
                          int world_size, int rank) {
  static_assert(is_strategy_v<StrategyT>,
                "telar::make_run_layout: StrategyT must be a telar::Strategy<...>");
  char const* const api = "telar::make_run_layout";
  detail::check_layout_options<StrategyT>(options, api);
  GridShape const grid = detail::layout_grid<StrategyT>(options, world_size);
  if (rank < 0 || rank >= world_size)
    throw Error(std::string(api) + ": rank " + std::to_string(rank) + " is not in [0, " +
                std::to_string(world_size) + ")");
  GridCoord const at = ProcessGrid::coords_in(grid, options.grid_order, rank);
  std::vector<Shape> shapes = detail::layout_shapes<StrategyT>(model, grid, at, in);
  return detail::run_layout_of<StrategyT>(model, std::move(shapes), options, grid, rank,
                                          detail::strategy_zero_stage<StrategyT>(), api);
}

} // namespace telar
