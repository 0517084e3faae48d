#pragma once
/*! \file
 *  \brief telar::Trainer: trains a model with a strategy and an optimizer. */
#include <telar/comm/bf16_wire.hpp>
#include <telar/comm/communicator.hpp>
#include <telar/comm/process_grid.hpp>
#include <telar/core/detail/zeroed_grads.hpp>
#include <telar/core/loss.hpp>
#include <telar/core/parameters.hpp>
#include <telar/core/sequential.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/dropout.hpp>
#include <telar/layers/softmax_cross_entropy.hpp>
#include <telar/optim/detail/engine.hpp>
#include <telar/optim/lr_schedule.hpp>
#include <telar/optim/optimizer.hpp>
#include <telar/parallel/data_parallel.hpp>
#include <telar/parallel/detail/bf16_weights.hpp>
#include <telar/parallel/detail/gradient_sync.hpp>
#include <telar/parallel/detail/nonfinite.hpp>
#include <telar/parallel/detail/partition.hpp>
#include <telar/parallel/detail/pipeline_executor.hpp>
#include <telar/parallel/detail/residency.hpp>
#include <telar/parallel/detail/step_hooks.hpp>
#include <telar/parallel/detail/tensor_index.hpp>
#include <telar/parallel/memory_plan.hpp>
#include <telar/parallel/precision.hpp>
#include <telar/parallel/run_layout.hpp>
#include <telar/parallel/strategy.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/profile/detail/region.hpp>
#include <telar/profile/gather.hpp>
#include <telar/profile/memory.hpp>
#include <telar/profile/trace.hpp>
#include <telar/schedule/generators.hpp>
#include <telar/schedule/timeline.hpp>
#include <telar/schedule/validate.hpp>
#include <telar/train/options.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace telar {

namespace detail {
// io/detail/trainer_access.hpp: a checkpoint's restore sets the optimizer's
// shard, its state and the step counts (everything else io/ reads through
// the public accessors).
struct TrainerAccess;
} // namespace detail

/*! \brief What one training step (or an evaluation) reports, over all ranks. */
struct StepResult {
  double loss = 0;           //!< mean loss over the loss terms of the global batch
  double accuracy = 0;       //!< fraction of the terms predicted correctly (if has_accuracy)
  bool has_accuracy = false; //!< the loss defines accuracy (telar::loss_traits)
  long long samples = 0;     //!< samples in the global batch
  double seconds = 0;        //!< wall time of the step on this rank
  double lr = 0;             //!< learning rate used
  /*! \brief The loss or a gradient was not finite and the update was
   *  skipped (TrainerOptions::nonfinite = NonFinite::skip). */
  bool skipped = false;
};

/*! \brief Trains a telar::Sequential under a strategy with an optimizer.
 *
 *  \code
 *  using Model = telar::Sequential<telar::Dense<float>, telar::ReLU<float>, telar::Dense<float>>;
 *  using Strategy = telar::Strategy<telar::DataParallel<>,
 * telar::PipelineParallel<telar::OneFOneB>>; telar::TrainerOptions opts; opts.grid = {0, 2, 1}; //
 * dp from the world size, pp = 2, tp = 1 opts.microbatches = 8; telar::Trainer<Model, Strategy,
 * telar::AdamW<float>> trainer( comm, Model(telar::Dense<float>(784, 256), {},
 * telar::Dense<float>(256, 10)), telar::AdamW<float>{}, opts, 784); for (...) trainer.step(x, y);
 * // this data-parallel rank's share of the batch \endcode
 *
 *  Every rank of the communicator constructs the Trainer and calls step()
 *  with its data-parallel share of the global batch (the same share on the
 *  ranks of one pipeline / tensor-parallel group). The gradient is that of
 *  the mean loss over the global batch, so every strategy trains to the
 *  serial result.
 *  \tparam Model a telar::Sequential
 *  \tparam StrategyT a telar::Strategy
 *  \tparam Optimizer a type satisfying the Optimizer concept
 *  \tparam Loss a type satisfying the Loss concept (telar/core/loss.hpp);
 *  step() takes its target_type
 */
template <class UserModel, class StrategyT, class Optimizer,
          class Loss =
              SoftmaxCrossEntropy<typename UserModel::value_type, typename UserModel::memory_space>>
