#pragma once
/*! \file
 *  \brief telar::onnx::import_model: an ONNX file (e.g. from torch.onnx.export)
 *  to a telar::DynamicSequential of built-in layers and telar::DynamicGraph
 *  parts (branches, skips, joins) that every strategy can train, starting
 *  from the file's initializers; telar::onnx::import_graph: the file as one
 *  graph, trained as a telar::GraphChain. See docs/onnx.md. */
#include <telar/core/dynamic_sequential.hpp>
#include <telar/core/graph_chain.hpp>
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
 *  \tparam T value type \tparam MemorySpace memory space
 *  \tparam ModelType Model<T, MemorySpace> (import_model) or
 *  GraphModel<T, MemorySpace> (import_graph) */
template <class T = float, class MemorySpace = DefaultMemorySpace,
          class ModelType = Model<T, MemorySpace>>
struct Imported {
  ModelType model;         //!< the layers; initialize() loads the file's values
  Shape input_shape;       //!< per-sample input shape (the batch dimension dropped)
  std::string input_name;  //!< the graph input
  std::string output_name; //!< the graph output
  /*! \brief "Softmax" or "LogSoftmax" when the graph ends with one (left out
   *  of the model: the loss takes the logits), else empty. */
  std::string output_activation;
  std::vector<ParameterBinding> bindings;    //!< every parameter, model order
  std::shared_ptr<::onnx::ModelProto> proto; //!< the file as read (export writes into a copy)
  std::string path;                          //!< the file
  /*! \brief Starting values by initializer name, in Telar's layout. */
  std::shared_ptr<std::map<std::string, std::vector<T>>> start;
};

namespace detail {
// Reads \p path into \p r (everything but the model) and returns the
// placed layers (one_graph: GraphReader::read's).
template <class T, class M, class ModelType>
GraphPlan<T, M> read_plan(Imported<T, M, ModelType>& r, std::string const& path, bool one_graph) {
  r.path = path;
  std::string const who = one_graph ? "telar::onnx::import_graph" : "telar::onnx::import_model";
  r.proto = read_model(path, who);
  GraphReader<T, M> reader(*r.proto, path, who);
  auto plan = reader.read(one_graph);
  r.input_shape = plan.input_shape;
  r.input_name = plan.input_name;
  r.output_name = plan.output_name;
  r.output_activation = plan.output_activation;
  r.bindings = std::move(plan.bindings);
  r.start = std::make_shared<std::map<std::string, std::vector<T>>>(std::move(plan.start));
  return plan;
}
} // namespace detail

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
  auto plan = detail::read_plan(r, path, false);
  if (options.tensor_parallel)
    detail::make_tensor_parallel_pairs(plan.layers);
  for (auto& l : plan.layers)
    r.model.push_back(std::move(l));
  r.model.set_initializer(detail::StartValues<T, MemorySpace>{r.bindings, r.start});
  r.model.shapes(r.input_shape); // the chain fits, or a ShapeError names the layer
  return r;
}

/*! \brief Reads an ONNX model as import_model does, but as one
 *  telar::DynamicGraph of every node, trained as a telar::GraphChain: its
 *  pipeline stages can cut anywhere in the file (inside a residual block,
 *  between a U-Net's encoder and decoder, its skips crossing the boundary),
 *  where import_model's chain cuts only between its layers. Parameters keep
 *  the names of the graph as layer 0 ("layer0.<node>.<name>"); no
 *  tensor-parallel pairs (a GraphChain has none). Exports as import_model's
 *  result does (export_trained).
 *  \param path the .onnx file \return the model, its bindings and the file
 *  \throws OnnxError as import_model
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
Imported<T, MemorySpace, GraphModel<T, MemorySpace>> import_graph(std::string const& path) {
  Imported<T, MemorySpace, GraphModel<T, MemorySpace>> r;
  auto plan = detail::read_plan(r, path, true);
  auto graph = std::move(std::get<DynamicGraph<NodeLayer<T, MemorySpace>>>(plan.layers.at(0)));
  graph.set_initializer(detail::StartValues<T, MemorySpace>{r.bindings, r.start});
  r.model = GraphModel<T, MemorySpace>(std::move(graph));
  r.model.shapes(r.input_shape); // the graph fits, or a ShapeError names the node
  return r;
}

/*! \brief Runs \p model forward on \p x (host orchestration over the same
 *  stage runner the Trainer uses); the model must be built and initialised.
 *  Runs in evaluation mode (dropout off), then switches training back on.
 *  \param model a built model (e.g. Trainer::model()): an import_model or
 *  import_graph result's \param x inputs [n, input size]
 *  \return outputs [n, output size] */
template <class ModelType, class X>
auto predict(ModelType& model, X const& x) {
  set_training(model, false); // evaluation: dropout is the identity
  auto y = detail::run_forward(model, x);
  set_training(model, true);
  return y;
}

} // namespace telar::onnx
