#pragma once
/*! \file
 *  \brief telar::BatchNorm (PyTorch's BatchNorm1d/2d/3d) with its statistics
 *  policy: telar::LocalStats or telar::SyncStats.
 *
 *  BatchNorm's statistics are over the batch, so they depend on how the batch
 *  is cut. With telar::LocalStats each rank normalises every micro-batch with
 *  that micro-batch's own mean and variance (what PyTorch DDP does): a
 *  data-parallel run then differs from the serial run, because each rank sees
 *  a smaller batch. With telar::SyncStats the per-channel sums are summed over
 *  the data-parallel group in forward and backward (PyTorch's SyncBatchNorm):
 *  a dp run with one micro-batch per rank equals the serial run with the whole
 *  batch. Micro-batches of one rank are still normalised one by one under
 *  both policies (as in PyTorch with gradient accumulation).
 *
 *  The running statistics are *buffers* (the Layer concept's buffers(f)):
 *  not trained, but checkpointed, gathered and kept identical on every
 *  data-parallel rank by telar::Trainer.
 */
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/detail/batch_norm.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace telar {

/*! \brief BatchNorm statistics per rank and micro-batch (PyTorch DDP's
 *  BatchNorm): no communication in forward or backward. */
struct LocalStats {
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "LocalStats"; }
};
/*! \brief BatchNorm statistics summed over the data-parallel group (PyTorch's
 *  SyncBatchNorm): the layer needs set_data_parallel(), which telar::Trainer
 *  calls. */
struct SyncStats {
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "SyncStats"; }
};
/*! \brief True for a BatchNorm statistics policy. \tparam S a type */
template <class S>
inline constexpr bool is_batch_norm_stats_v =
    std::is_same_v<S, LocalStats> || std::is_same_v<S, SyncStats>;

namespace detail {

// Sums per-channel host values over the group the statistics span: nothing
// for LocalStats; the data-parallel group for SyncStats.
template <class Stats>
class BatchNormGroup {
  static_assert(is_batch_norm_stats_v<Stats>,
                "telar::BatchNorm: Stats must be telar::LocalStats or telar::SyncStats");

protected:
  void sum(std::vector<double>&) const {}
  // Ranks whose values one channel's statistics span.
  std::size_t group_size() const { return 1; }
};

template <>
class BatchNormGroup<SyncStats> {
public:
  /*! \brief The data-parallel group the statistics are summed over (the
   *  Trainer calls it). \param ctx a telar::DataParallelContext (copied) */
  template <class Context>
  void set_data_parallel(Context const& ctx) {
    sum_ = [ctx](double* p, std::size_t n) { ctx.allreduce_sum(p, n); };
    group_ = std::size_t(ctx.size);
  }

protected:
  void sum(std::vector<double>& v) const {
    if (sum_)
      sum_(v.data(), v.size());
  }
  std::size_t group_size() const { return group_; }

private:
  // Type-erased so that layers/ needs no MPI; called on the host only.
  std::function<void(double*, std::size_t)> sum_;
  std::size_t group_ = 1;
};

} // namespace detail

/*! \brief Batch normalisation (Ioffe & Szegedy 2015; PyTorch's
 *  `nn.BatchNorm1d/2d/3d(channels, eps, momentum)`) over samples [C], [C, L],
 *  [C, H, W] or [C, D, H, W]: each channel is normalised with the mean and
 *  biased variance of its values over the batch (and the spatial extents),
 *  then y = gamma[c] * x_hat + beta[c].
 *
 *  Training (the default) uses the batch statistics and updates the running
 *  ones, running = (1 - momentum) running + momentum batch, with the
 *  *unbiased* batch variance as PyTorch; evaluation (telar::set_training(model,
 *  false), which Trainer::evaluate does) normalises with the running ones.
 *  Parameters "weight" (gamma, 1) and "bias" (beta, 0); buffers
 *  "running_mean" (0) and "running_var" (1). PyTorch's num_batches_tracked is
 *  only used for momentum = None (a cumulative average), which Telar does not
 *  offer; batches_tracked() counts the updates but is not a buffer.
 *
 *  Recomputation (telar::Recompute) replays forward: the layer exposes the
 *  number of training forwards as its random counter, and a replay (counter
 *  set back) does not update the running statistics a second time.
 *  \code
 *  telar::BatchNorm<float> bn(16);                       // [16, H, W], LocalStats
 *  telar::BatchNorm<float, telar::DefaultMemorySpace, telar::SyncStats> sbn(16);
 *  \endcode
 *  \tparam T value type \tparam MemorySpace memory space
 *  \tparam Stats telar::LocalStats or telar::SyncStats */