class Trainer {
  static_assert(is_sequential_v<UserModel>,
                "telar::Trainer: Model must be a telar::Sequential<...> or DynamicSequential<...>");
  static_assert(is_strategy_v<StrategyT>,
                "telar::Trainer: Strategy must be a telar::Strategy<...>");
  // The strategy's precision policy: the model the Trainer runs is the one
  // it is given, rebound to the compute type's GEMM / convolution policies
  // (telar/parallel/precision.hpp).
  using PrecisionPolicy = detail::strategy_precision_t<StrategyT>;
  using Model = WithPrecision<UserModel, PrecisionPolicy>;
  static_assert(detail::check_optimizer<Optimizer>());
  static_assert(std::is_same_v<typename Optimizer::value_type, typename Model::value_type>,
                "telar::Trainer: the optimizer's value_type must be the model's value_type");
  static_assert(detail::check_loss<Loss>());
  static_assert(std::is_same_v<typename Loss::value_type, typename Model::value_type> &&
                    std::is_same_v<typename Loss::memory_space, typename Model::memory_space>,
                "telar::Trainer: the loss's value_type and memory_space must be the model's");

public:
  /*! \brief Scalar type. */
  using value_type = typename Model::value_type;
  /*! \brief Memory space of parameters and activations. */
  using memory_space = typename Model::memory_space;
  /*! \brief Execution space of the model's kernels. */
  using execution_space = typename Model::execution_space;
  /*! \brief The strategy. */
  using strategy_type = StrategyT;
  /*! \brief The loss. */
  using loss_type = Loss;
  /*! \brief What step() and evaluate() take as targets. */
  using target_type = typename Loss::target_type;
  /*! \brief The optimizer. */
  using optimizer_type = Optimizer;

  /*! \brief A trainer over the ranks of \p comm (collective).
   *  \param comm the application's communicator (duplicated, never used directly)
   *  \param model the model (layers configured, parameters not yet drawn)
   *  \param optimizer the optimizer and its hyper-parameters
   *  \param options run-time settings
   *  \param in_shape per-sample input shape (a feature count, or e.g. {1, 28, 28})
   *  \param loss the loss
   *  \throws GridError or Error, identically on every rank, when the degrees
   *  do not fit the world or the strategy; ShapeError naming the layer when
   *  the model's shapes do not chain */
  Trainer(MPI_Comm comm, UserModel model, Optimizer optimizer, TrainerOptions options,
          Shape in_shape, Loss loss = Loss{})
      : model_(detail::precision_model<UserModel, PrecisionPolicy>::convert(std::move(model))),
        options_(std::move(options)), trace_(options_.trace), loss_(std::move(loss)) {
    world_.emplace(comm, "telar::world");
    setup(optimizer, in_shape);
  }

