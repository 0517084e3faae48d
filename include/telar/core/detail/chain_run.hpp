#pragma once
// Forward and backward through a chain of layers, written once for
// telar::Sequential (a nested block) and telar::DynamicResidual's body: act[k]
// and grad[k] hold the input of layer k and its gradient (k >= 1); saved(index,
// layer) gives layer k's saved state (a tuple entry or a run-time slot).
#include <telar/core/layer.hpp>
#include <telar/core/tensor.hpp>

#include <cstddef>
#include <type_traits>
#include <vector>

namespace telar::detail {

// Layer by layer from x to y (y may be act[n] when the caller needs the
// chain's output in a buffer of its own).
template <class Model, class Exec, class CMat, class Mat, class Saved>
void chain_forward(Model& m, Exec const& exec, CMat x, Mat y, std::vector<Mat> const& act,
                   Saved const& saved) {
  std::size_t const last = m.layer_count() - 1;
  m.for_each_layer([&](auto index, auto& l) {
    std::size_t const k = index;
    CMat in = k == 0 ? x : CMat(act[k]);
    Mat out = k == last ? y : act[k + 1];
    l.forward(exec, in, out, saved(index, l));
  });
}

// dL/d(input) of every layer, last first, into grad[k] and (when need_dx) dx;
// a layer with only a fused backward writes the first dx into scratch() when
// nobody wants it.
template <class Model, class Exec, class CMat, class Mat, class Saved, class Scratch>
void chain_backward_input(Model& m, Exec const& exec, CMat dy, Mat dx, std::vector<Mat> const& grad,
                          Saved const& saved, bool need_dx, Scratch const& scratch) {
  std::size_t const last = m.layer_count() - 1;
  m.for_each_layer_reverse([&](auto index, auto& l) {
    std::size_t const k = index;
    CMat dyk = k == last ? dy : CMat(grad[k + 1]);
    if constexpr (layer_traits<std::decay_t<decltype(l)>>::has_split_backward) {
      if (k > 0 || need_dx)
        l.backward_input(exec, dyk, k == 0 ? dx : grad[k], saved(index, l));
    } else {
      Mat dxk = k > 0 ? grad[k] : need_dx ? dx : scratch();
      l.backward(exec, dyk, dxk, saved(index, l));
    }
  });
}

// dL/dW of every layer with a split backward, from the gradients
// chain_backward_input left in grad.
template <class Model, class Exec, class CMat, class Mat, class Saved>
void chain_backward_weight(Model& m, Exec const& exec, CMat dy, std::vector<Mat> const& grad,
                           Saved const& saved) {
  std::size_t const last = m.layer_count() - 1;
  m.for_each_layer_reverse([&](auto index, auto& l) {
    using L = std::decay_t<decltype(l)>;
    std::size_t const k = index;
    if constexpr (layer_traits<L>::has_split_backward && layer_traits<L>::has_backward_weight)
      l.backward_weight(exec, k == last ? dy : CMat(grad[k + 1]), saved(index, l));
  });
}

// Input and weight gradients together, last layer first (a chain whose
// inner gradients live in a shared pool, read only here): each layer's
// weight part reads grad[k + 1] before anything overwrites it. A split
// layer's weight part comes first, a block's after its input part (it needs
// the inner gradients that part makes); a block with a fused backward runs
// that, so blocks inside keep their own inner gradients in the pool too.
// dx is always wanted.
template <class Model, class Exec, class CMat, class Mat, class Saved>
void chain_backward_fused(Model& m, Exec const& exec, CMat dy, Mat dx, std::vector<Mat> const& grad,
                          Saved const& saved) {
  std::size_t const last = m.layer_count() - 1;
  m.for_each_layer_reverse([&](auto index, auto& l) {
    using P = layer_traits<std::decay_t<decltype(l)>>;
    std::size_t const k = index;
    CMat dyk = k == last ? dy : CMat(grad[k + 1]);
    Mat dxk = k > 0 ? grad[k] : dx;
    auto& s = saved(index, l);
    if constexpr (P::has_fused_backward) {
      l.backward(exec, dyk, dxk, s);
    } else if constexpr (P::has_backward_weight && !P::backward_input_first) {
      l.backward_weight(exec, dyk, s);
      l.backward_input(exec, dyk, dxk, s);
    } else {
      l.backward_input(exec, dyk, dxk, s);
      if constexpr (P::has_backward_weight)
        l.backward_weight(exec, dyk, s);
    }
  });
}

} // namespace telar::detail
