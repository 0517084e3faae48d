#pragma once
/*! \file
 *  \brief telar::SlabDataParallel: a telar::SlabGraph's parameters drawn,
 *  its gradients averaged over the data-parallel group and its parameters
 *  updated by an optimizer, with or without ZeRO sharding, by the
 *  Trainer's own components (store, residency, gradient sync, optimizer
 *  engine).
 *
 *  The graph's parameters are replicated over its spatial group, and each
 *  rank's backward computes what its slab contributes to their gradients.
 *  Given the run's world (SlabDataParallelOptions::world) with sp > 1, the
 *  update sums those parts together with the data-parallel average, in
 *  one reduction over every rank (dp x sp; the graph's
 *  set_partial_gradients): the gradient's mean over dp is 1/dp of the sum
 *  over the world, ZeRO shards over dp x sp ranks, and no layer waits for
 *  its own allreduce over sp. Without a world (or with sum_over_world off)
 *  each wrapper sums its gradients over sp as backward runs and the sync
 *  runs over dp, each spatial position the same. Either way:
 *  telar::NoSharding allreduces buckets while backward runs, telar::ZeRO<1>
 *  reduces each rank's shard after backward, updates it and all-gathers the
 *  parameters, telar::ZeRO<2> reduce-scatters group by group during
 *  backward (no rank holds the whole gradient), telar::ZeRO<3> keeps only
 *  this rank's shard of the values too and gathers each group of nodes
 *  before it runs. The graph is bound into one flat telar::ParameterStore
 *  (node i as layer i).
 *  \code
 *  using S = telar::Strategy<telar::DataParallel<telar::TopologyAwareAllreduce, telar::ZeRO<1>>,
 *                            telar::SpatialParallel>;
 *  telar::GridShape split;
 *  split.sp = 2;                               // dp x sp, dp from the world
 *  telar::ProcessGrid grid(world, split);
 *  auto graph = telar::spatial_unet<float>(grid.sp(), unet_options);
 *  graph.build(shape);
 *  telar::SlabDataParallel<Graph, S> update(graph, grid, seed, telar::Adam<float>{});
 *  for (...) {
 *    auto const& y = update.forward(exec, x);       // ZeRO-3: gathers
 *    update.backward(exec, dy);                      // dy: the local batch's mean
 *    update.step(exec, lr);                          // averaged over dp, updated
 *  }
 *  \endcode
 *  telar::save_checkpoint and telar::load_checkpoint (io/checkpoint.hpp)
 *  take a SlabDataParallel as they take a telar::Trainer: every tensor whole
 *  in the file, loadable under any dp x sp and ZeRO stage.
 */
#include <telar/comm/communicator.hpp>
#include <telar/comm/process_grid.hpp>
#include <telar/core/error.hpp>
#include <telar/core/parameters.hpp>
#include <telar/optim/adam.hpp>
#include <telar/optim/detail/engine.hpp>
#include <telar/optim/nonfinite.hpp>
#include <telar/parallel/detail/gradient_sync.hpp>
#include <telar/parallel/detail/nonfinite.hpp>
#include <telar/parallel/detail/residency.hpp>
#include <telar/parallel/detail/step_hooks.hpp>
#include <telar/parallel/detail/tensor_index.hpp>
#include <telar/parallel/strategy.hpp>
#include <telar/profile/memory.hpp>
#include <telar/profile/trace.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace telar {

