#pragma once
/*! \file
 *  \brief The layer set and model type of an imported ONNX model, and how its
 *  parameters map onto the file's initializers. */
#include <telar/core/dynamic_sequential.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/dropout.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/parallel/tensor_parallel.hpp>

#include <string>
#include <variant>

namespace telar::onnx {

/*! \brief The layers a residual branch of an imported model is made of.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
using BranchLayer =
    std::variant<Dense<T, MemorySpace>, ReLU<T, MemorySpace>, GELU<T, MemorySpace>,
                 Sigmoid<T, MemorySpace>, Tanh<T, MemorySpace>, Flatten<T, MemorySpace>,
                 Conv2D<T, MemorySpace>, MaxPool2D<T, MemorySpace>, AvgPool2D<T, MemorySpace>,
                 GlobalAvgPool<T, MemorySpace>>;

/*! \brief The built-in layers an imported model is made of: the branch
 *  layers, the tensor-parallel Dense pair and residual blocks over a branch.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
using Layer =
    std::variant<Dense<T, MemorySpace>, ColumnParallel<Dense<T, MemorySpace>>,
                 RowParallel<Dense<T, MemorySpace>>, ReLU<T, MemorySpace>, GELU<T, MemorySpace>,
                 Sigmoid<T, MemorySpace>, Tanh<T, MemorySpace>, Flatten<T, MemorySpace>,
                 Conv2D<T, MemorySpace>, MaxPool2D<T, MemorySpace>, AvgPool2D<T, MemorySpace>,
                 GlobalAvgPool<T, MemorySpace>, Dropout<T, MemorySpace>,
                 DynamicResidual<BranchLayer<T, MemorySpace>>>;

/*! \brief The run-time model an import builds.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
using Model = DynamicSequential<Layer<T, MemorySpace>>;

/*! \brief How to import. */
struct ImportOptions {
  /*! \brief Turn each Dense, element-wise activation, Dense run into a
   *  Megatron pair (ColumnParallel, activation, RowParallel), for a
   *  telar::TensorParallel strategy; identical to the serial model at tp = 1. */
  bool tensor_parallel = false;
};

/*! \brief Where a Telar parameter comes from in the file. */
struct ParameterBinding {
  std::size_t layer = 0;   //!< layer index in the model
  std::string param;       //!< the layer's parameter name ("weight", "bias")
  std::string initializer; //!< the ONNX initializer's name
  bool transpose = false;  //!< the file holds the transpose ([in, out]: MatMul, Gemm transB=0)
  std::size_t rows = 0;    //!< rows of the full Telar tensor
  std::size_t cols = 1;    //!< columns of the full Telar tensor (1 for a vector)
};

} // namespace telar::onnx
