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
// U-Net block is one unit on one stage. make_graph writes the same network
// as one telar::DynamicGraph (same layers, same concatenation order); trained
// as a telar::GraphChain its pipeline cuts between nodes, so the skips cross
// stage boundaries (the live set a boundary sends holds them).
#include <telar/core/branches.hpp>
#include <telar/core/dynamic_graph.hpp>
#include <telar/core/sequential.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/batch_norm.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/conv_transpose.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/layers/pooling.hpp>

#include <cstddef>
#include <string>
#include <utility>
#include <variant>

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

template <class T, class Stats>
using GraphLayer = std::variant<Conv<T>, BN<T, Stats>, Relu<T>, Pool<T>, Up<T>, telar::Flatten<T>,
                                telar::Dense<T>>;
template <class T, class Stats>
using Graph = telar::DynamicGraph<GraphLayer<T, Stats>>;

/// Conv, BN, ReLU from tensor `in` (node names `name`_conv, _bn, _relu);
/// returns the output tensor's name.
template <class T, class Stats>
std::string conv_bn_relu(Graph<T, Stats>& g, std::string const& name, std::string const& in,
                         std::size_t from, std::size_t to, std::size_t kernel = 3) {
  std::size_t const pad = kernel / 2;
  g.add(name + "_conv", Conv<T>(from, to, kernel, 1, pad), in, name + "_c");
  g.add(name + "_bn", BN<T, Stats>(to), name + "_c", name + "_n");
  g.add(name + "_relu", Relu<T>{}, name + "_n", name);
  return name;
}

/// make_net as one DynamicGraph over tensor "x" to "y" (24 nodes).
template <class T, class Stats>
Graph<T, Stats> make_graph(std::size_t in, std::size_t hw, std::size_t c, std::size_t classes) {
  Graph<T, Stats> g("x");
  std::string const a = conv_bn_relu(g, "stem", "x", in, c); // skip of level 1
  g.add("l1_pool", Pool<T>(2), a, "l1_p");
  std::string const b = conv_bn_relu(g, "l1_down", "l1_p", c, 2 * c); // skip of level 2
  g.add("l2_pool", Pool<T>(2), b, "l2_p");
  std::string const e = conv_bn_relu(g, "l2_down", "l2_p", 2 * c, 2 * c);
  g.add("l2_up", Up<T>(2 * c, 2 * c, 2, 2), e, "l2_u");
  g.add_concat("l2_cat", {b, "l2_u"}, "l2");
  std::string const r = conv_bn_relu(g, "l1_reduce", "l2", 4 * c, 2 * c);
  g.add("l1_up", Up<T>(2 * c, c, 2, 2), r, "l1_u");
  g.add_concat("l1_cat", {a, "l1_u"}, "l1");
  std::string const d = conv_bn_relu(g, "reduce", "l1", 2 * c, c);
  g.add("head_conv", Conv<T>(c, 1, 1), d, "h");
  g.add("head_flat", telar::Flatten<T>{}, "h", "f");
  g.add("head_dense", telar::Dense<T>(hw * hw, classes), "f", "y");
  g.set_output("y");
  return g;
}

} // namespace telar::test::unet
