#pragma once
/*! \file
 *  \brief Trained parameters back into the imported ONNX graph: the same
 *  nodes, the initializers replaced, so PyTorch or onnx load it again. */
#include <telar/io/gather.hpp>
#include <telar/onnx/detail/proto.hpp>
#include <telar/onnx/error.hpp>
#include <telar/onnx/import.hpp>

#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace telar::onnx {

/*! \brief Full values (Telar's layout, every rank's shard put together) of
 *  every parameter and buffer (BatchNorm's running statistics) of a
 *  trainer's imported model, by initializer name, on every rank (collective
 *  over the trainer's ranks): telar::gather_model's tensors, named as the
 *  file names them.
 *  \param trainer a telar::Trainer over \p imported's model
 *  \param imported what the model was imported from (import_model or import_graph)
 *  \return initializer name -> values [rows * cols]
 *  \throws OnnxError when the model holds no tensor of a binding's name and size */
template <class Trainer, class T, class M, class ModelType>
std::map<std::string, std::vector<T>> gather_parameters(Trainer& trainer,
                                                        Imported<T, M, ModelType> const& imported) {
  GatheredModel<T> all = gather_model(trainer, -1);
  std::map<std::string, std::vector<T>> out;
  for (auto const& b : imported.bindings) {
    std::string const key =
        std::string(b.buffer ? "buffers/" : "") + "layer" + std::to_string(b.layer) + "." + b.param;
    auto const it = all.tensors.find(key);
    if (it == all.tensors.end() || it->second.size() != b.rows * b.cols)
      throw OnnxError("telar::onnx::gather_parameters: the model has no tensor '" + key + "' of " +
                      std::to_string(b.rows * b.cols) + " values for initializer '" +
                      b.initializer + "'");
    out[b.initializer] = std::move(it->second);
  }
  return out;
}

/*! \brief Writes the imported graph with its initializers replaced by
 *  \p values (as gather_parameters returns them) to \p path.
 *  \param imported the import the values belong to
 *  \param values initializer name -> values in Telar's layout
 *  \param path the .onnx file to write
 *  \throws OnnxError when a value is missing or has the wrong size, or the
 *  file cannot be written */
template <class T, class M, class ModelType>
void export_model(Imported<T, M, ModelType> const& imported,
                  std::map<std::string, std::vector<T>> const& values, std::string const& path) {
  ::onnx::ModelProto m = *imported.proto;
  std::map<std::string, ParameterBinding const*> by_name;
  for (auto const& b : imported.bindings)
    by_name[b.initializer] = &b;
  auto write = [&](::onnx::TensorProto& t) {
    auto const it = by_name.find(t.name());
    if (it == by_name.end())
      return;
    ParameterBinding const& b = *it->second;
    auto const v = values.find(t.name());
    if (v == values.end() || v->second.size() != b.rows * b.cols)
      throw OnnxError(
          "telar::onnx::export_model: no values (or the wrong count) for initializer '" + t.name() +
          "' of layer " + std::to_string(b.layer));
    std::vector<float> f(b.rows * b.cols);
    for (std::size_t i = 0; i < b.rows; ++i)
      for (std::size_t j = 0; j < b.cols; ++j)
        f[b.transpose ? j * b.rows + i : i * b.cols + j] = float(v->second[i * b.cols + j]);
    t.clear_float_data();
    t.set_raw_data(std::string(reinterpret_cast<char const*>(f.data()), f.size() * sizeof(float)));
  };
  for (auto& t : *m.mutable_graph()->mutable_initializer())
    write(t);
  for (auto& n : *m.mutable_graph()->mutable_node()) // constants folded into Constant nodes
    if (n.op_type() == "Constant" && n.output_size() == 1)
      for (auto& a : *n.mutable_attribute())
        if (a.name() == "value" && by_name.count(n.output(0)))
          write(*a.mutable_t());
  // PyTorch shares equal initializers between modules through Identity
  // nodes; each trained copy becomes an initializer of the Identity's name.
  std::map<std::string, ::onnx::TensorProto> source;
  for (auto const& t : imported.proto->graph().initializer())
    source[t.name()] = t;
  google::protobuf::RepeatedPtrField<::onnx::NodeProto> kept;
  for (auto& n : *m.mutable_graph()->mutable_node()) {
    if (n.op_type() == "Identity" && n.input_size() == 1 && by_name.count(n.output(0)) &&
        source.count(n.input(0)) && !source.count(n.output(0))) {
      ::onnx::TensorProto t = source.at(n.input(0));
      t.set_name(n.output(0));
      write(t);
      *m.mutable_graph()->add_initializer() = std::move(t);
      continue;
    }
    *kept.Add() = n;
  }
  m.mutable_graph()->mutable_node()->Swap(&kept);
  std::ofstream os(path, std::ios::binary | std::ios::trunc);
  if (!os || !m.SerializeToOstream(&os) || !os.flush())
    throw OnnxError("telar::onnx::export_model: cannot write '" + path + "'");
}

/*! \brief Gathers a trainer's parameters and writes the trained model on rank
 *  \p root of the trainer's ranks (collective).
 *  \param trainer a telar::Trainer over \p imported's model
 *  \param imported what the model was imported from
 *  \param path the .onnx file to write \param root the rank that writes */
template <class Trainer, class T, class M, class ModelType>
void export_trained(Trainer& trainer, Imported<T, M, ModelType> const& imported,
                    std::string const& path, int root = 0) {
  auto const values = gather_parameters(trainer, imported);
  if (trainer.rank() == root)
    export_model(imported, values, path);
}

} // namespace telar::onnx