  /*! \brief A trainer on this process alone (serial strategies; MPI need not
   *  be initialised). \param model the model \param optimizer the optimizer
   *  \param options run-time settings \param in_shape per-sample input shape
   *  \param loss the loss */
  Trainer(UserModel model, Optimizer optimizer, TrainerOptions options, Shape in_shape,
          Loss loss = Loss{})
      : model_(detail::precision_model<UserModel, PrecisionPolicy>::convert(std::move(model))),
        options_(std::move(options)), trace_(options_.trace), loss_(std::move(loss)) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized)
      world_.emplace(MPI_COMM_SELF, "telar::self");
    setup(optimizer, in_shape);
  }

  // The executor points at model_: a Trainer stays where it was built.
  Trainer(Trainer const&) = delete;
  Trainer& operator=(Trainer const&) = delete;
  /*! \brief Stops tracking this trainer's memory peaks. */
  ~Trainer() { MemoryMeter::instance().stop_tracking(tracker_); }

  /*! \brief One optimizer step on this rank's share of the global batch.
   *  \param x inputs [local batch, in_shape.size()] \param y targets, first
   *  extent the local batch \return loss (and accuracy) over the global batch */
  StepResult step(ConstMatrix<value_type, memory_space> x, target_type const& y) {
    detail::ScopedRegion region("telar::Trainer::step");
    MemoryMeter::Scope scope(MemoryCategory::workspace);
    auto const t0 = std::chrono::steady_clock::now();
    double const tr0 = trace_.now();
    std::size_t const n = x.extent(0);
    check_batch(x, y);
    execution_space exec;
    params_.zero_grads(exec);
    // Dropout masks keyed by (step, global sample): the same in every layout.
    set_random_position(model_, std::uint64_t(step_), std::uint64_t(layout_.coords.dp) * n);
    value_type const scale = value_type(1) / value_type(global_count(exec, y, n));
    LossSum local;
    {
      detail::ScopedRegion phase("telar::Trainer::step::forward_backward");
      auto const weights = bf16_weights_.use(params_);
      detail::ZeroedGradsScope const zeroed(params_.grads().data(), params_.grads().size());
      local = executor_.run(
          exec, layout_.schedule, x, y, loss_, scale,
          detail::StepHooks<Residency, Sync, execution_space>(residency_, sync_, exec), &trace_);
    }
    if (grid_) // running statistics equal on every replica (see average_buffers)
      average_buffers(model_, DataParallelContext(grid_->dp()));
    StepResult r;
    r.lr = options_.lr(step_ + 1);
    r.skipped = update(exec, r.lr, local);
    fill_result(r, local);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    trace_.add("step " + std::to_string(step_), "step", tr0, trace_.now(), 2);
    return r;
  }

  /*! \brief Targets that are not the loss's target_type: a compile-time
   *  error naming the loss, its target_type and the targets' type (rather
   *  than a failed conversion). \param x inputs \param y targets */
  template <class Targets,
            std::enable_if_t<!std::is_convertible_v<Targets const&, target_type>, int> = 0>
  StepResult step(ConstMatrix<value_type, memory_space> x, Targets const& y) {
    static_assert(detail::check_targets<Loss, Targets>());
    return (void)x, (void)y, StepResult{};
  }
  /*! \brief As step(): targets that are not the loss's target_type do not
   *  compile. \param x inputs \param y targets \param chunk samples per pass */
  template <class Targets,
            std::enable_if_t<!std::is_convertible_v<Targets const&, target_type>, int> = 0>
  StepResult evaluate(ConstMatrix<value_type, memory_space> x, Targets const& y,
                      std::size_t chunk = 1000) {
    static_assert(detail::check_targets<Loss, Targets>());
    return (void)x, (void)y, (void)chunk, StepResult{};
  }

  /*! \brief Mean loss (and accuracy) of the model on a data set
   *  (collective; each data-parallel group evaluates its share).
   *  \param x inputs [n, in_shape.size()] (the whole set, on every rank)
   *  \param y targets, first extent n \param chunk samples per forward pass */
  StepResult evaluate(ConstMatrix<value_type, memory_space> x, target_type const& y,
                      std::size_t chunk = 1000) {
    detail::ScopedRegion region("telar::Trainer::evaluate");
    MemoryMeter::Scope scope(MemoryCategory::workspace);
    // memory() is the training steps': evaluation's chunks are not counted,
    // and its slots are freed after (the next step sizes them again).
    MemoryMeter::instance().set_tracking(tracker_, false);
    struct Resume {
      Trainer* t;
      ~Resume() {
        t->executor_.clear_slots();
        MemoryMeter::instance().set_tracking(t->tracker_, true);
      }
    } resume{this};
    auto const t0 = std::chrono::steady_clock::now();
    execution_space exec;
    std::size_t const n = x.extent(0), dp = std::size_t(dp_size()),
                      d = std::size_t(layout_.coords.dp);
    std::size_t const b0 = n * d / dp, e0 = n * (d + 1) / dp;
    // Every rank holds the whole set: the same verdict everywhere, no message.
    if constexpr (loss_traits<Loss>::has_invalid_targets)
      if (long long const bad = loss_.invalid_targets(exec, y, layout_.shapes.back()))
        throw ShapeError("telar::Trainer::evaluate: " + std::to_string(bad) + " of " +
                         std::to_string(y.size()) + " targets are " +
                         loss_.invalid_targets_what(layout_.shapes.back()));
    LossSum local;
    auto const weights = bf16_weights_.use(params_);
    set_training(model_, false); // dropout off while evaluating
    // Every rank runs the same number of chunks, so pipeline ranks pair up.
    std::size_t const per = (n + dp - 1) / dp;
    for (std::size_t b = 0; b < per; b += chunk) {
      std::size_t const lo = std::min(e0, b0 + b), hi = std::min(e0, b0 + b + chunk);
      if (lo == hi) { // the same on every rank of a pipeline: they skip together
        gather_without_compute();
        continue;
      }
      local += executor_.evaluate(exec, rows(x, lo, hi), target_type(rows(y, lo, hi)), loss_,
                                  detail::ResidencyHooks<Residency>(residency_));
    }
    set_training(model_, true);
    StepResult r;
    fill_result(r, reduce_loss(local));
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

  /*! \brief L2 norm of all parameters of the model (collective; the same on
   *  every rank, whatever the strategy). */
  double param_l2() {
    double s = 0;
    for (double v : tensor_sq_norms())
      s += v;
    return std::sqrt(s);
  }

  /*! \brief L2 norm of every parameter tensor of the model, by name
   *  ("layer0.weight", ...), combined over pipeline stages and tensor-parallel
   *  shards (collective). */
  std::map<std::string, double> tensor_norms() {
    auto sq = tensor_sq_norms();
    std::map<std::string, double> out;
    for (std::size_t i = 0; i < tensors_.names().size(); ++i)
      out[tensors_.names()[i]] = std::sqrt(sq[i]);
    return out;
  }

  /*! \brief This rank's parameters, flattened in model order (padding removed), on the host
   *  (collective over the data-parallel group under ZeRO-3, which gathers them). */
  std::vector<value_type> parameters() const {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, full_values());
    std::vector<value_type> out;
    for (auto const& p : params_.entries())
      out.insert(out.end(), h.data() + p.offset, h.data() + p.offset + p.size);
    return out;
  }

  /*! \brief The model (this rank's layers bound to the trainer's buffers); under
   *  telar::Precision<telar::bf16, float>, the given model rebound (telar::WithPrecision). */
  Model& model() { return model_; }
  /*! \brief This rank's flat parameter store (layout only, no values, under ZeRO-3). */
  ParameterStore<value_type, memory_space> const& parameter_store() const { return params_; }
  /*! \brief Steps taken (skipped ones included). */
  long long steps() const { return step_; }
  /*! \brief Steps whose update was skipped for a loss or gradient that was
   *  not finite (TrainerOptions::nonfinite = NonFinite::skip). */
  long long skipped_steps() const { return skipped_; }
  /*! \brief Options in use. */
  TrainerOptions const& options() const { return options_; }
  /*! \brief Values per sample along the model (this rank's view under tensor parallelism). */
  std::vector<std::size_t> const& feature_sizes() const { return features_; }
  /*! \brief Per-sample shapes along the model: entry k is layer k's input. */
  std::vector<Shape> const& shapes() const { return layout_.shapes; }
  /*! \brief The loss. */
  Loss const& loss() const { return loss_; }
  /*! \brief The schedule run by every step (validated). */
  schedule::Schedule const& pipeline_schedule() const { return layout_.schedule; }
  /*! \brief Layer boundaries of the virtual pipeline stages. */
  std::vector<std::size_t> const& stage_boundaries() const { return layout_.stage_bounds; }
  /*! \brief Degrees in use. */
  GridShape grid_shape() const { return layout_.grid; }
  /*! \brief This rank's coordinates in the grid. */
  GridCoord grid_coords() const { return layout_.coords; }
  /*! \brief This rank's layout (grid, schedule, stages, owned layers,
   *  buckets, sharding): the value every component was built from, equal to
   *  telar::make_run_layout() for this rank. */
  RunLayout const& run_layout() const { return layout_; }
  /*! \brief Names of the model's parameter tensors ("layer0.weight", ...),
   *  the same list on every rank (index order of the optimizer's tensors). */
  std::vector<std::string> const& tensor_names() const { return tensors_.names(); }
  /*! \brief [begin, end) of the flat parameter store whose values and
   *  optimizer state this rank updates (all of it without ZeRO). */
  std::pair<std::size_t, std::size_t> optimizer_shard() const { return sync_.shard(); }
  /*! \brief Rank in the trainer's communicator. */
  int rank() const { return world_ ? world_->rank() : 0; }
  /*! \brief Ranks in the trainer's communicator. */
  int size() const { return world_ ? world_->size() : 1; }
  /*! \brief The parallelism actually in use, e.g. "dp+pp" or "serial"
   *  (policies at degree 1 are not counted). */
  std::string strategy_name() const {
    std::string n;
    auto add = [&](int degree, char const* s) {
      if (degree > 1)
        n += (n.empty() ? "" : "+") + std::string(s);
    };
    add(layout_.grid.dp, "dp");
    add(layout_.grid.pp, "pp");
    add(layout_.grid.tp, "tp");
    return n.empty() ? "serial" : n;
  }
  /*! \brief e.g. "dp=2 x pp=1 x tp=1". */
  std::string layout() const { return ProcessGrid::describe(layout_.grid); }
  /*! \brief Data-parallel gradient buckets on this rank. */
  std::size_t bucket_count() const { return sync_.bucket_count(); }
  /*! \brief Timeline of the steps so far (TrainerOptions::trace). */
  TraceRecorder const& trace() const { return trace_; }
  /*! \brief Writes every rank's timeline (TrainerOptions::trace) into one
   *  Chrome trace file on rank 0, one process row per rank (collective).
   *  \param path output file \return true on rank 0 when written, true elsewhere */
  bool write_trace(std::string const& path) const {
    return gather_chrome_trace(world_ ? &*world_ : nullptr, trace_, path);
  }
  /*! \brief The measured pipeline timeline (TrainerOptions::trace) of the
   *  last step, or of every step so far, gathered from the ranks of this
   *  rank's pipeline (collective over the pipeline group); times in seconds
   *  from a common origin. Feed it to schedule::analyze() or
   *  schedule::write_svg().
   *
   *  Events, as in schedule::simulate(): Forward (on the last virtual stage
   *  including the loss), Backward or BackwardInput and BackwardWeight, the
   *  OptimizerStep; SendActivation / SendGrad spanning the posting of a
   *  message; and for each RecvActivation / RecvGrad two events: its posting
   *  and, where the data is used, the time the rank waited for (and, with
   *  MPI over shared memory, copied) the message.
   *  \param last_step_only only the last step */
  schedule::Timeline pipeline_timeline(bool last_step_only = true) const {
    auto const& events = executor_.events();
    std::size_t const begin = last_step_only ? executor_.last_step_begin() : 0;
    return gather_timeline(grid_ ? &grid_->pp() : nullptr,
                           std::vector<schedule::Event>(events.begin() + long(begin), events.end()),
                           layout_.schedule.name + " (measured)", layout_.schedule.stages);
  }
  /*! \brief Forgets the recorded timelines (e.g. after warm-up steps). */
  void clear_trace() {
    trace_.clear();
    executor_.clear_events();
  }
  /*! \brief Measured peak bytes per category on this rank over the
   *  training steps since the end of construction (the steady state;
   *  evaluate() is not counted). */
  MemoryBytes memory() const { return MemoryMeter::instance().peaks(tracker_); }
  /*! \brief Measured peak bytes per category during construction (layers'
   *  own parameter buffers exist there next to the flat store). */
  MemoryBytes memory_at_construction() const { return construction_peak_; }
  /*! \brief This rank's predicted peak bytes per category (telar::plan_memory). */
  MemoryPlan const& memory_plan() const { return plan_; }

  /*! \brief The process grid (absent for a trainer without MPI). */
  ProcessGrid const* grid() const { return grid_ ? &*grid_ : nullptr; }

