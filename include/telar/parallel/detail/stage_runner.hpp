#pragma once
// Runs a contiguous range of a Sequential's layers (a pipeline stage, or the
// whole model) for several micro-batches in flight. Each micro-batch in
// flight occupies a slot holding the activations its backward reads, its
// gradients at the stage's ends and every layer's saved state; activations no
// backward reads, and (when backward runs fused) the gradients between
// layers, live in buffers the slots share (activation_liveness.hpp); so do
// the like tensors inside its blocks, in a pool by nesting depth
// (core/detail/shared_pool.hpp). Slots keep their buffers between steps, so a
// steady-state step allocates nothing.
#include <telar/core/detail/activation_liveness.hpp>
#include <telar/core/detail/shared_pool.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/sequential.hpp>
#include <telar/core/tensor.hpp>
#include <telar/parallel/detail/step_hooks.hpp>
#include <telar/profile/memory.hpp>

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace telar::detail {

template <class Model>
class StageRunner {
public:
  using T = typename Model::value_type;
  using MemorySpace = typename Model::memory_space;
  using Mat = Matrix<T, MemorySpace>;
  using CMat = ConstMatrix<T, MemorySpace>;

  StageRunner() = default;
  // Layers [first, last) of `model`; features[k] is layer k's input size per
  // sample (Sequential::feature_sizes).
  StageRunner(Model* model, std::size_t first, std::size_t last, std::vector<std::size_t> features)
      : model_(model), first_(first), last_(last), features_(std::move(features)),
        live_(activation_liveness(*model, first, last)),
        dead_most_(
            shared_extents(features_, first, last, [&](std::size_t k) { return !live_.kept[k]; })),
        grad_most_(shared_extents(features_, first, last, [](std::size_t) { return true; })) {
    model_->for_each_layer([&](auto index, auto& layer) {
      if (index >= first_ && index < last_)
        pass_shared_pool(layer, pool_, 0);
    });
  }

  std::size_t first() const { return first_; }
  std::size_t last() const { return last_; }
  std::size_t in_features() const { return features_[first_]; }
  std::size_t out_features() const { return features_[last_]; }
  bool empty() const { return first_ == last_; }

  // A free slot sized for `rows` samples.
  int acquire(std::size_t rows) {
    int id = -1;
    for (std::size_t s = 0; s < slots_.size(); ++s)
      if (!slots_[s].busy) {
        id = int(s);
        break;
      }
    if (id < 0) {
      slots_.emplace_back();
      id = int(slots_.size()) - 1;
    }
    Slot& s = slots_[id];
    s.busy = true;
    if (s.rows != rows || s.act.empty()) {
      s.rows = rows;
      s.act.assign(features_.size(), Mat());
      s.grad.assign(features_.size(), Mat());
      for (std::size_t k = first_ + 1; k <= last_; ++k)
        if (live_.kept[k])
          s.act[k] = Mat(Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::activation"), rows,
                         features_[k]);
      gradient(s, last_, false);
      // The stage input gradient is only needed when a stage before this one
      // consumes it.
      if (first_ > 0)
        gradient(s, first_, false);
    }
    return id;
  }
  // The saved states stay with the slot: layers (nested blocks) keep their
  // buffers there between steps, so a steady-state step allocates nothing.
  void release(int slot) {
    Slot& s = slots_[slot];
    s.busy = false;
    s.input = CMat();
  }
  std::size_t slots_allocated() const { return slots_.size(); }
  // Frees every slot (after an evaluation sized them for its chunks).
  void clear_slots() {
    slots_.clear();
    scratch_ = Mat();
    shared_.clear();
    pool_->clear();
  }

  // A buffer to receive the stage input into (pipeline stages after the first).
  Mat input_buffer(int slot) {
    Slot& s = slots_[slot];
    if (s.act[first_].extent(0) != s.rows)
      s.act[first_] = Mat(Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::stage_input"),
                          s.rows, features_[first_]);
    return s.act[first_];
  }
  // Output of the stage / gradient buffers.
  Mat output(int slot) const { return slots_[slot].act[last_]; }
  Mat output_grad(int slot) const { return slots_[slot].grad[last_]; }
  Mat input_grad(int slot) const { return slots_[slot].grad[first_]; }

  // Hooks: see step_hooks.hpp (before_forward before each layer).
  template <class Exec, class Hooks = NoStepHooks>
  void forward(Exec const& exec, int slot, CMat input, Hooks&& hooks = Hooks{}) {
    Slot& s = slots_[slot];
    if (input.extent(0) != s.rows || input.extent(1) != features_[first_])
      throw ShapeError("telar: stage input is [" + std::to_string(input.extent(0)) + ", " +
                       std::to_string(input.extent(1)) + "], expected [" + std::to_string(s.rows) +
                       ", " + std::to_string(features_[first_]) + "]");
    s.input = input;
    shared_.reserve(0, s.rows, dead_most_);
    model_->for_each_layer([&](auto index, auto& layer) {
      std::size_t const k = index;
      if (k < first_ || k >= last_)
        return;
      CMat x = k == first_ ? s.input : CMat(activation(s, k));
      hooks.before_forward(k);
      MemoryMeter::Scope saved_state(MemoryCategory::activations); // what the layer keeps
      auto& saved = saved_at(s.saved, index, layer);
      if constexpr (layer_traits<std::decay_t<decltype(layer)>>::has_compact_copy)
        saved.compact = live_.compact[k];
      layer.forward(exec, x, activation(s, k + 1), saved);
    });
  }

  // dL/dx for every layer of the stage, last to first; the weight part too
  // for layers with only a fused backward. The gradients between layers stay
  // with the slot: backward_weight reads them later.
  template <class Exec, class Hooks>
  void backward_input(Exec const& exec, int slot, Hooks&& hooks) {
    // Made here, outside the layers' meter scopes, as acquire() makes the
    // rest: a step counts them, a calibration run beside a Trainer does not.
    for (std::size_t k = first_ + 1; k < last_; ++k)
      gradient(slots_[slot], k, false);
    for_each_stage_layer_reverse([&](auto k, auto& layer) {
      hooks.before_backward(k);
      input_part(exec, slot, k, layer, false);
    });
  }

  // dL/dW accumulation, last layer first; hooks.gradient_ready(k) after each
  // layer with parameters so gradient reductions can start.
  template <class Exec, class Hooks>
  void backward_weight(Exec const& exec, int slot, Hooks&& hooks) {
    for_each_stage_layer_reverse(
        [&](auto k, auto& layer) { weight_part(exec, slot, k, layer, hooks, false); });
  }

  // B + W per layer (non-split schedules): a split layer's weight gradient
  // comes first, so its reduction can start while the input gradient runs;
  // a block's comes after (it needs the inner gradients of the input part).
  // The gradients between layers are read only here, so they live in the
  // buffers the slots share.
  template <class Exec, class Hooks>
  void backward(Exec const& exec, int slot, Hooks&& hooks) {
    shared_.reserve(0, slots_[slot].rows, grad_most_);
    for_each_stage_layer_reverse([&](auto k, auto& layer) {
      using L = std::decay_t<decltype(layer)>;
      hooks.before_backward(k);
      if constexpr (layer_traits<L>::has_split_backward && !layer_traits<L>::backward_input_first) {
        weight_part(exec, slot, k, layer, hooks, true);
        input_part(exec, slot, k, layer, true);
      } else if constexpr (takes_shared_pool_v<L> && layer_traits<L>::has_fused_backward) {
        both_parts(exec, slot, k, layer, hooks);
      } else { // fused, or a block: the weight part needs what the input part made
        input_part(exec, slot, k, layer, true);
        weight_part(exec, slot, k, layer, hooks, true);
      }
    });
  }

private:
  struct Slot {
    bool busy = false;
    std::size_t rows = 0;
    CMat input;
    std::vector<Mat> act;  // act[k]: input of layer k (k in (first, last]) / stage output
    std::vector<Mat> grad; // grad[k]: dL/d act[k]
    typename Model::saved_tuple saved;
  };

  // Layer k's input: the slot's own when a backward reads it.
  Mat activation(Slot& s, std::size_t k) {
    return live_.kept[k] ? s.act[k] : shared_.at(0, k, s.rows, features_[k]);
  }
  // dL/d(layer k's input): between layers of a fused backward a shared
  // buffer, else the slot's own (made on first use).
  Mat gradient(Slot& s, std::size_t k, bool fused) {
    if (fused && k > first_ && k < last_)
      return shared_.at(0, k, s.rows, features_[k]);
    if (s.grad[k].extent(1) != features_[k])
      s.grad[k] = Mat(Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::activation_grad"),
                      s.rows, features_[k]);
    return s.grad[k];
  }

  template <class F>
  void for_each_stage_layer_reverse(F&& f) {
    model_->for_each_layer_reverse([&](auto index, auto& layer) {
      if (index >= first_ && index < last_)
        f(index, layer);
    });
  }

  // The input gradient (or the fused backward). The model's first layer
  // skips dx: nothing consumes the gradient of the input.
  template <class Exec, class K, class L>
  void input_part(Exec const& exec, int slot, K index, L& layer, bool fused) {
    std::size_t const k = index;
    Slot& s = slots_[slot];
    CMat dy = gradient(s, k + 1, fused);
    MemoryMeter::Scope saved_state(MemoryCategory::activations); // blocks' inner gradients
    if constexpr (layer_traits<L>::has_split_backward) {
      if (k > 0)
        layer.backward_input(exec, dy, gradient(s, k, fused), saved_at(s.saved, index, layer));
    } else {
      Mat dx = k > 0 ? gradient(s, k, fused) : scratch(k, s.rows);
      layer.backward(exec, dy, dx, saved_at(s.saved, index, layer));
    }
  }

  // The weight gradient of a split layer; gradient_ready(k) for layers with
  // parameters.
  template <class Exec, class K, class L, class Hooks>
  void weight_part(Exec const& exec, int slot, K index, L& layer, Hooks& hooks, bool fused) {
    std::size_t const k = index;
    Slot& s = slots_[slot];
    if constexpr (layer_traits<L>::has_split_backward && layer_traits<L>::has_backward_weight) {
      MemoryMeter::Scope saved_state(MemoryCategory::activations);
      layer.backward_weight(exec, CMat(gradient(s, k + 1, fused)), saved_at(s.saved, index, layer));
    }
    if constexpr (layer_traits<L>::has_parameters)
      hooks.gradient_ready(k);
  }

  // A block's input and weight parts in one call, so its inner gradients
  // live in the pool. The model's first layer needs no input gradient: there
  // the two parts run apart (the weight part makes the inner gradients it
  // needs, kept with the slot, as the memory plan counts).
  template <class Exec, class K, class L, class Hooks>
  void both_parts(Exec const& exec, int slot, K index, L& layer, Hooks& hooks) {
    std::size_t const k = index;
    if (k == 0) {
      input_part(exec, slot, index, layer, true);
      weight_part(exec, slot, index, layer, hooks, true);
      return;
    }
    Slot& s = slots_[slot];
    {
      MemoryMeter::Scope saved_state(MemoryCategory::activations);
      layer.backward(exec, CMat(gradient(s, k + 1, true)), gradient(s, k, true),
                     saved_at(s.saved, index, layer));
    }
    if constexpr (layer_traits<L>::has_parameters)
      hooks.gradient_ready(k);
  }

  // dx of a fused layer whose input needs no gradient still needs somewhere
  // to go.
  Mat scratch(std::size_t k, std::size_t rows) {
    if (scratch_.extent(0) != rows || scratch_.extent(1) != features_[k])
      scratch_ = Mat(Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::scratch"), rows,
                     features_[k]);
    return scratch_;
  }

  Model* model_ = nullptr;
  std::size_t first_ = 0, last_ = 0;
  std::vector<std::size_t> features_;
  Liveness live_; // act[k] kept per slot, layers keeping compact copies
  std::pair<std::size_t, std::size_t> dead_most_, grad_most_;
  std::vector<Slot> slots_;
  Mat scratch_;
  // Two buffers the slots share, taken alternately by layer index so that a
  // layer's input and output never fall in the same one. A forward writes
  // the activations no backward reads into them, a fused backward the
  // gradients between layers: one call at a time, so both use the same two.
  // Not the blocks' pool: these hold a block's input and output while the
  // block uses depth 0 of that one.
  SharedPool<T, MemorySpace> shared_;
  typename PoolHandle<T, MemorySpace>::Pool pool_ = std::make_shared<SharedPool<T, MemorySpace>>();
};

} // namespace telar::detail
