#pragma once
/*! \file
 *  \brief The layer set and model type of an imported ONNX model, and how its
 *  parameters map onto the file's initializers. */
#include <telar/core/dynamic_graph.hpp>
#include <telar/core/dynamic_sequential.hpp>
#include <telar/core/graph_chain.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/batch_norm.hpp>
#include <telar/layers/bias.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/conv_transpose.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/dropout.hpp>
#include <telar/layers/embedding.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/layers/masked_fill.hpp>
#include <telar/layers/multiplier.hpp>
#include <telar/layers/normalization.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/layers/rearrange.hpp>
#include <telar/layers/softmax.hpp>
#include <telar/layers/upsample.hpp>
#include <telar/parallel/tensor_parallel.hpp>

#include <string>
#include <variant>

namespace telar::onnx {

namespace detail {

/// The built-in layers every node of an imported graph can be, listed once
/// for NodeLayer and Layer, then \p More (Dense stays first: the default).
template <class T, class M, class... More>
using node_layers_and =
    std::variant<Dense<T, M>, ReLU<T, M>, GELU<T, M>, Sigmoid<T, M>, Tanh<T, M>, Flatten<T, M>,
                 Conv2D<T, M>, MaxPool2D<T, M>, AvgPool2D<T, M>, GlobalAvgPool<T, M>, Dropout<T, M>,
                 BatchNorm<T, M, SyncStats>, ConvTranspose2D<T, M>, Conv3D<T, M>,
                 ConvTranspose3D<T, M>, ReLU6<T, M>, Clip<T, M>, LeakyReLU<T, M>, ELU<T, M>,
                 SiLU<T, M>, HardSwish<T, M>, HardSigmoid<T, M>, MaxPool3D<T, M>, AvgPool3D<T, M>,
                 GlobalMaxPool<T, M>, Softmax<T, M>, Upsample<T, M>, LayerNorm<T, M>,
                 Rearrange<T, M>, Scale<T, M>, Embedding<T, M>, PositionalEmbedding<T, M>,
                 MaskedFill<T, M>, Bias<T, M>, Multiplier<T, M>, MathFunction<T, M>, More...>;

} // namespace detail

/*! \brief The layers a node of an imported graph can be (the nodes of a
 *  telar::DynamicGraph inside the model; joins are the graph's own Add,
 *  Concat, Mul, Sub, Div and MatMul). BatchNorm uses telar::SyncStats: its statistics span the
 *  data-parallel group, so a dp run with one micro-batch per rank equals the
 *  serial run (PyTorch's SyncBatchNorm).
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
using NodeLayer = detail::node_layers_and<T, MemorySpace>;

/*! \brief Former name of NodeLayer (a residual branch is now a graph).
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
using BranchLayer = NodeLayer<T, MemorySpace>;

/*! \brief The built-in layers an imported model is made of: the node layers,
 *  the tensor-parallel Dense pair, and a telar::DynamicGraph for each part
 *  of the file that is not a chain (branches, skips and their joins).
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
using Layer = detail::node_layers_and<T, MemorySpace, ColumnParallel<Dense<T, MemorySpace>>,
                                      RowParallel<Dense<T, MemorySpace>>,
                                      DynamicGraph<NodeLayer<T, MemorySpace>>>;

/*! \brief The run-time model an import builds.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
using Model = DynamicSequential<Layer<T, MemorySpace>>;

/*! \brief The run-time model import_graph builds: the whole file as one
 *  graph, one pipeline unit per node.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
using GraphModel = GraphChain<NodeLayer<T, MemorySpace>>;

/*! \brief How to import. */
struct ImportOptions {
  /*! \brief Turn each Dense, element-wise activation, Dense run into a
   *  Megatron pair (ColumnParallel, activation, RowParallel), for a
   *  telar::TensorParallel strategy; identical to the serial model at tp = 1. */
  bool tensor_parallel = false;
};

/*! \brief Where a Telar parameter comes from in the file. */
struct ParameterBinding {
  std::size_t layer = 0; //!< layer index in the model (import_graph: 0, the graph)
  /*! \brief The layer's parameter (or buffer) name: "weight", "bias"; in a
   *  graph "<node>.weight". */
  std::string param;
  std::string initializer; //!< the ONNX initializer's name
  bool transpose = false;  //!< the file holds the transpose ([in, out]: MatMul, Gemm transB=0)
  std::size_t rows = 0;    //!< rows of the full Telar tensor
  std::size_t cols = 1;    //!< columns of the full Telar tensor (1 for a vector)
  /*! \brief A buffer (BatchNorm's running_mean, running_var), not a
   *  parameter: loaded and exported, not trained. */
  bool buffer = false;
};

} // namespace telar::onnx