template <class T = float, class MemorySpace = DefaultMemorySpace, class Stats = LocalStats>
class BatchNorm : public detail::BatchNormGroup<Stats> {
public:
  /*! \brief Scalar type. */
  using value_type = T;
  /*! \brief Memory space of parameters and activations. */
  using memory_space = MemorySpace;
  /*! \brief The statistics policy. */
  using stats_policy = Stats;
  /*! \brief The output has the input's shape (lets Sequential see through it). */
  static constexpr bool preserves_shape = true;
  /*! \brief Backward reads the input (the saved view), never the output. */
  static constexpr BackwardReads backward_reads = BackwardReads::input;
  /*! \brief What backward needs from forward. */
  struct saved_type {
    ConstMatrix<T, MemorySpace> x; //!< the forward input
    Vector<T, MemorySpace> mean;   //!< per-channel mean used
    Vector<T, MemorySpace> rstd;   //!< per-channel 1 / sqrt(variance + eps) used
    double count = 0;              //!< values per channel in the statistics (0: running ones)
  };

  /*! \brief An empty layer; assign a configured one before use. */
  BatchNorm() = default;
  /*! \brief \param channels the first extent of the input \param eps added to the variance
   *  \param momentum weight of the batch in the running statistics, in [0, 1]
   *  \throws Error for 0 channels or a momentum outside [0, 1] */
  explicit BatchNorm(std::size_t channels, double eps = 1e-5, double momentum = 0.1)
      : channels_(channels), eps_(eps), momentum_(momentum) {
    if (channels == 0 || !(momentum >= 0.0 && momentum <= 1.0))
      throw Error("telar::BatchNorm: needs channels > 0 and momentum in [0, 1], got " +
                  std::to_string(channels) + " channels, momentum " + std::to_string(momentum));
  }

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "BatchNorm"; }
  /*! \brief The input's shape. \param in [channels, ...spatial], rank 1 to 4
   *  \throws ShapeError for another channel count, or in training when the
   *  micro-batch set by set_training_batch() gives each channel's statistics
   *  one value */
  Shape output_shape(Shape const& in) const {
    if (in.rank < 1 || in[0] != channels_)
      throw ShapeError("telar::BatchNorm(" + std::to_string(channels_) + ") expects inputs [" +
                       std::to_string(channels_) + ", ...spatial], got " + in.str());
    check_values_per_channel(in);
    return in;
  }
  /*! \brief Samples per micro-batch this rank will train with (0: unknown),
   *  so that output_shape() refuses, before any step, what forward would:
   *  batch statistics of one value per channel (telar::Trainer sets it
   *  through telar::set_training_batch). \param samples per micro-batch */
  void set_training_batch(std::size_t samples) { samples_ = samples; }
  /*! \brief Number of channels. */
  std::size_t channels() const { return channels_; }
  /*! \brief The variance offset. */
  double eps() const { return eps_; }
  /*! \brief Weight of a batch in the running statistics. */
  double momentum() const { return momentum_; }
  /*! \brief Cost estimate. \param samples rows \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    return 8.0 * double(samples) * double(in.size());
  }
  /*! \brief Values of gamma and beta. */
  std::size_t parameter_count() const { return 2 * channels_; }
  /*! \brief Values of the running statistics (buffers). */
  std::size_t buffer_count() const { return 2 * channels_; }
  /*! \brief Per-channel mean and 1/std. \param samples rows */
  std::size_t saved_bytes(std::size_t samples, Shape const&) const {
    return samples > 0 ? 2 * detail::view_bytes<T>(channels_) : 0;
  }
  /*! \brief The per-plane partial sums of \p samples samples and two
   *  per-channel sums, kept between calls. \param samples rows */
  std::size_t workspace_bytes(std::size_t samples, Shape const&) const {
    return samples > 0 ? detail::BatchNormScratch<T, MemorySpace>::bytes(samples, channels_) : 0;
  }

  /*! \brief Allocates gamma = 1, beta = 0, their gradients, running_mean = 0
   *  and running_var = 1. \param seed unused (the initial values are fixed) */
  void initialize(std::uint64_t seed) {
    (void)seed;
    weight = Vector<T, MemorySpace>("telar::BatchNorm::weight", channels_);
    weight_grad = Vector<T, MemorySpace>("telar::BatchNorm::weight_grad", channels_);
    bias = Vector<T, MemorySpace>("telar::BatchNorm::bias", channels_);
    bias_grad = Vector<T, MemorySpace>("telar::BatchNorm::bias_grad", channels_);
    running_mean = Vector<T, MemorySpace>("telar::BatchNorm::running_mean", channels_);
    running_var = Vector<T, MemorySpace>("telar::BatchNorm::running_var", channels_);
    Kokkos::deep_copy(weight, T(1));
    Kokkos::deep_copy(running_var, T(1));
  }
  /*! \brief Visits ("weight", gamma) and ("bias", beta).
   *  \param f callable as f(char const*, View&, View&) */
  template <class F>
  void parameters(F&& f) {
    f("weight", weight, weight_grad);
    f("bias", bias, bias_grad);
  }
  /*! \brief Visits the buffers ("running_mean", ...) and ("running_var", ...).
   *  \param f callable as f(char const*, View&) */
  template <class F>
  void buffers(F&& f) {
    f("running_mean", running_mean);
    f("running_var", running_var);
  }

  /*! \brief Training (batch statistics, running ones updated) or evaluation
   *  (running statistics). \param training on or off */
  void set_training(bool training) { training_ = training; }
  /*! \brief Whether the layer uses batch statistics. */
  bool training() const { return training_; }
  /*! \brief Training forwards run so far (PyTorch's num_batches_tracked),
   *  replays by telar::Recompute excluded. */
  std::uint64_t batches_tracked() const { return tracked_; }
  /*! \brief Recompute's counter: training forwards run, replays included. */
  std::uint64_t random_counter() const { return cursor_; }
  /*! \brief Sets Recompute's counter; below batches_tracked(), the forwards
   *  that follow are replays and leave the running statistics alone.
   *  \param c a value random_counter() returned */
  void set_random_counter(std::uint64_t c) { cursor_ = c; }

  /*! \brief y = gamma * (x - mean) / sqrt(var + eps) + beta per channel.
   *  \param exec execution space instance \param x input [n, channels * spatial]
   *  \param y output, as x \param saved keeps x and the statistics used
   *  \throws ShapeError for mismatched shapes, or in training with one value per channel */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type& saved) {
    check("forward", x.extent(0), x.extent(1), y.extent(0), y.extent(1));
    ensure(saved.mean, "telar::BatchNorm::mean");
    ensure(saved.rstd, "telar::BatchNorm::rstd");
    saved.x = x;
    if (training_)
      batch_stats(exec, x, saved);
    else
      detail::batch_norm_fixed_stats<Exec, T, MemorySpace>(exec, running_mean, running_var,
                                                           saved.mean, saved.rstd, T(eps_));
    if (!training_)
      saved.count = 0;
    detail::batch_norm_apply<Exec, T, MemorySpace>(exec, x, y, saved.mean, saved.rstd, weight, bias,
                                                   spatial(x.extent(1)));
  }
  /*! \brief dL/dx (through the batch statistics in training).
   *  \param exec execution space instance \param dy output gradient
   *  \param dx input gradient \param saved state of the matching forward */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      saved_type const& saved) const {
    check("backward_input", dy.extent(0), dy.extent(1), dx.extent(0), dx.extent(1));
    scratch_.prepare(exec, dy.extent(0), channels_);
    auto const a = scratch_.a, b = scratch_.b; // sum dy, sum dy x_hat
    if (saved.count > 0) { // batch statistics: their gradient too, over the group
      gradient_sums(exec, dy, saved, a, b);
      reduce(exec, a, b);
    }
    detail::batch_norm_backward_input<Exec, T, MemorySpace>(
        exec, dy, dx, saved.x, saved.mean, saved.rstd, weight, a, b,
        T(saved.count > 0 ? saved.count : 1), spatial(dy.extent(1)));
  }
  /*! \brief dgamma += sum dy x_hat, dbeta += sum dy over this rank's values
   *  (accumulates). \param exec execution space instance
   *  \param dy output gradient \param saved state of the matching forward */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<T, MemorySpace> dy,
                       saved_type const& saved) const {
    check("backward_weight", dy.extent(0), dy.extent(1), saved.x.extent(0), saved.x.extent(1));
    scratch_.prepare(exec, dy.extent(0), channels_);
    auto const a = scratch_.a, b = scratch_.b; // sum dy, sum dy x_hat
    gradient_sums(exec, dy, saved, a, b);
    detail::batch_norm_accumulate<Exec, T, MemorySpace>(exec, bias_grad, a);
    detail::batch_norm_accumulate<Exec, T, MemorySpace>(exec, weight_grad, b);
  }

  Vector<T, MemorySpace> weight;       //!< gamma [channels]
  Vector<T, MemorySpace> weight_grad;  //!< dL/dgamma
  Vector<T, MemorySpace> bias;         //!< beta [channels]
  Vector<T, MemorySpace> bias_grad;    //!< dL/dbeta
  Vector<T, MemorySpace> running_mean; //!< buffer: running mean [channels]
  Vector<T, MemorySpace> running_var;  //!< buffer: running unbiased variance [channels]