/*! \brief How telar::SlabDataParallel communicates. */
struct SlabDataParallelOptions {
  std::size_t bucket_bytes = std::size_t(8) << 20; //!< allreduce buckets and ZeRO-2 groups
  bool shared_memory = true;      //!< ZeRO-1 may sum through MPI-3 shared memory on one node
  TraceRecorder* trace = nullptr; //!< buckets, shard reductions and gathers as spans (or none)
  /*! \brief Every rank of the run (dp x sp, its size checked), where
   *  telar::save_checkpoint and telar::load_checkpoint write and read
   *  together and, with sum_over_world, the gradients are reduced; null:
   *  the dp group, enough when sp = 1. Not owned. */
  Communicator const* world = nullptr;
  /*! \brief With a world and sp > 1: the slabs' parts of the gradients
   *  summed with the dp average in one reduction over the world (ZeRO
   *  shards over dp x sp); false: each wrapper sums its own over sp, one
   *  blocking allreduce per layer, and the sync runs over dp. */
  bool sum_over_world = true;
  /*! \brief Clip the global gradient norm (of the mean over dp) to this
   *  before the update (0: off), as TrainerOptions::clip_grad_norm. */
  double clip_grad_norm = 0;
  /*! \brief A step with a gradient that is not finite: stop (throw
   *  telar::NonFiniteError naming the step and the first such tensor, the
   *  same on every rank) or skip its update, as TrainerOptions::nonfinite. */
  NonFinite nonfinite = NonFinite::stop;
};

namespace detail {
struct SlabView; // io/detail/slab_view.hpp: what checkpoints read and restore

// SlabDataParallel's DP argument: a DataParallel policy (spatial
// parallelism assumed, as the graph says), or a Strategy of DataParallel
// and SpatialParallel (a grid with sp > 1 needs the latter).
template <class DP>
struct slab_policies {
  static_assert(is_data_parallel_v<DP>,
                "telar::SlabDataParallel: DP is a telar::DataParallel<Algorithm, Sharding> or a "
                "telar::Strategy of one and telar::SpatialParallel");
  using data_parallel = DP;
  static constexpr bool spatial = true;
  static std::string name() { return DP::name(); }
};
template <class... Ps>
struct slab_policies<Strategy<Ps...>> {
  using S = Strategy<Ps...>;
  static_assert(S::has_data_parallel,
                "telar::SlabDataParallel: the strategy needs a telar::DataParallel<> (with its "
                "sharding), even at dp = 1");
  static_assert(!S::has_pipeline_parallel && !S::has_tensor_parallel,
                "telar::SlabDataParallel: a SlabGraph trains on dp x sp; PipelineParallel and "
                "TensorParallel do not compose with SpatialParallel yet");
  // The graph's layers choose their GEMM and convolution kernels themselves;
  // a Precision here would be ignored without a word.
  static_assert(std::is_same_v<typename S::precision, Precision<float, float>>,
                "telar::SlabDataParallel: a SlabGraph computes in the precision of its layers' "
                "policies (telar::spatial_unet<T, M, telar::Bf16Gemm, telar::OneDnnConvBf16> for "
                "bf16), and its gradients are reduced in fp32; leave telar::Precision<> out of "
                "the strategy");
  using data_parallel = typename S::data_parallel;
  static constexpr bool spatial = S::has_spatial_parallel;
  static std::string name() { return data_parallel::name() + std::string(spatial ? "+sp" : ""); }
};
} // namespace detail

/*! \brief The data-parallel update of a telar::SlabGraph (see the file).
 *  \tparam Graph a built telar::SlabGraph
 *  \tparam DP telar::DataParallel<Algorithm, Sharding>, Sharding one of
 *  telar::NoSharding, telar::ZeRO<1>, telar::ZeRO<2>, telar::ZeRO<3, G>; or
 *  telar::Strategy<DataParallel<...>, SpatialParallel> (the strategy named
 *  in full: a grid with sp > 1 is refused without SpatialParallel)
 *  \tparam Optimizer an optimizer of the graph's value type (telar::Adam,
 *  telar::SGD, ...) */
template <class Graph, class DP = DataParallel<>,
          class Optimizer = Adam<typename Graph::value_type>>
