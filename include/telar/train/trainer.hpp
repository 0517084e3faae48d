#pragma once
/*! \file
 *  \brief telar::Trainer: trains a model with a strategy and an optimizer. */
#include <telar/core/parameters.hpp>
#include <telar/core/sequential.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/softmax_cross_entropy.hpp>
#include <telar/optim/detail/engine.hpp>
#include <telar/optim/lr_schedule.hpp>
#include <telar/optim/optimizer.hpp>
#include <telar/parallel/detail/stage_runner.hpp>
#include <telar/parallel/strategy.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace telar {

/*! \brief Run-time settings of a Trainer. */
struct TrainerOptions {
  std::uint64_t seed = 0;            //!< parameter initialisation seed
  LRSchedule lr = constant_lr(0.01); //!< learning rate per step
  double clip_grad_norm = 0;         //!< clip the global gradient norm to this (0: off)
  int microbatches = 1;              //!< micro-batches per step (gradient accumulation)
};

/*! \brief What one training step reports. */
struct StepResult {
  double loss = 0;       //!< mean loss over the global batch
  double accuracy = 0;   //!< fraction of the global batch classified correctly
  long long samples = 0; //!< samples in the global batch
  double seconds = 0;    //!< wall time of the step
  double lr = 0;         //!< learning rate used
};

/*! \brief Trains a telar::Sequential under a strategy with an optimizer.
 *
 *  \code
 *  using Model = telar::Sequential<telar::Dense<float>, telar::ReLU<float>, telar::Dense<float>>;
 *  telar::Trainer<Model, telar::Serial, telar::AdamW<float>> trainer(
 *      Model(telar::Dense<float>(784, 256), {}, telar::Dense<float>(256, 10)),
 *      telar::AdamW<float>{}, opts);
 *  for (...) trainer.step(x, y);   // x [batch, 784], y [batch]
 *  \endcode
 *  \tparam Model a telar::Sequential
 *  \tparam StrategyT a telar::Strategy
 *  \tparam Optimizer a type satisfying the Optimizer concept
 */
template <class Model, class StrategyT, class Optimizer>
class Trainer {
  static_assert(is_sequential_v<Model>, "telar::Trainer: Model must be a telar::Sequential<...>");
  static_assert(is_strategy_v<StrategyT>, "telar::Trainer: Strategy must be a telar::Strategy<...>");
  static_assert(detail::check_optimizer<Optimizer>());
  static_assert(std::is_same_v<typename Optimizer::value_type, typename Model::value_type>,
                "telar::Trainer: the optimizer's value_type must be the model's value_type");

public:
  /*! \brief Scalar type. */
  using value_type = typename Model::value_type;
  /*! \brief Memory space of parameters and activations. */
  using memory_space = typename Model::memory_space;
  /*! \brief Execution space of the model's kernels. */
  using execution_space = typename Model::execution_space;

  /*! \brief Initialises the model's parameters and binds them to flat buffers.
   *  \param model the model (layers configured, parameters not yet drawn)
   *  \param optimizer the optimizer and its hyper-parameters
   *  \param options run-time settings
   *  \param in_features features of one input sample */
  Trainer(Model model, Optimizer optimizer, TrainerOptions options, std::size_t in_features)
      : model_(std::move(model)), options_(std::move(options)) {
    if (options_.microbatches < 1)
      throw Error("telar::Trainer: microbatches must be at least 1, got " +
                  std::to_string(options_.microbatches));
    features_ = model_.feature_sizes(in_features);
    model_.initialize(options_.seed);
    params_.bind(model_, 0, Model::size);
    runner_ = detail::StageRunner<Model>(&model_, 0, Model::size, features_);
    engine_ = detail::OptimizerEngine<Optimizer, memory_space>(optimizer, params_.size());
    build_segments();
  }

  // The stage runner points at model_: a Trainer stays where it was built.
  Trainer(Trainer const&) = delete;
  Trainer& operator=(Trainer const&) = delete;

