#pragma once
/*! \file
 *  \brief telar::onnx::import_model: an ONNX file (e.g. from torch.onnx.export)
 *  to a telar::DynamicSequential of built-in layers and telar::DynamicGraph
 *  parts (branches, skips, joins) that every strategy can train, starting
 *  from the file's initializers. See docs/onnx.md. */
#include <telar/core/dynamic_sequential.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/dropout.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/onnx/detail/import_graph.hpp>
#include <telar/onnx/detail/proto.hpp>
#include <telar/onnx/error.hpp>
#include <telar/onnx/model.hpp>
#include <telar/parallel/tensor_parallel.hpp>

#include <Kokkos_Core.hpp>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace telar::onnx {

/*! \brief An imported model: the layers, what they were read from, and how
 *  to write trained values back (telar::onnx::export_model).
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
struct Imported {
  Model<T, MemorySpace> model; //!< the layers; initialize() loads the file's values
  Shape input_shape;           //!< per-sample input shape (the batch dimension dropped)
  std::string input_name;      //!< the graph input
  std::string output_name;     //!< the graph output
  /*! \brief "Softmax" or "LogSoftmax" when the graph ends with one (left out
   *  of the model: the loss takes the logits), else empty. */
  std::string output_activation;
  std::vector<ParameterBinding> bindings;    //!< every parameter, model order
  std::shared_ptr<::onnx::ModelProto> proto; //!< the file as read (export writes into a copy)
  std::string path;                          //!< the file
  /*! \brief Starting values by initializer name, in Telar's layout. */
  std::shared_ptr<std::map<std::string, std::vector<T>>> start;
};

/*! \brief Reads an ONNX model (any acyclic graph of the supported operators)
 *  and builds the matching Telar model: the chain parts as layers of the
 *  DynamicSequential, each part with branches (a tensor read by several
 *  nodes, Add/Mul/Concat joins) as one telar::DynamicGraph layer. Refuses
 *  anything outside the supported subset before training starts.
 *  \param path the .onnx file \param options how to import
 *  \return the model (layers configured; their initialize() loads the file's
 *  initializers, so hand it to a Trainer as is)
 *  \throws OnnxError naming the file, the node, its operator and what is
 *  supported: an unsupported operator, opset, data type or attribute, a
 *  dynamic dimension other than the batch, a node whose result reaches nothing
 *  \tparam T value type (the file must hold float32)
 *  \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
Imported<T, MemorySpace> import_model(std::string const& path, ImportOptions options = {}) {
  Imported<T, MemorySpace> r;
  r.path = path;
  r.proto = detail::read_model(path);
  detail::GraphReader<T, MemorySpace> reader(*r.proto, path);
  auto plan = reader.read();
  if (options.tensor_parallel)
    detail::make_tensor_parallel_pairs(plan.layers);
  for (auto& l : plan.layers)
    r.model.push_back(std::move(l));
  r.input_shape = plan.input_shape;
  r.input_name = plan.input_name;
  r.output_name = plan.output_name;
  r.output_activation = plan.output_activation;
  r.bindings = std::move(plan.bindings);
  r.start = std::make_shared<std::map<std::string, std::vector<T>>>(std::move(plan.start));
  r.model.set_initializer(detail::StartValues<T, MemorySpace>{r.bindings, r.start});
  r.model.shapes(r.input_shape); // the chain fits, or a ShapeError names the layer
  return r;
}

/*! \brief Runs \p model forward on \p x (host orchestration over the same
 *  stage runner the Trainer uses); the model must be built and initialised.
 *  Runs in evaluation mode (dropout off), then switches training back on.
 *  \param model a built model (e.g. Trainer::model()) \param x inputs [n, input size]
 *  \return outputs [n, output size] */
template <class Variant, class X>
auto predict(DynamicSequential<Variant>& model, X const& x) {
  set_training(model, false); // evaluation: dropout is the identity
  auto y = detail::run_forward(model, x);
  set_training(model, true);
  return y;
}

} // namespace telar::onnx