class SlabDataParallel {
public:
  using value_type = typename Graph::value_type;                  //!< the graph's scalar
  using memory_space = typename Graph::memory_space;              //!< where its tensors live
  using execution_space = typename memory_space::execution_space; //!< what runs there
  using optimizer_type = Optimizer;                               //!< the optimizer
  using data_parallel = typename detail::slab_policies<DP>::data_parallel; //!< its policy
  using sharding = typename data_parallel::sharding;                       //!< the ZeRO policy

  /*! \brief Draws \p graph's parameters from \p seed (node i from seed +
   *  i, as SlabGraph::initialize; ZeRO-3: one node at a time, this rank
   *  keeping its shard) and binds them (collective over the world when
   *  it sums the gradients, else over \p dp).
   *  \param graph built; kept by reference \param dp the ranks holding the
   *  same spatial position of different samples (null or one rank: no
   *  communication; not owned) \param seed the same on every rank
   *  \param opt the optimizer \param options buckets, shared memory,
   *  trace, world, sum_over_world
   *  \throws Error when a world to sum over is not dp x sp ranks */
  SlabDataParallel(Graph& graph, Communicator const* dp, std::uint64_t seed, Optimizer opt = {},
                   SlabDataParallelOptions const& options = {})
      : graph_(graph), clip_(options.clip_grad_norm), nonfinite_(options.nonfinite),
        dp_size_(dp != nullptr ? dp->size() : 1), dp_rank_(dp != nullptr ? dp->rank() : 0),
        world_(run_world(options, graph, dp)), sync_group_(sync_group(options, graph, dp)) {
    detail::SyncContext ctx;
    ctx.dp = sync_group_;
    ctx.world = sync_group_; // its shards cover every tensor once
    ctx.bucket_bytes = options.bucket_bytes;
    ctx.shared_memory = options.shared_memory;
    ctx.trace = options.trace;
    std::vector<bool> const owned(graph.layer_count(), true);
    {
      MemoryMeter::Scope scope(MemoryCategory::parameters);
      residency_ = ResidencyOf::make(ctx);
      residency_.bind(graph_, owned, store_, [&](std::size_t k) { graph_.initialize(seed, k); });
      sync_ = Sync(ctx);
      sync_.bind(graph_, owned, store_);
    }
    tensors_.build(graph_, store_, sync_.shard());
    {
      MemoryMeter::Scope scope(MemoryCategory::optimizer_state);
      engine_ = detail::OptimizerEngine<Optimizer, memory_space>(opt, tensors_.shard_size());
    }
    graph_.set_partial_gradients(sums_over_world()); // last: nothing after it throws
  }
  /*! \brief As above, on a process grid of dp x sp ranks: its dp group
   *  averages, its world is the options' world (every rank of the run).
   *  \param graph built over \p grid's sp group; kept by reference
   *  \param grid dp x sp (pp = tp = 1), its sp the graph's spatial degree;
   *  must outlive this object \param seed the same on every rank
   *  \param opt the optimizer \param options as above (its world is the grid's)
   *  \throws Error naming the grid when it has pipeline or tensor ranks, or
   *  an sp other than the graph's */
  SlabDataParallel(Graph& graph, ProcessGrid const& grid, std::uint64_t seed, Optimizer opt = {},
                   SlabDataParallelOptions options = {})
      : SlabDataParallel(graph, &on_grid(grid, graph).dp(), seed, std::move(opt),
                         with_world(options, grid)) {}
  SlabDataParallel(SlabDataParallel const&) = delete;
  SlabDataParallel& operator=(SlabDataParallel const&) = delete;
  /*! \brief The graph's parameter views point into this object's flat
   *  buffers: they get memory of their own again, holding the current
   *  values (gradients zero), so the graph outlives its update. ZeRO-3
   *  holds shards only: the values of the last gather() (else zero). The
   *  wrappers sum their gradients over sp again. */
  ~SlabDataParallel() {
    graph_.set_partial_gradients(false);
    graph_.parameters([](char const* name, auto& value, auto& grad) {
      using V = std::decay_t<decltype(value)>;
      V const own(Kokkos::view_alloc(std::string(name)), value.layout());
      if (value.data() != nullptr)
        Kokkos::deep_copy(own, value);
      value = own;
      grad = V(Kokkos::view_alloc(std::string(name) + ".grad"), value.layout());
    });
  }