private:
  friend struct detail::TrainerAccess;
  using DataParallelPolicy = std::conditional_t<StrategyT::has_data_parallel,
                                                typename StrategyT::data_parallel, DataParallel<>>;
  // Gradients reduced in bf16 (Precision<..., bf16>): the strategy's
  // allreduce sent as bf16, or under ZeRO its reduce-scatters
  // (SyncContext::bf16_gradients).
  static_assert(!PrecisionPolicy::bf16_reduce || std::is_same_v<value_type, float>,
                "telar::Trainer: gradients reduced in bf16 (telar::Precision<C, float, "
                "telar::bf16>) need float parameters");
  using Allreduce =
      std::conditional_t<PrecisionPolicy::bf16_reduce && DataParallelPolicy::sharding::stage == 0,
                         Bf16Wire<typename DataParallelPolicy::algorithm>,
                         typename DataParallelPolicy::algorithm>;
  // The gradient-sync component of the strategy's sharding policy
  // (parallel/detail/sync_*.hpp).
  using Sync = detail::GradientSync<typename DataParallelPolicy::sharding, value_type, memory_space,
                                    Allreduce>;
  // Where the parameter values live (parallel/detail/residency_*.hpp).
  using ResidencyOf =
      detail::residency_of<typename DataParallelPolicy::sharding, value_type, memory_space>;
  using Residency = typename ResidencyOf::type;

  int dp_size() const { return layout_.grid.dp; }
  std::string where() const {
    return size() > 1 ? "rank " + std::to_string(rank()) + ": " : std::string();
  }

  // Agrees before any collective: a bad batch on one rank stops every rank.
  void check_batch(ConstMatrix<value_type, memory_space> x, target_type const& y) {
    std::size_t const n = x.extent(0), m = std::size_t(layout_.schedule.microbatches);
    std::string bad;
    if (y.extent(0) != n)
      bad = std::to_string(n) + " inputs but " + std::to_string(y.extent(0)) + " targets";
    else if (n < m)
      bad = "a batch of " + std::to_string(n) + " samples cannot be split into " +
            std::to_string(m) + " micro-batches";
    else if (x.extent(1) != features_.front())
      bad = "inputs have " + std::to_string(x.extent(1)) +
            " values per sample, the model expects " + layout_.shapes.front().str() + " = " +
            std::to_string(features_.front());
    else
      bad = refuse_micro_batch(n / m); // the smallest micro-batch
    // One message: [ranks rejecting their batch, invalid targets, targets],
    // the targets counted where the loss is (once per data-parallel share).
    double v[3] = {bad.empty() ? 0.0 : 1.0, 0.0, 0.0};
    if constexpr (loss_traits<Loss>::has_invalid_targets)
      if (bad.empty() && executor_.has_last_stage() && layout_.coords.tp == 0) {
        v[1] = double(loss_.invalid_targets(execution_space(), y, layout_.shapes.back()));
        v[2] = double(y.size());
      }
    if (world_ && world_->size() > 1)
      world_->allreduce(v, 3);
    if (!bad.empty())
      throw ShapeError("telar::Trainer::step: " + where() + bad);
    if (v[0] > 0)
      throw ShapeError("telar::Trainer::step: " + where() +
                       "another rank's batch was rejected (see its message)");
    if constexpr (loss_traits<Loss>::has_invalid_targets)
      if (v[1] > 0)
        throw ShapeError("telar::Trainer::step: step " + std::to_string(step_ + 1) + ": " +
                         std::to_string((long long)v[1]) + " of " +
                         std::to_string((long long)v[2]) + " targets in the global batch are " +
                         loss_.invalid_targets_what(layout_.shapes.back()));
  }

  // Layers whose training needs several samples per micro-batch (BatchNorm's
  // statistics) refuse too few in the model's shape pass, told the size
  // first: "" if the shapes hold for micro-batches of `samples`, else the
  // message naming the layer (its node and position), the size and its
  // shapes. Every rank holds the whole model, so every rank finds the same.
  std::string refuse_micro_batch(std::size_t samples) {
    if (samples == micro_samples_)
      return {};
    set_training_batch(model_, samples);
    try {
      (void)model_.output_shape(layout_.shapes.front());
    } catch (ShapeError const& e) {
      set_training_batch(model_, micro_samples_); // the accepted size again
      return "micro-batches of " + std::to_string(samples) + " sample(s): " + e.what();
    }
    micro_samples_ = samples;
    return {};
  }
  // With TrainerOptions::batch_size, the micro-batches are known before any
  // step: refuse them here rather than in the first forward.
  void check_micro_batches() {
    std::size_t const m = std::size_t(layout_.schedule.microbatches);
    std::size_t const local = options_.batch_size / std::size_t(dp_size());
    if (local < m)
      return; // unknown (0) or refused by the step's own check
    std::string const bad = refuse_micro_batch(local / m);
    if (!bad.empty())
      throw ShapeError("telar::Trainer: " + where() + bad);
  }

  // The constructor's phases, in order; each names what it builds.
  void setup(Optimizer const& optimizer, Shape const& in_shape) {
    detail::ScopedRegion region("telar::Trainer::Trainer");
    MemoryMeter& meter = MemoryMeter::instance();
    MemoryMeter::Scope scope(MemoryCategory::workspace);
    struct Tracking { // stops even when a phase throws
      int id;
      ~Tracking() { MemoryMeter::instance().stop_tracking(id); }
    } const construction{meter.start_tracking()};
    detail::check_layout_options<StrategyT>(options_, "telar::Trainer");
    build_grid();
    start_clock();
    plan_layout(build_shapes(in_shape));
    check_micro_batches();
    check_memory_budget(in_shape);
    build_executor();
    bind_parameters();
    build_optimizer(optimizer);
    construction_peak_ = meter.peaks(construction.id);
    tracker_ = meter.start_tracking();
  }

  // This rank's plan: its layout, sized. With a budget, every rank plans
  // every rank (no message needed, so every rank decides alike) and refuses
  // the layout if the worst one is over, naming the cheapest layout that fits.
  void check_memory_budget(Shape const& in_shape) {
    plan_ = detail::plan_of_layout<Model, StrategyT, Optimizer, Loss>(model_, layout_, options_);
    if (options_.memory_budget == 0)
      return;
    MemoryPlan const worst = detail::plan_worst<Model, StrategyT, Optimizer, Loss>(
        model_, options_, in_shape, layout_.grid, detail::strategy_zero_stage<StrategyT>());
    if (worst.bytes.total() <= options_.memory_budget)
      return;
    MemoryPlan smallest;
    MemoryPlan const fits = detail::plan_fitting<Model, StrategyT, Optimizer, Loss>(
        model_, options_, in_shape, layout_.grid, options_.memory_budget, smallest);
    throw MemoryError(
        detail::budget_message(worst, options_.memory_budget, fits, smallest, size()));
  }

  // The degrees (a policy the strategy lacks has degree 1) and the process
  // grid's sub-communicators, which the layers' shapes need next. A rank
  // order left at the default follows the nodes (ProcessGrid::node_aware_order:
  // unchanged on one node); every later phase reads options_.grid_order, and
  // the memory plan options_.ranks_per_node.
  void build_grid() {
    layout_.grid = detail::layout_grid<StrategyT>(options_, size());
    if (!world_)
      return;
    NodeLayout const nodes = node_layout(*world_);
    if (options_.ranks_per_node == 0 && nodes.regular() && nodes.nodes > 1)
      options_.ranks_per_node = nodes.ranks_per_node;
    if (options_.grid_order == default_grid_order)
      options_.grid_order = ProcessGrid::node_aware_order(layout_.grid, nodes);
    grid_.emplace(*world_, layout_.grid, options_.grid_order);
  }

  // Everything about where layers, micro-batches and buffers go (schedule,
  // stage bounds, owned layers, buckets, sharding): one pure function, the
  // one the memory plan and make_run_layout() call.
  void plan_layout(std::vector<Shape> shapes) {
    layout_ = detail::run_layout_of<StrategyT>(model_, std::move(shapes), options_, layout_.grid,
                                               rank(), detail::strategy_zero_stage<StrategyT>(),
                                               "telar::Trainer");
    GridCoord const c = grid_ ? grid_->coords() : layout_.coords;
    if (c.dp != layout_.coords.dp || c.pp != layout_.coords.pp || c.tp != layout_.coords.tp)
      throw Error("telar::Trainer: rank " + std::to_string(rank()) +
                  ": the process grid's coordinates differ from the layout's (a bug)");
  }

  // A common time origin for every rank's timeline.
  void start_clock() {
    if (world_)
      world_->barrier();
    trace_.reset_origin();
  }

  // Per-sample shapes along the model; tensor-parallel layers learn their
  // shard first, the loss its input shape after.
  std::vector<Shape> build_shapes(Shape const& in_shape) {
    if constexpr (StrategyT::has_tensor_parallel)
      if (grid_)
        set_tensor_parallel(
            model_,
            TensorParallelContext(grid_->tp(), typename StrategyT::tensor_parallel::algorithm{}));
    if (grid_) // layers reducing over the replicas inside forward (SyncStats)
      set_data_parallel(model_, DataParallelContext(grid_->dp()));
    std::vector<Shape> shapes = model_.build(in_shape);
    features_.clear();
    for (Shape const& sh : shapes)
      features_.push_back(sh.size());
    if constexpr (loss_traits<Loss>::has_build)
      loss_.build(shapes.back());
    return shapes;
  }

  void build_executor() {
    executor_ = detail::PipelineExecutor<Model>(&model_, features_, layout_.stage_bounds,
                                                layout_.schedule.stages, layout_.schedule.chunks,
                                                layout_.coords.pp, grid_ ? &grid_->pp() : nullptr);
  }

  // Draws this rank's layers and hands them to the gradient-sync component,
  // which chooses where parameters and gradients live.
  void bind_parameters() {
    std::vector<bool> const& owned = layout_.owned;
    MemoryMeter::Scope layers_own(MemoryCategory::parameters); // until the store takes over
    detail::SyncContext ctx;
    if (grid_) {
      ctx.dp = &grid_->dp();
      ctx.world = &grid_->world();
      ctx.mp = &grid_->mp();
    }
    ctx.bucket_bytes = options_.bucket_bytes;
    ctx.shared_memory = options_.shared_memory;
    ctx.trace = &trace_;
    ctx.bf16_gathers = PrecisionPolicy::bf16_compute;
    ctx.bf16_gradients = PrecisionPolicy::bf16_reduce;
    // The residency draws the layers (one at a time: the same values as all
    // at once) and, under ZeRO-3, lays the store out around its value shard;
    // the sync then binds the rest.
    residency_ = ResidencyOf::make(ctx);
    residency_.bind(model_, owned, params_,
                    [this](std::size_t k) { model_.initialize(options_.seed, k, k + 1); });
    sync_ = Sync(ctx);
    sync_.bind(model_, owned, params_);
    set_parameter_replicas(model_, params_, layout_.grid.tp);
    tensors_.build(model_, params_, sync_.shard());
    bf16_weights_.bind(params_, detail::keeps_bf16_copy<StrategyT, value_type, memory_space>(
                                    options_, layout_.zero_stage));
  }

  void build_optimizer(Optimizer const& optimizer) {
    engine_ = detail::OptimizerEngine<Optimizer, memory_space>(optimizer, tensors_.shard_size());
  }

  // Sums doubles over the ranks that hold different parameters (pipeline
  // stages and tensor shards of one data-parallel replica).
  void reduce_model_parallel(double* v, std::size_t n) const {
    if (grid_ && grid_->mp().size() > 1)
      grid_->mp().allreduce(v, n);
  }

  // An evaluation chunk with no sample here: the other data-parallel ranks
  // still gather the sharded parameters (collectives), so take part in the
  // same gathers, in the executor's order (chunks, then layers).
  void gather_without_compute() {
    if (!residency_.sharded())
      return;
    detail::ResidencyHooks<Residency> hooks(residency_);
    hooks.step_begin(1);
    for (std::size_t k : layout_.owned_layers()) // chunks in order, then layers
      hooks.before_forward(k);
    hooks.step_end();
  }

  // What the optimizer updates: this rank's shard of the values.
  Vector<value_type, memory_space> optimizer_values() const {
    return residency_.optimizer_values(sync_, params_);
  }

  // Every value of this rank's layers, flat (ZeRO-3: all-gathered over the
  // data-parallel group, a collective).
  Vector<value_type, memory_space> full_values() const {
    return residency_.full_values(execution_space(), params_);
  }

  // Per-tensor squared norms (by TensorIndex id), the same on every rank:
  // the residency knows where the values live (ZeRO-3: the shards, summed
  // over the world; else the store, summed over the model-parallel ranks).
  std::vector<double> tensor_sq_norms() {
    execution_space exec;
    return residency_.sq_norms(tensors_, engine_, exec, params_, sync_,
                               [this](double* v, std::size_t n) { reduce_model_parallel(v, n); });
  }

  // `extra`, if given, is summed over every rank in the same message.
  LossSum reduce_loss(LossSum local, double* extra = nullptr) const {
    // The last stage's tensor-parallel ranks hold the same loss: count one.
    bool const counts = executor_.has_last_stage() && layout_.coords.tp == 0;
    double v[5] = {counts ? local.loss : 0.0, counts ? double(local.correct) : 0.0,
                   counts ? double(local.samples) : 0.0, counts ? double(local.count) : 0.0,
                   extra ? *extra : 0.0};
    int const n = extra ? 5 : 4;
    if (world_ && world_->size() > 1)
      world_->allreduce(v, n);
    if (extra)
      *extra = v[4];
    LossSum out;
    out.loss = v[0];
    out.correct = static_cast<long long>(v[1]);
    out.samples = static_cast<long long>(v[2]);
    out.count = static_cast<long long>(v[3]);
    return out;
  }

  static void fill_result(StepResult& r, LossSum const& total) {
    r.loss = total.count ? total.loss / double(total.count) : 0;
    r.has_accuracy = loss_traits<Loss>::has_accuracy;
    r.accuracy = total.count && r.has_accuracy ? double(total.correct) / double(total.count) : 0;
    r.samples = total.samples;
  }

  // Loss terms in the global batch: the gradient is that of their mean. A
  // loss that counts its own terms (an ignore index) is summed over the
  // data-parallel group; otherwise every rank has n samples.
  double global_count(execution_space const& exec, target_type const& y, std::size_t n) const {
    if constexpr (loss_traits<Loss>::has_count) {
      (void)n;
      double c = double(loss_count(loss_, exec, y));
      if (grid_ && grid_->dp().size() > 1)
        grid_->dp().allreduce(&c, 1);
      return c > 0 ? c : 1.0;
    } else {
      (void)exec, (void)y;
      return double(n) * double(dp_size());
    }
  }

  // The optimizer's part of the step: the summed gradient of this rank's
  // shard, the loss reduced (in: this rank's, out: the global batch's) with
  // the shard's non-finite count, the update unless that skips it, the
  // parameters back on every rank; timed as the schedule's OptimizerStep.
  // Returns true when the update was skipped.
  bool update(execution_space const& exec, double lr, LossSum& loss) {
    double const t0 = trace_.now();
    {
      detail::ScopedRegion phase("telar::Trainer::step::reduce_gradients");
      sync_.reduce(exec, params_);
    }
    auto const grads = sync_.grads(params_);
    double bad = detail::count_nonfinite(exec, grads, 0, tensors_.shard_size());
    {
      detail::ScopedRegion phase("telar::Trainer::step::reduce_loss");
      loss = reduce_loss(loss, &bad);
    }
    double const t_update = trace_.now();
    // Throws before counting the step under NonFinite::stop.
    bool const skip = detail::skip_nonfinite(
        options_.nonfinite, step_ + 1, loss.count ? loss.loss / double(loss.count) : loss.loss, bad,
        exec, grads, tensors_, [this](double* v, std::size_t n) { sync_.sum_norms(v, n); });
    ++step_;
    skipped_ += skip ? 1 : 0;
    StepInfo<value_type> info;
    info.lr = value_type(lr);
    info.step = step_ - skipped_; // the optimizer's own count: skipped steps do not age it
    if (!skip) {
      detail::ScopedRegion phase("telar::Trainer::step::optimizer");
      MemoryMeter::Scope state(MemoryCategory::optimizer_state);
      engine_.step(exec, optimizer_values(), sync_.grads(params_), tensors_.shard().segments,
                   tensors_.shard().tensor_ids, tensors_.names().size(), info,
                   options_.clip_grad_norm,
                   [this](double* v, std::size_t n) { sync_.sum_norms(v, n); });
      exec.fence();
    }
    {
      detail::ScopedRegion phase("telar::Trainer::step::publish_parameters");
      sync_.publish(exec, params_);
    }
    double const t1 = trace_.now();
    trace_.add("optimizer", "optimizer", t_update, t1);
    if (trace_.enabled())
      executor_.add_event({layout_.coords.pp, schedule::Op::OptimizerStep, -1, 0, t0, t1});
    return skip;
  }

  MemoryMeterInstall meter_install_; // first: sees every allocation, removed last
  Model model_;
  TrainerOptions options_;
  TraceRecorder trace_;
  std::optional<Communicator> world_;
  std::optional<ProcessGrid> grid_;
  RunLayout layout_; // built once (plan_layout); every component reads it
  std::vector<std::size_t> features_;
  std::size_t micro_samples_ = 0; // the micro-batch size the shape pass accepted (0: none yet)
  detail::PipelineExecutor<Model> executor_;
  ParameterStore<value_type, memory_space> params_;
  Residency residency_;
  Sync sync_;
  detail::Bf16Weights<value_type, memory_space> bf16_weights_; // bf16 compute: rounded once a step
  detail::OptimizerEngine<Optimizer, memory_space> engine_;
  Loss loss_;
  detail::TensorIndex tensors_;
  long long step_ = 0;
  long long skipped_ = 0;
  MemoryPlan plan_;
  MemoryBytes construction_peak_;
  int tracker_ = -1;
};

} // namespace telar