private:
  // Batch mean and 1/std over the group; updates the running statistics
  // unless this forward replays one (Recompute).
  template <class Exec>
  void batch_stats(Exec const& exec, ConstMatrix<T, MemorySpace> x, saved_type& saved) {
    detail::ChannelGeometry const g{channels_, spatial(x.extent(1)), x.extent(0)};
    scratch_.prepare(exec, x.extent(0), channels_);
    auto const sq = scratch_.a; // centred squares
    Vector<T, MemorySpace> mean = saved.mean;
    detail::batch_norm_sum<Exec, T, MemorySpace>(exec, x, g, scratch_.planes, mean);
    double const count = reduce(exec, mean, Vector<T, MemorySpace>(), double(g.count()));
    if (count < 2)
      throw ShapeError("telar::BatchNorm::forward: training needs more than 1 value per "
                       "channel, got input [" +
                       std::to_string(x.extent(0)) + ", " + std::to_string(x.extent(1)) + "] (" +
                       std::to_string(channels_) + " channels)");
    detail::batch_norm_scale<Exec, T, MemorySpace>(exec, mean, T(1 / count));
    detail::batch_norm_centred_squares<Exec, T, MemorySpace>(exec, x, g, scratch_.planes, mean, sq);
    reduce(exec, sq, Vector<T, MemorySpace>());
    detail::batch_norm_rstd<Exec, T, MemorySpace>(exec, sq, saved.rstd, T(count), T(eps_));
    saved.count = count;
    if (cursor_++ == tracked_) { // not a replay
      ++tracked_;
      detail::batch_norm_update_running<Exec, T, MemorySpace>(exec, running_mean, running_var, mean,
                                                              sq, T(count), T(momentum_));
    }
  }

  // a = sum dy, b = sum dy x_hat per channel, over this rank's values.
  template <class Exec>
  void gradient_sums(Exec const& exec, ConstMatrix<T, MemorySpace> dy, saved_type const& saved,
                     Vector<T, MemorySpace> a, Vector<T, MemorySpace> b) const {
    detail::ChannelGeometry const g{channels_, spatial(dy.extent(1)), dy.extent(0)};
    detail::batch_norm_gradient_sums<Exec, T, MemorySpace>(exec, dy, saved.x, saved.mean,
                                                           saved.rstd, g, scratch_.planes, a, b);
  }

  // Sums a (and b, if not empty) over the statistics' group and returns the
  // group's total of `count`; LocalStats: nothing moves.
  template <class Exec>
  double reduce(Exec const& exec, Vector<T, MemorySpace> a, Vector<T, MemorySpace> b,
                double count = 0) const {
    if constexpr (std::is_same_v<Stats, LocalStats>) {
      (void)exec, (void)a, (void)b;
      return count;
    } else {
      auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, a);
      auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, b);
      std::vector<double> v(ha.data(), ha.data() + ha.extent(0));
      v.insert(v.end(), hb.data(), hb.data() + hb.extent(0));
      v.push_back(count);
      this->sum(v);
      for (std::size_t c = 0; c < ha.extent(0); ++c)
        ha(c) = T(v[c]);
      for (std::size_t c = 0; c < hb.extent(0); ++c)
        hb(c) = T(v[ha.extent(0) + c]);
      Kokkos::deep_copy(exec, a, ha);
      Kokkos::deep_copy(exec, b, hb);
      exec.fence(); // the host copies go out of scope
      return v.back();
    }
  }

  void ensure(Vector<T, MemorySpace>& v, char const* label) const {
    if (v.extent(0) != channels_)
      v = Vector<T, MemorySpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), channels_);
  }
  std::size_t spatial(std::size_t sample) const { return sample / channels_; }
  // What PyTorch refuses too ("Expected more than 1 value per channel when
  // training"): the variance of one value is 0 and its gradient undefined.
  // SyncStats counts the values of every data-parallel rank.
  void check_values_per_channel(Shape const& in) const {
    std::size_t const per_sample = spatial(in.size()), group = this->group_size();
    std::size_t const values = samples_ * per_sample * group;
    if (!training_ || samples_ == 0 || values > 1)
      return;
    bool const sync = std::is_same_v<Stats, SyncStats>;
    throw ShapeError(
        "telar::BatchNorm(" + std::to_string(channels_) +
        "): expected more than 1 value per channel when training, got " + std::to_string(values) +
        " (micro-batches of " + std::to_string(samples_) + " sample(s) per rank x spatial size " +
        std::to_string(per_sample) +
        (sync ? " x " + std::to_string(group) + " data-parallel rank(s)" : std::string()) +
        ", input " + in.str() + ", " + Stats::name() + "): use more samples per micro-batch" +
        (sync ? "" : ", telar::SyncStats over data-parallel ranks") + " or evaluation mode");
  }
  void check(char const* what, std::size_t an, std::size_t ak, std::size_t bn,
             std::size_t bk) const {
    detail::check_channel_batches("telar::BatchNorm", what, channels_,
                                  weight.extent(0) == channels_, an, ak, bn, bk);
  }

  std::size_t channels_ = 0;
  double eps_ = 1e-5;
  double momentum_ = 0.1;
  bool training_ = true;
  std::size_t samples_ = 0;   // per micro-batch in training (0: unknown)
  std::uint64_t tracked_ = 0; // running-statistics updates
  std::uint64_t cursor_ = 0;  // training forwards, replays included
  // One call's sums (layers/detail/batch_norm.hpp): kept, so the plan counts them.
  mutable detail::BatchNormScratch<T, MemorySpace> scratch_;
};

} // namespace telar
