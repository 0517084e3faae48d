#pragma once
// A two-level 2-D U-Net written with the compile-time blocks, shared by the
// tests that train it under every parallel layout (parallel/), check its
// gradients by finite differences (core/) and hold its memory plan to the
// meter (train/). Each level is a DenseConcat,
//   y = concat(x, up(inner(down(x)))),
// the skip of a U-Net: MaxPool2D halves the resolution, conv-BN-ReLU works
// there (around the next level down), a stride-2 ConvTranspose2D doubles it
// back, and the block puts its input next to the result. After a level,
// conv-BN-ReLU reduces the channels again. The head is per pixel (a 1x1
// convolution to one map), flattened into a classifier.
//
// Shapes for an input [in, H, W] (H and W multiples of 4), width c:
//   stem   Conv 3x3 in -> c, BN, ReLU                       [c, H, W]
//   level1 DenseConcat<pool, conv c -> 2c, BN, ReLU,
//                      level2,                               [4c, H/2, W/2]
//                      conv 4c -> 2c, BN, ReLU, up 2c -> c>  [2c, H, W]
//   level2 DenseConcat<pool, conv 2c -> 2c, BN, ReLU,
//                      up 2c -> 2c>                          [4c, H/2, W/2]
//   reduce Conv 3x3 2c -> c, BN, ReLU                        [c, H, W]
//   head   Conv 1x1 c -> 1, Flatten, Dense H W -> classes
//
// Pipelines split the model between its top-level units (ten here: the stem's
// three layers, the U-Net block, the reduction's three, the head's three), so
// a skip inside a DenseConcat never crosses a stage boundary: the whole
// U-Net block is one unit on one stage. Skips that cross stages (a U-Net
// whose encoder and decoder sit on different stages) need the DynamicGraph
// pipeline, which is not built yet.
#include <telar/core/branches.hpp>
#include <telar/core/sequential.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/batch_norm.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/conv_transpose.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/layers/pooling.hpp>

#include <cstddef>
#include <utility>

namespace telar::test::unet {

template <class T, class Stats>
using BN = telar::BatchNorm<T, telar::DefaultMemorySpace, Stats>;
template <class T>
using Conv = telar::Conv2D<T>;
template <class T>
using Up = telar::ConvTranspose2D<T>;
template <class T>
using Pool = telar::MaxPool2D<T>;
template <class T>
using Relu = telar::ReLU<T>;

template <class T, class Stats>
using Level2 = telar::DenseConcat<Pool<T>, Conv<T>, BN<T, Stats>, Relu<T>, // down
                                  Up<T>>;                                  // up
template <class T, class Stats>
using Level1 = telar::DenseConcat<Pool<T>, Conv<T>, BN<T, Stats>, Relu<T>, // down
                                  Level2<T, Stats>,                        // inner level
                                  Conv<T>, BN<T, Stats>, Relu<T>, Up<T>>;  // reduce, up
template <class T, class Stats>
using Net = telar::Sequential<Conv<T>, BN<T, Stats>, Relu<T>,               // stem
                              Level1<T, Stats>,                             // the U-Net block
                              Conv<T>, BN<T, Stats>, Relu<T>,               // reduce
                              Conv<T>, telar::Flatten<T>, telar::Dense<T>>; // per-pixel head

/// The U-Net block (both levels) for inputs [c, H, W]: gives [2c, H, W].
template <class T, class Stats>
Level1<T, Stats> make_block(std::size_t c) {
  Level2<T, Stats> level2(Pool<T>(2), Conv<T>(2 * c, 2 * c, 3, 1, 1), BN<T, Stats>(2 * c), {},
                          Up<T>(2 * c, 2 * c, 2, 2));
  return Level1<T, Stats>(Pool<T>(2), Conv<T>(c, 2 * c, 3, 1, 1), BN<T, Stats>(2 * c), {},
                          std::move(level2), Conv<T>(4 * c, 2 * c, 3, 1, 1), BN<T, Stats>(2 * c),
                          {}, Up<T>(2 * c, c, 2, 2));
}

/// The U-Net for inputs [in, hw, hw] (hw a multiple of 4), width c.
template <class T, class Stats>
Net<T, Stats> make_net(std::size_t in, std::size_t hw, std::size_t c, std::size_t classes) {
  return Net<T, Stats>(Conv<T>(in, c, 3, 1, 1), BN<T, Stats>(c), {}, make_block<T, Stats>(c),
                       Conv<T>(2 * c, c, 3, 1, 1), BN<T, Stats>(c), {}, Conv<T>(c, 1, 1), {},
                       telar::Dense<T>(hw * hw, classes));
}

} // namespace telar::test::unet
