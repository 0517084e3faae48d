#pragma once
/*! \file
 *  \brief telar::step_launches: the kernel launches and library calls of one
 *  forward and backward of a layer, for checks that they do not grow with
 *  the batch (see telar::LaunchCounter and docs/getting_started.md, "Ready
 *  for a device").
 *  \code
 *  telar::CausalSelfAttention<float> attn(64, 4);
 *  auto const b2 = telar::step_launches(attn, telar::Shape{16, 64}, 2);
 *  auto const b8 = telar::step_launches(attn, telar::Shape{16, 64}, 8);
 *  assert(b2.total() == b8.total());
 *  \endcode
 */
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/profile/launches.hpp>
#include <telar/testing/check_gradients.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>

namespace telar {

/*! \brief Launches counted over one training step of a layer. */
struct StepLaunches {
  std::uint64_t kernels = 0;                  //!< Kokkos parallel_for / reduce / scan
  std::uint64_t library_calls = 0;            //!< GEMM and convolution library calls
  std::map<std::string, std::uint64_t> names; //!< both, per kernel or policy name
  std::uint64_t elsewhere = 0; //!< kernels on another execution space than the one given
  /*! \brief kernels + library_calls. */
  std::uint64_t total() const { return kernels + library_calls; }
};

/*! \brief Counts the launches of one forward, backward_input and
 *  backward_weight (or fused backward) of \p layer on \p samples samples of
 *  shape \p in. The layer is built (if it has build) and initialised (if it
 *  has initialize) here; a first, uncounted step leaves out what happens
 *  once (workspace allocation, primitive creation, first touch). Inputs
 *  are integers 0 to 3 (token ids of an embedding with 4 or more), output
 *  gradients uniform in [-1, 1). The layer runs on \p exec; kernels it
 *  launches on another execution space count in StepLaunches::elsewhere.
 *  \param layer a layer \param in per-sample input shape \param samples batch size
 *  \param seed initialize() seed and input values
 *  \param exec where the layer runs (the default space of its memory space) */
template <class L, class Exec = typename L::memory_space::execution_space>
StepLaunches step_launches(L& layer, Shape const& in, std::size_t samples, std::uint64_t seed = 1,
                           Exec const& exec = Exec{}) {
  static_assert(is_layer_v<L>, "telar::step_launches: L must satisfy the Layer concept");
  using T = typename L::value_type;
  using M = Matrix<T, typename L::memory_space>;
  Shape const out = layer.output_shape(in);
  if constexpr (layer_traits<L>::has_build)
    layer.build(in);
  if constexpr (layer_traits<L>::has_initialize)
    layer.initialize(seed);
  M x("telar::step_launches::x", samples, in.size());
  M y("telar::step_launches::y", samples, out.size());
  M dy("telar::step_launches::dy", samples, out.size());
  M dx("telar::step_launches::dx", samples, in.size());
  // Inputs 0 to 3: token ids for an embedding, generic values elsewhere.
  auto hx = Kokkos::create_mirror_view(x);
  for (std::size_t i = 0; i < hx.size(); ++i)
    hx.data()[i] = T(std::floor(2.0 + 2.0 * detail::fd_uniform(seed + 11, i)));
  Kokkos::deep_copy(x, hx);
  detail::fd_fill(dy, seed + 12, 1.0);
  typename layer_traits<L>::saved_type saved;
  auto step = [&] {
    layer.forward(exec, x, y, saved);
    detail::run_backward(layer, exec, dy, dx, saved);
    exec.fence();
  };
  step();
  LaunchCounter count;
  step();
  return {count.kernels(), count.library_calls(), count.by_name(),
          count.kernels() - count.kernels_on<Exec>()};
}

} // namespace telar
