#pragma once
/*! \file
 *  \brief telar::SlabDataParallel: a telar::SlabGraph's gradients averaged
 *  over the data-parallel group and its parameters updated by an optimizer,
 *  with or without ZeRO sharding, by the Trainer's own components.
 *
 *  Every rank of a spatial group holds the whole sample's gradients (the
 *  wrappers sum them over the group), so the graph's parameters are
 *  replicated over sp and only the data-parallel ranks (one per spatial
 *  position, `dp`) differ. Each spatial position runs the same sync:
 *  telar::NoSharding allreduces buckets while backward runs, telar::ZeRO<1>
 *  reduces each rank's shard after backward, updates it and all-gathers the
 *  parameters, telar::ZeRO<2> reduce-scatters group by group during
 *  backward (no rank holds the whole gradient). The graph is bound into one
 *  flat telar::ParameterStore (node i as layer i).
 *  \code
 *  using DP = telar::DataParallel<telar::TopologyAwareAllreduce, telar::ZeRO<1>>;
 *  graph.build(shape);
 *  graph.initialize(seed);                          // the same on every rank
 *  telar::SlabDataParallel<Graph, DP> update(graph, &dp, telar::Adam<float>{});
 *  for (...) {
 *    auto const& y = graph.forward(exec, x);
 *    update.backward(exec, dy);                    // dy: the local batch's mean
 *    update.step(exec, lr);                         // averaged over dp, updated
 *  }
 *  \endcode
 *  ZeRO-3 (parameters gathered per node) is not offered: the graph's
 *  forward would need the gather hooks the pipeline executor calls.
 *  telar::save_checkpoint and telar::load_checkpoint (io/checkpoint.hpp)
 *  take a SlabDataParallel as they take a telar::Trainer: every tensor whole
 *  in the file, loadable under any dp x sp and ZeRO stage.
 */
#include <telar/comm/communicator.hpp>
#include <telar/core/parameters.hpp>
#include <telar/optim/adam.hpp>
#include <telar/optim/detail/engine.hpp>
#include <telar/parallel/detail/gradient_sync.hpp>
#include <telar/parallel/detail/residency_resident.hpp>
#include <telar/parallel/detail/step_hooks.hpp>
#include <telar/parallel/detail/tensor_index.hpp>
#include <telar/parallel/strategy.hpp>
#include <telar/profile/memory.hpp>
#include <telar/profile/trace.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
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
  /*! \brief Every rank of the run (dp x sp), where telar::save_checkpoint
   *  and telar::load_checkpoint write and read together; null: the dp
   *  group, enough when sp = 1. Not owned. */
  Communicator const* world = nullptr;
};

namespace detail {
struct SlabView; // io/detail/slab_view.hpp: what checkpoints read and restore
}

/*! \brief The data-parallel update of a telar::SlabGraph (see the file).
 *  \tparam Graph a built, initialized telar::SlabGraph
 *  \tparam DP telar::DataParallel<Algorithm, Sharding>, Sharding one of
 *  telar::NoSharding, telar::ZeRO<1>, telar::ZeRO<2>
 *  \tparam Optimizer an optimizer of the graph's value type (telar::Adam,
 *  telar::SGD, ...) */
template <class Graph, class DP = DataParallel<>,
          class Optimizer = Adam<typename Graph::value_type>>
class SlabDataParallel {
public:
  using value_type = typename Graph::value_type;
  using memory_space = typename Graph::memory_space;
  using execution_space = typename memory_space::execution_space;
  using optimizer_type = Optimizer;
  using sharding = typename DP::sharding;
  static_assert(sharding::stage <= 2,
                "telar::SlabDataParallel: ZeRO<3> gathers parameters before each layer runs; a "
                "SlabGraph offers no such hook yet: use NoSharding, ZeRO<1> or ZeRO<2>");

  /*! \brief Binds \p graph's parameters (collective over \p dp).
   *  \param graph built and initialized, the same values on every rank; kept
   *  by reference \param dp the ranks holding the same spatial position of
   *  different samples (null or one rank: no communication; not owned)
   *  \param opt the optimizer \param options buckets, shared memory, trace */
  SlabDataParallel(Graph& graph, Communicator const* dp, Optimizer opt = {},
                   SlabDataParallelOptions const& options = {})
      : graph_(graph), dp_size_(dp != nullptr ? dp->size() : 1),
        dp_rank_(dp != nullptr ? dp->rank() : 0), world_(options.world != nullptr    ? options.world
                                                         : graph.spatial_size() == 1 ? dp
                                                                                     : nullptr) {
    detail::SyncContext ctx;
    ctx.dp = dp;
    ctx.world = dp; // the shards of one spatial position cover every tensor once
    ctx.bucket_bytes = options.bucket_bytes;
    ctx.shared_memory = options.shared_memory;
    ctx.trace = options.trace;
    std::vector<bool> const owned(graph.layer_count(), true);
    {
      MemoryMeter::Scope scope(MemoryCategory::parameters);
      sync_ = Sync(ctx);
      sync_.bind(graph_, owned, store_);
    }
    tensors_.build(graph_, store_, sync_.shard());
    MemoryMeter::Scope scope(MemoryCategory::optimizer_state);
    engine_ = detail::OptimizerEngine<Optimizer, memory_space>(opt, tensors_.shard_size());
  }
  SlabDataParallel(SlabDataParallel const&) = delete;
  SlabDataParallel& operator=(SlabDataParallel const&) = delete;
  /*! \brief The graph's parameter views point into this object's flat
   *  buffers: they get memory of their own again, holding the current
   *  values (gradients zero), so the graph outlives its update. */
  ~SlabDataParallel() {
    graph_.parameters([](char const* name, auto& value, auto& grad) {
      using V = std::decay_t<decltype(value)>;
      V const own(Kokkos::view_alloc(std::string(name)), value.layout());
      if (value.data() != nullptr)
        Kokkos::deep_copy(own, value);
      value = own;
      grad = V(Kokkos::view_alloc(std::string(name) + ".grad"), value.layout());
    });
  }