  /*! \brief The graph's forward on this rank's input slab \p x, a step's
   *  first half (ZeRO-3: each group of nodes gathered before it runs, the
   *  next one prefetched). \return the output slab */
  template <class Exec>
  Matrix<value_type, memory_space> const& forward(Exec const& exec,
                                                  ConstMatrix<value_type, memory_space> x) {
    Hooks<Exec> hooks(residency_, sync_, exec);
    hooks.step_begin(1);
    begun_ = true;
    gathered_ = Vector<value_type, memory_space>(); // ZeRO-3: groups rebound as nodes run
    return graph_.forward(exec, x, hooks);
  }
  /*! \brief The graph's backward on the output slab's gradient \p dy (this
   *  rank's batch; gradients accumulate), with the sync listening: buckets
   *  (ZeRO-2, -3: groups) are reduced as backward completes them. After
   *  forward(), or after the graph's own forward without ZeRO-3 (whose
   *  values only forward() gathers).
   *  \param exec execution space instance \param dy the output slab's gradient */
  template <class Exec>
  void backward(Exec const& exec, ConstMatrix<value_type, memory_space> dy) {
    if (!begun_ && residency_.sharded())
      throw Error("telar::SlabDataParallel: under ZeRO-3 the step's forward runs through "
                  "forward(), which gathers the parameters (not the graph's own)");
    Hooks<Exec> hooks(residency_, sync_, exec);
    if (!begun_)
      hooks.step_begin(1);
    graph_.backward(exec, dy, hooks);
    hooks.step_end();
    begun_ = false;
  }

  /*! \brief Every value back in the graph's views (collective over dp
   *  under ZeRO-3, which all-gathers the shards into a buffer of this
   *  object's, kept until the next forward() gathers groups again; nothing
   *  otherwise). Before evaluating the graph with its own forward, or
   *  reading its parameters, in a ZeRO-3 run. */
  template <class Exec>
  void gather(Exec const& exec) {
    if (!residency_.sharded())
      return;
    gathered_ = residency_.full_values(exec, store_);
    store_.rebind(graph_, 0, store_.size(), gathered_,
                  ParameterStore<value_type, memory_space>::Part::values);
  }

  /*! \brief The optimizer step at learning rate \p lr: this rank's shard of
   *  the gradients summed over the sync group (dp, or dp x sp when the
   *  slabs' parts are summed too) and divided by dp (the mean of the
   *  replicas' gradients), checked for values that are not finite, clipped
   *  (SlabDataParallelOptions::clip_grad_norm), updated, the parameters
   *  back on every rank, gradients zeroed. Collective over that group.
   *  \return true when the update was skipped (a gradient not finite under
   *  NonFinite::skip: parameters and optimizer state as they were)
   *  \throws NonFiniteError under NonFinite::stop, the same on every rank */
  template <class Exec>
  bool step(Exec const& exec, double lr) {
    sync_.reduce(exec, store_);
    auto const grads = sync_.grads(store_);
    value_type const mean = value_type(1) / value_type(dp_size_);
    if (dp_size_ > 1)
      Kokkos::parallel_for(
          "telar::SlabDataParallel::mean", Kokkos::RangePolicy<Exec>(exec, 0, grads.size()),
          KOKKOS_LAMBDA(std::size_t i) { grads(i) *= mean; });
    auto const sum_norms = [this](double* v, std::size_t n) { sync_.sum_norms(v, n); };
    bool const skip = skip_update(exec, grads, sum_norms);
    ++step_;
    skipped_ += skip ? 1 : 0;
    if (!skip) {
      StepInfo<value_type> info;
      info.lr = value_type(lr);
      info.step = step_ - skipped_; // the optimizer's own count: skipped steps do not age it
      MemoryMeter::Scope scope(MemoryCategory::optimizer_state);
      engine_.step(exec, residency_.optimizer_values(sync_, store_), grads,
                   tensors_.shard().segments, tensors_.shard().tensor_ids, tensors_.names().size(),
                   info, clip_, sum_norms);
    }
    sync_.publish(exec, store_);
    store_.zero_grads(exec);
    exec.fence();
    return skip;
  }

