#pragma once
/*! \file
 *  \brief Trained parameters back into the imported ONNX graph: the same
 *  nodes, the initializers replaced, so PyTorch or onnx load it again. */
#include <telar/core/layer.hpp>
#include <telar/onnx/detail/import_graph.hpp>
#include <telar/onnx/detail/proto.hpp>
#include <telar/onnx/error.hpp>
#include <telar/onnx/import.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

namespace telar::onnx {

/*! \brief Full values (Telar's layout, every rank's shard put together) of
 *  every parameter and buffer (BatchNorm's running statistics) of a
 *  trainer's imported model, by initializer name, on every rank (collective
 *  over the trainer's ranks).
 *  \param trainer a telar::Trainer over \p imported's model
 *  \param imported what the model was imported from
 *  \return initializer name -> values [rows * cols] */
template <class Trainer, class T, class M>
std::map<std::string, std::vector<T>> gather_parameters(Trainer& trainer,
                                                        Imported<T, M> const& imported) {
  std::vector<T> const flat = trainer.parameters(); // this rank's tensors, entries' order
  auto const& entries = trainer.parameter_store().entries();
  auto const at = trainer.grid_coords();
  std::map<std::string, std::vector<T>> out;
  for (auto const& b : imported.bindings)
    out[b.initializer].assign(b.rows * b.cols, T(0));
  std::size_t pos = 0;
  for (auto const& e : entries) {
    for (auto const& b : imported.bindings) {
      if (b.layer != e.layer || e.name != "layer" + std::to_string(b.layer) + "." + b.param)
        continue;
      std::visit(
          [&](auto const& l) {
            detail::Block const blk = detail::block_of(l, b.param, b.rows, b.cols);
            if (at.dp != 0 || (blk.replicated && at.tp != 0))
              return; // another rank adds these values
            if (blk.rows * blk.cols != e.size)
              throw OnnxError("telar::onnx::gather_parameters: layer " + std::to_string(b.layer) +
                              " '" + b.param + "' holds " + std::to_string(e.size) +
                              " values here, expected " + std::to_string(blk.rows * blk.cols));
            auto& full = out[b.initializer];
            for (std::size_t i = 0; i < blk.rows; ++i)
              for (std::size_t j = 0; j < blk.cols; ++j)
                full[(blk.row0 + i) * b.cols + blk.col0 + j] = flat[pos + i * blk.cols + j];
          },
          trainer.model().layer(e.layer));
    }
    pos += e.size;
  }
  for (auto const& b : imported.bindings) // buffers: equal on every replica; one rank adds them
    if (b.buffer && at.dp == 0 && at.tp == 0)
      std::visit(
          [&](auto& l) {
            auto f = [&](char const* name, auto& view) {
              if (name != b.param || view.size() != b.rows * b.cols)
                return; // another buffer, or a layer of another pipeline stage
              auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, view);
              std::copy(h.data(), h.data() + h.size(), out[b.initializer].begin());
            };
            telar::detail::prefixed_buffers(l, "", f);
          },
          trainer.model().layer(b.layer));
  if (auto const* grid = trainer.grid(); grid && grid->world().size() > 1) {
    MPI_Datatype const type = std::is_same_v<T, double> ? MPI_DOUBLE : MPI_FLOAT;
    for (auto& [name, v] : out)
      MPI_Allreduce(MPI_IN_PLACE, v.data(), int(v.size()), type, MPI_SUM, grid->world().native());
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
template <class T, class M>
void export_model(Imported<T, M> const& imported,
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
template <class Trainer, class T, class M>
void export_trained(Trainer& trainer, Imported<T, M> const& imported, std::string const& path,
                    int root = 0) {
  auto const values = gather_parameters(trainer, imported);
  if (trainer.rank() == root)
    export_model(imported, values, path);
}

} // namespace telar::onnx
