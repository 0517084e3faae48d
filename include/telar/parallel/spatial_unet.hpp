#pragma once
/*! \file
 *  \brief telar::spatial_unet: a 3-D U-Net (Çiçek et al., 2016) as a
 *  telar::SlabGraph over slabs of a spatial group.
 *
 *  Level l (0 .. depth) has width << l channels. Each level's block is
 *  {conv 3³, BatchNorm, ReLU} twice; between levels a 2³ max-pool going
 *  down, and going up a transposed convolution (kernel 2, stride 2) whose
 *  output is concatenated with the level's encoder block (the skip) before
 *  the decoder block. A 1³ convolution gives one logit per class. The input
 *  extents must divide by 2^depth. BatchNorm's statistics are summed over
 *  the spatial group (telar::SyncStats over the group, see
 *  telar::SpatialLocal), or GroupNorm's per sample
 *  (telar::SpatialGroupNorm).
 *
 *    enc0 [w, D, H, W] ─────────────────────────── concat → dec0 [w] → head
 *     └ pool → enc1 [2w, D/2] ──── concat → dec1 [2w] ─ up ┘
 *               └ pool → bottom [4w, D/4] ─ up ┘              (depth 2)
 *
 *  The convolutions' GEMM and convolution policies are template arguments:
 *  spatial_unet<float, M, telar::Bf16Gemm, telar::OneDnnConvBf16> multiplies
 *  in bf16 with fp32 parameters, norms and halos (docs/precision.md).
 */
#include <telar/comm/communicator.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/batch_norm.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/conv_transpose.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/parallel/slab_graph.hpp>
#include <telar/parallel/spatial_conv.hpp>
#include <telar/parallel/spatial_local.hpp>
#include <telar/parallel/spatial_norm.hpp>

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace telar {

/*! \brief The shape of a telar::spatial_unet. */
struct UNetOptions {
  std::size_t in_channels = 1; //!< image channels
  std::size_t classes = 2;     //!< logits per voxel
  int depth = 2;               //!< poolings (levels below the first)
  std::size_t width = 8;       //!< channels of the first level (doubled per level)
  /*! \brief Normalisation after each convolution: BatchNorm (statistics over
   *  the batch and the spatial group, running ones for evaluation) or
   *  GroupNorm (per sample, over the spatial group; the same in training
   *  and evaluation). */
  enum class Norm {
    batch,                //!< BatchNorm
    group                 //!< GroupNorm
  } norm = Norm::batch;   //!< which normalisation
  std::size_t groups = 4; //!< GroupNorm's groups (at most the channels)
  /*! \brief Whether the 3³ convolutions compute their interior rows while
   *  the halo travels (telar::SpatialConv::set_overlap). */
  bool overlap = true;
};

/*! \brief The slab layers of a 3-D U-Net of value type \p T.
 *  \tparam T value type \tparam M memory space \tparam G the convolutions'
 *  GEMM policy \tparam C their convolution policy (e.g. telar::Bf16Gemm and
 *  telar::OneDnnConvBf16: bf16 compute, fp32 parameters) */
template <class T, class M = DefaultMemorySpace, class G = AutoGemm, class C = AutoConv>
struct SpatialUNetLayers {
  using Conv3 = Conv3D<T, M, G, C>;                                 //!< the plain convolution
  using Transposed = ConvTranspose3D<T, M, G, C>;                   //!< the plain upsampling
  using Conv = SpatialConv<Conv3>;                                  //!< 3³ and 1³ convolutions
  using Norm = SpatialLocal<BatchNorm<T, M, SyncStats>>;            //!< BatchNorm over the group
  using Group = SpatialGroupNorm<T, M>;                             //!< GroupNorm over the group
  using Relu = SpatialLocal<ReLU<T, M>>;                            //!< activation
  using Pool = SpatialPool<MaxPool<3, T, M>>;                       //!< 2³ max-pool
  using Up = SpatialConv<Transposed>;                               //!< 2³ stride-2 upsampling
  using Graph = SlabGraph<T, M, Conv, Norm, Group, Relu, Pool, Up>; //!< the network
};

namespace detail {
// {conv 3³, BatchNorm, ReLU} twice, from node `at` with `in` channels.
template <class T, class M, class G, class C>
int unet_block(typename SpatialUNetLayers<T, M, G, C>::Graph& g, Communicator const& sp,
               UNetOptions const& o, int at, std::size_t in, std::size_t out) {
  using L = SpatialUNetLayers<T, M, G, C>;
  for (int k = 0; k < 2; ++k, in = out) {
    typename L::Conv conv(sp, typename L::Conv3(in, out, 3, 1, 1, /*bias*/ false));
    conv.set_overlap(o.overlap);
    at = g.add(std::move(conv), at);
    if (o.norm == UNetOptions::Norm::group)
      at = g.add(typename L::Group(sp, GroupNorm<T, M>(std::min(o.groups, out), out)), at);
    else
      at = g.add(typename L::Norm(sp, BatchNorm<T, M, SyncStats>(out)), at);
    at = g.add(typename L::Relu(sp, ReLU<T, M>{}), at);
  }
  return at;
}
} // namespace detail

/*! \brief A 3-D U-Net over the spatial group \p sp (not built: call
 *  build({C, D, H, W}) on the result, with D, H, W multiples of 2^depth).
 *  \tparam T value type \tparam M memory space \tparam G the convolutions'
 *  GEMM policy \tparam C their convolution policy (SpatialUNetLayers) */
template <class T, class M = DefaultMemorySpace, class G = AutoGemm, class C = AutoConv>
typename SpatialUNetLayers<T, M, G, C>::Graph spatial_unet(Communicator const& sp,
                                                           UNetOptions const& o) {
  using L = SpatialUNetLayers<T, M, G, C>;
  typename L::Graph g(sp);
  std::vector<int> skips;
  int at = L::Graph::input;
  std::size_t in = o.in_channels;
  for (int l = 0; l <= o.depth; ++l) {
    std::size_t const w = o.width << l;
    if (l > 0)
      at = g.add(typename L::Pool(sp, MaxPool<3, T, M>(2)), at);
    at = detail::unet_block<T, M, G, C>(g, sp, o, at, in, w);
    skips.push_back(at);
    in = w;
  }
  for (int l = o.depth - 1; l >= 0; --l) {
    std::size_t const w = o.width << l;
    at = g.add(typename L::Up(sp, typename L::Transposed(2 * w, w, 2, 2)), at);
    at = g.concat(skips[std::size_t(l)], at);
    at = detail::unet_block<T, M, G, C>(g, sp, o, at, 2 * w, w);
  }
  g.add(typename L::Conv(sp, typename L::Conv3(o.width, o.classes, 1)), at);
  return g;
}

} // namespace telar