  /*! \brief The graph's backward on the output slab's gradient \p dy (this
   *  rank's batch; gradients accumulate), with the sync listening: buckets
   *  (ZeRO-2: groups) are reduced as backward completes them.
   *  \param exec execution space instance \param dy the output slab's gradient */
  template <class Exec>
  void backward(Exec const& exec, ConstMatrix<value_type, memory_space> dy) {
    detail::StepHooks<Residency, Sync, Exec> hooks(residency_, sync_, exec);
    hooks.step_begin(1);
    graph_.backward(exec, dy, hooks);
    hooks.step_end();
  }

  /*! \brief The optimizer step at learning rate \p lr: this rank's shard of
   *  the gradients summed over dp and divided by dp (the mean of the
   *  replicas' gradients), updated, the parameters back on every rank,
   *  gradients zeroed. Collective over dp. */
  template <class Exec>
  void step(Exec const& exec, double lr) {
    sync_.reduce(exec, store_);
    auto const grads = sync_.grads(store_);
    value_type const mean = value_type(1) / value_type(dp_size_);
    if (dp_size_ > 1)
      Kokkos::parallel_for(
          "telar::SlabDataParallel::mean", Kokkos::RangePolicy<Exec>(exec, 0, grads.size()),
          KOKKOS_LAMBDA(std::size_t i) { grads(i) *= mean; });
    StepInfo<value_type> info;
    info.lr = value_type(lr);
    info.step = ++step_;
    {
      MemoryMeter::Scope scope(MemoryCategory::optimizer_state);
      engine_.step(exec, sync_.values(store_), grads, tensors_.shard().segments,
                   tensors_.shard().tensor_ids, tensors_.names().size(), info, 0,
                   [this](double* v, std::size_t n) { sync_.sum_norms(v, n); });
    }
    sync_.publish(exec, store_);
    store_.zero_grads(exec);
    exec.fence();
  }

  /*! \brief [begin, end) of the flat parameters this rank's optimizer updates. */
  std::pair<std::size_t, std::size_t> shard() const { return sync_.shard(); }
  /*! \brief Length of the flat parameter buffer (padding included). */
  std::size_t size() const { return store_.size(); }
  /*! \brief Optimizer steps taken (a checkpoint's restore sets them). */
  long long steps() const { return step_; }
  /*! \brief Steps whose update was skipped: none (the Trainer's NonFinite
   *  policy is not offered here; checkpoints record 0). */
  long long skipped_steps() const { return 0; }
  /*! \brief The graph whose parameters are bound. */
  Graph& graph() { return graph_; }
  /*! \brief Every rank of the run (SlabDataParallelOptions::world; the dp
   *  group when sp = 1 and none was given; null: unknown). */
  Communicator const* world() const { return world_; }
  /*! \brief This rank in world() (0 without one). */
  int rank() const { return world_ != nullptr ? world_->rank() : 0; }
  /*! \brief This rank's data-parallel replica. */
  int dp_rank() const { return dp_rank_; }
  /*! \brief "dp=2 x sp=2" (checkpoints record it). */
  std::string layout() const {
    return "dp=" + std::to_string(dp_size_) + " x sp=" + std::to_string(graph_.spatial_size());
  }
  /*! \brief "slab " and the data-parallel policy's name ("slab dp+zero1"). */
  static std::string strategy_name() { return std::string("slab ") + DP::name(); }
  /*! \brief Bytes this rank holds for training state: parameters, the
   *  gradient buffer (ZeRO-2: its shard; the groups in flight are
   *  activations-sized transients, not counted), the optimizer state of its
   *  shard. ZeRO-1 through shared memory keeps one copy of the parameters
   *  per node: this counts each rank's as whole (an upper bound). */
  std::size_t state_bytes() const {
    std::size_t const shard = sync_.shard().second - sync_.shard().first;
    std::size_t const grads = sharding::stage == 2 && dp_size_ > 1 ? shard : store_.size();
    return sizeof(value_type) *
           (store_.size() + grads + shard * optimizer_traits<Optimizer>::state_size);
  }

private:
  friend struct detail::SlabView;
  using Sync = detail::GradientSync<sharding, value_type, memory_space, typename DP::algorithm>;
  using Residency = detail::ResidentParameters<value_type, memory_space>;

  Graph& graph_;
  int dp_size_ = 1, dp_rank_ = 0;
  Communicator const* world_ = nullptr;
  ParameterStore<value_type, memory_space> store_;
  Residency residency_;
  Sync sync_;
  detail::TensorIndex tensors_;
  detail::OptimizerEngine<Optimizer, memory_space> engine_;
  long long step_ = 0;
};

} // namespace telar