  /*! \brief [begin, end) of the flat parameters this rank's optimizer updates. */
  std::pair<std::size_t, std::size_t> shard() const { return sync_.shard(); }
  /*! \brief Length of the flat parameter buffer (padding included). */
  std::size_t size() const { return store_.size(); }
  /*! \brief Optimizer steps taken (a checkpoint's restore sets them). */
  long long steps() const { return step_; }
  /*! \brief Steps whose update was skipped (NonFinite::skip; checkpoints
   *  record them). */
  long long skipped_steps() const { return skipped_; }
  /*! \brief The graph whose parameters are bound. */
  Graph& graph() { return graph_; }
  /*! \brief Every rank of the run (SlabDataParallelOptions::world; the dp
   *  group when sp = 1 and none was given; null: unknown). */
  Communicator const* world() const { return world_; }
  /*! \brief This rank in world() (0 without one). */
  int rank() const { return world_ != nullptr ? world_->rank() : 0; }
  /*! \brief This rank's data-parallel replica. */
  int dp_rank() const { return dp_rank_; }
  /*! \brief Whether the slabs' gradient parts are summed with the dp
   *  average over the world (SlabDataParallelOptions::sum_over_world,
   *  given a world and sp > 1): ZeRO's shards then span dp x sp ranks. */
  bool sums_over_world() const {
    return sync_group_ != nullptr && sync_group_ == world_ && graph_.spatial_size() > 1;
  }
  /*! \brief Ranks the gradients are reduced over and ZeRO shards span (dp,
   *  or dp x sp when sums_over_world()). */
  int sync_size() const { return sync_group_ != nullptr ? sync_group_->size() : 1; }
  /*! \brief "dp=2 x sp=2" (checkpoints record it). */
  std::string layout() const {
    return "dp=" + std::to_string(dp_size_) + " x sp=" + std::to_string(graph_.spatial_size());
  }
  /*! \brief "slab " and the data-parallel policy's name ("slab dp+zero1"). */
  static std::string strategy_name() {
    return std::string("slab ") + detail::slab_policies<DP>::name();
  }
  /*! \brief Bytes this rank holds for training state: parameters (ZeRO-3:
   *  its shard), the gradient buffer (ZeRO-2, -3: its shard), the optimizer
   *  state of its shard. Not counted: the groups in flight (ZeRO-2, -3:
   *  gradients and gathered values, transients of a bucket's size); ZeRO-1
   *  through shared memory keeps one copy of the parameters per node, and
   *  this counts each rank's as whole (an upper bound). */
  std::size_t state_bytes() const {
    std::size_t const shard = sync_.shard().second - sync_.shard().first;
    bool const sharded = sync_size() > 1 || residency_.sharded();
    std::size_t const grads = sharding::stage >= 2 && sharded ? shard : store_.size();
    std::size_t const values = residency_.sharded() ? shard : store_.size();
    return sizeof(value_type) * (values + grads + shard * optimizer_traits<Optimizer>::state_size);
  }

private:
  friend struct detail::SlabView;
  // The grid, once its shape is what the graph was split for: dp x sp
  // (same message on every rank: the shape and the graph's split are).
  static ProcessGrid const& on_grid(ProcessGrid const& grid, Graph const& g) {
    GridShape const s = grid.shape();
    std::string const where = "telar::SlabDataParallel: the grid " + grid.name();
    if (s.pp != 1 || s.tp != 1)
      throw Error(where + " has pipeline or tensor-parallel ranks; a SlabGraph trains on dp x sp");
    if (s.sp > 1 && !detail::slab_policies<DP>::spatial)
      throw Error(where + " splits samples, but the strategy (" +
                  detail::slab_policies<DP>::name() +
                  ") has no SpatialParallel; add telar::SpatialParallel to the Strategy or set "
                  "sp=1");
    if (s.sp != g.spatial_size())
      throw Error(where + " splits each sample over sp=" + std::to_string(s.sp) +
                  " ranks, the graph over " + std::to_string(g.spatial_size()) +
                  " (build it over the grid's sp group)");
    return grid;
  }
  static SlabDataParallelOptions with_world(SlabDataParallelOptions o, ProcessGrid const& grid) {
    o.world = &grid.world();
    return o;
  }
  // Every rank of the run: the options' world, else dp when no rank splits
  // the graph (then dp is every rank there is).
  static Communicator const* run_world(SlabDataParallelOptions const& o, Graph const& g,
                                       Communicator const* dp) {
    if (o.world != nullptr)
      return o.world;
    return g.spatial_size() == 1 ? dp : nullptr;
  }
  // The ranks the gradients are reduced over: the world when it sums the
  // slabs' parts too (checked to be dp x sp: the same on every rank), else dp.
  static Communicator const* sync_group(SlabDataParallelOptions const& o, Graph const& g,
                                        Communicator const* dp) {
    if (!o.sum_over_world || o.world == nullptr || g.spatial_size() == 1)
      return dp;
    int const replicas = dp != nullptr ? dp->size() : 1;
    if (o.world->size() != replicas * g.spatial_size())
      throw Error("telar::SlabDataParallel: the world has " + std::to_string(o.world->size()) +
                  " ranks, not dp x sp = " + std::to_string(replicas) + " x " +
                  std::to_string(g.spatial_size()));
    return o.world;
  }
  // The verdict on this step's gradients (detail::skip_nonfinite): every
  // rank's count of values that are not finite in its shard, summed over
  // the sync group where ZeRO's shards differ (unsharded, every rank counts
  // the same reduced gradient: no message), so every rank decides alike.
  template <class Exec, class Grads, class Sum>
  bool skip_update(Exec const& exec, Grads const& grads, Sum const& sum_norms) {
    double bad = detail::count_nonfinite(exec, grads, 0, tensors_.shard_size());
    if (sharding::stage > 0 && sync_size() > 1)
      sync_group_->allreduce(&bad, 1);
    return detail::skip_nonfinite(
        nonfinite_, step_ + 1, 0.0, bad, exec, grads, tensors_, sum_norms,
        {"telar::SlabDataParallel::step", "SlabDataParallelOptions::nonfinite", false});
  }
  using Sync =
      detail::GradientSync<sharding, value_type, memory_space, typename data_parallel::algorithm>;
  using ResidencyOf = detail::residency_of<sharding, value_type, memory_space>;
  using Residency = typename ResidencyOf::type;
  template <class Exec>
  using Hooks = detail::StepHooks<Residency, Sync, Exec>;

  Graph& graph_;
  double clip_ = 0;
  NonFinite nonfinite_ = NonFinite::stop;
  int dp_size_ = 1, dp_rank_ = 0;
  Communicator const* world_ = nullptr;
  Communicator const* sync_group_ = nullptr; // dp, or the world (sums_over_world)
  ParameterStore<value_type, memory_space> store_;
  Residency residency_;
  Sync sync_;
  detail::TensorIndex tensors_;
  detail::OptimizerEngine<Optimizer, memory_space> engine_;
  long long step_ = 0, skipped_ = 0;
  bool begun_ = false;                        // forward() began this step
  Vector<value_type, memory_space> gathered_; // ZeRO-3: gather()'s values
};

} // namespace telar