  /*! \brief One optimizer step on a batch.
   *  \param x inputs [batch, in_features] \param y labels [batch]
   *  \return the step's loss and accuracy */
  StepResult step(ConstMatrix<value_type, memory_space> x, Labels<memory_space> y) {
    auto const t0 = std::chrono::steady_clock::now();
    std::size_t const n = x.extent(0);
    if (y.extent(0) != n)
      throw ShapeError("telar::Trainer::step: " + std::to_string(n) + " inputs but " +
                       std::to_string(y.extent(0)) + " labels");
    std::size_t const m = std::size_t(options_.microbatches);
    if (n < m)
      throw ShapeError("telar::Trainer::step: a batch of " + std::to_string(n) +
                       " samples cannot be split into " + std::to_string(m) + " micro-batches");
    execution_space exec;
    params_.zero_grads(exec);
    LossSum total;
    value_type const scale = value_type(1) / value_type(n);
    for (std::size_t mb = 0; mb < m; ++mb) {
      std::size_t const b = n * mb / m, e = n * (mb + 1) / m;
      int const slot = runner_.acquire(e - b);
      runner_.forward(exec, slot, rows(x, b, e));
      LossSum ls = loss_.forward_backward(exec, ConstMatrix<value_type, memory_space>(runner_.output(slot)),
                                          Labels<memory_space>(rows(y, b, e)),
                                          runner_.output_grad(slot), scale);
      total.loss += ls.loss;
      total.correct += ls.correct;
      total.samples += ls.samples;
      runner_.backward(exec, slot, [](std::size_t) {});
      runner_.release(slot);
    }
    StepResult r;
    r.lr = options_.lr(step_ + 1);
    optimizer_step(exec, r.lr);
    exec.fence();
    r.loss = total.loss / double(total.samples);
    r.accuracy = double(total.correct) / double(total.samples);
    r.samples = total.samples;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

  /*! \brief Mean loss and accuracy of the model on a data set, in chunks.
   *  \param x inputs [n, in_features] \param y labels [n] \param chunk samples per forward */
  StepResult evaluate(ConstMatrix<value_type, memory_space> x, Labels<memory_space> y,
                      std::size_t chunk = 1000) {
    auto const t0 = std::chrono::steady_clock::now();
    execution_space exec;
    LossSum total;
    std::size_t const n = x.extent(0);
    for (std::size_t b = 0; b < n; b += chunk) {
      std::size_t const e = std::min(n, b + chunk);
      int const slot = runner_.acquire(e - b);
      runner_.forward(exec, slot, rows(x, b, e));
      LossSum ls = loss_.evaluate(exec, ConstMatrix<value_type, memory_space>(runner_.output(slot)),
                                  Labels<memory_space>(rows(y, b, e)));
      runner_.release(slot);
      total.loss += ls.loss;
      total.correct += ls.correct;
      total.samples += ls.samples;
    }
    StepResult r;
    r.loss = total.samples ? total.loss / double(total.samples) : 0;
    r.accuracy = total.samples ? double(total.correct) / double(total.samples) : 0;
    r.samples = total.samples;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

  /*! \brief L2 norm of all parameters. */
  double param_l2() const {
    auto v = params_.values();
    double s = 0;
    Kokkos::parallel_reduce(
        "telar::Trainer::param_l2", Kokkos::RangePolicy<execution_space>(0, v.extent(0)),
        KOKKOS_LAMBDA(std::size_t i, double& a) { a += double(v(i)) * double(v(i)); }, s);
    return std::sqrt(s);
  }

  /*! \brief All parameters, flattened in model order (padding removed), on the host. */
  std::vector<value_type> parameters() const {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, params_.values());
    std::vector<value_type> out;
    for (auto const& p : params_.entries())
      out.insert(out.end(), h.data() + p.offset, h.data() + p.offset + p.size);
    return out;
  }

  /*! \brief The model (parameters bound to the trainer's buffers). */
  Model& model() { return model_; }
  /*! \brief The flat parameter store. */
  ParameterStore<value_type, memory_space> const& parameter_store() const { return params_; }
  /*! \brief Steps taken. */
  long long steps() const { return step_; }
  /*! \brief Options in use. */
  TrainerOptions const& options() const { return options_; }
  /*! \brief Feature counts along the model. */
  std::vector<std::size_t> const& feature_sizes() const { return features_; }

private:
  void build_segments() {
    segments_.clear();
    tensor_ids_.clear();
    std::size_t id = 0;
    for (auto const& p : params_.entries()) {
      segments_.push_back({p.offset, p.size, p.replicas});
      tensor_ids_.push_back(id++);
    }
  }

  void optimizer_step(execution_space const& exec, double lr) {
    ++step_;
    StepInfo<value_type> info;
    info.lr = value_type(lr);
    info.step = step_;
    engine_.step(exec, params_.values(), params_.grads(), segments_, tensor_ids_,
                 segments_.size(), info, options_.clip_grad_norm, {});
  }

  Model model_;
  TrainerOptions options_;
  std::vector<std::size_t> features_;
  ParameterStore<value_type, memory_space> params_;
  detail::StageRunner<Model> runner_;
  detail::OptimizerEngine<Optimizer, memory_space> engine_;
  SoftmaxCrossEntropy<value_type, memory_space> loss_;
  std::vector<detail::TensorSegment> segments_;
  std::vector<std::size_t> tensor_ids_;
  long long step_ = 0;
};

} // namespace telar
