#pragma once
// Reading ONNX protobuf messages: tensors, attributes, the graph's tensor
// producers and consumers. Host only.
#include <telar/onnx/error.hpp>

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace telar::onnx::detail {

inline std::string data_type_name(int t) {
  return ::onnx::TensorProto_DataType_IsValid(t)
             ? ::onnx::TensorProto_DataType_Name(::onnx::TensorProto_DataType(t))
             : "type " + std::to_string(t);
}

// "node 'fc1' (Gemm)" in a message; PyTorch names nodes "/1/Gemm".
inline std::string node_label(::onnx::NodeProto const& n) {
  return "node '" + (n.name().empty() ? n.output(0) : n.name()) + "' (" + n.op_type() + ")";
}

// "[3, 4, 5]": a constant's dimensions, for messages.
inline std::string dims_str(::onnx::TensorProto const& t) {
  std::string s;
  for (auto e : t.dims())
    s += (s.empty() ? "" : ", ") + std::to_string(e);
  return "[" + s + "]";
}

// \p who: the function messages name (import_model, import_graph).
inline std::shared_ptr<::onnx::ModelProto> read_model(std::string const& path,
                                                      std::string const& who) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw OnnxError(who + ": cannot open '" + path + "'");
  auto m = std::make_shared<::onnx::ModelProto>();
  if (!m->ParseFromIstream(&in))
    throw OnnxError(who + ": '" + path + "' is not an ONNX model (protobuf parse failed)");
  return m;
}

inline std::vector<float> floats_of(::onnx::TensorProto const& t) {
  if (t.data_location() == ::onnx::TensorProto::EXTERNAL)
    throw OnnxError("telar::onnx: tensor '" + t.name() +
                    "' keeps its data in an external file, which is not supported (save the "
                    "model with its weights inside: onnx.save(model, path))");
  std::size_t n = 1;
  for (auto d : t.dims())
    n *= std::size_t(d);
  std::vector<float> v(n);
  if (t.has_raw_data()) {
    if (t.raw_data().size() != n * sizeof(float))
      throw OnnxError("telar::onnx: tensor '" + t.name() + "' holds " +
                      std::to_string(t.raw_data().size()) + " bytes, expected " +
                      std::to_string(n * sizeof(float)));
    std::memcpy(v.data(), t.raw_data().data(), n * sizeof(float)); // little-endian hosts
  } else {
    if (std::size_t(t.float_data_size()) != n)
      throw OnnxError("telar::onnx: tensor '" + t.name() + "' holds " +
                      std::to_string(t.float_data_size()) + " values, expected " +
                      std::to_string(n));
    for (std::size_t i = 0; i < n; ++i)
      v[i] = t.float_data(int(i));
  }
  return v;
}

inline std::vector<std::int64_t> ints_of(::onnx::TensorProto const& t) {
  std::size_t n = 1;
  for (auto d : t.dims())
    n *= std::size_t(d);
  std::vector<std::int64_t> v(n);
  if (t.has_raw_data() && t.raw_data().size() == n * sizeof(std::int64_t))
    std::memcpy(v.data(), t.raw_data().data(), n * sizeof(std::int64_t));
  else if (std::size_t(t.int64_data_size()) == n)
    for (std::size_t i = 0; i < n; ++i)
      v[i] = t.int64_data(int(i));
  else
    throw OnnxError("telar::onnx: tensor '" + t.name() + "' is not an int64 tensor of " +
                    std::to_string(n) + " values");
  return v;
}

// BOOL tensors keep one byte per value in raw_data, or one int32 each.
inline std::vector<bool> bools_of(::onnx::TensorProto const& t) {
  std::size_t n = 1;
  for (auto d : t.dims())
    n *= std::size_t(d);
  std::vector<bool> v(n);
  if (t.has_raw_data() && t.raw_data().size() == n)
    for (std::size_t i = 0; i < n; ++i)
      v[i] = t.raw_data()[i] != 0;
  else if (std::size_t(t.int32_data_size()) == n)
    for (std::size_t i = 0; i < n; ++i)
      v[i] = t.int32_data(int(i)) != 0;
  else
    throw OnnxError("telar::onnx: tensor '" + t.name() + "' is not a boolean tensor of " +
                    std::to_string(n) + " values");
  return v;
}

// The values of a FLOAT, DOUBLE, INT64, INT32 or BOOL tensor as doubles
// (constants compared at import).
inline std::vector<double> numbers_of(::onnx::TensorProto const& t) {
  std::vector<double> v;
  switch (t.data_type()) {
  case ::onnx::TensorProto::FLOAT:
    for (float const x : floats_of(t))
      v.push_back(x);
    return v;
  case ::onnx::TensorProto::INT64:
    for (std::int64_t const x : ints_of(t))
      v.push_back(double(x));
    return v;
  case ::onnx::TensorProto::BOOL:
    for (bool const x : bools_of(t))
      v.push_back(x ? 1 : 0);
    return v;
  default:
    break;
  }
  std::size_t n = 1;
  for (auto d : t.dims())
    n *= std::size_t(d);
  if (t.data_type() == ::onnx::TensorProto::DOUBLE && std::size_t(t.double_data_size()) == n)
    return std::vector<double>(t.double_data().begin(), t.double_data().end());
  if (t.data_type() == ::onnx::TensorProto::INT32 && std::size_t(t.int32_data_size()) == n)
    return std::vector<double>(t.int32_data().begin(), t.int32_data().end());
  if (t.has_raw_data() && t.data_type() == ::onnx::TensorProto::DOUBLE &&
      t.raw_data().size() == n * sizeof(double)) {
    v.resize(n);
    std::memcpy(v.data(), t.raw_data().data(), n * sizeof(double));
    return v;
  }
  if (t.has_raw_data() && t.data_type() == ::onnx::TensorProto::INT32 &&
      t.raw_data().size() == n * sizeof(std::int32_t)) {
    std::vector<std::int32_t> w(n);
    std::memcpy(w.data(), t.raw_data().data(), n * sizeof(std::int32_t));
    return std::vector<double>(w.begin(), w.end());
  }
  throw OnnxError("telar::onnx: tensor '" + t.name() + "' of data type " +
                  data_type_name(t.data_type()) +
                  " holds no values Telar reads (float32, float64, int64, int32, bool)");
}

inline ::onnx::AttributeProto const* find_attr(::onnx::NodeProto const& n, char const* name) {
  for (auto const& a : n.attribute())
    if (a.name() == name)
      return &a;
  return nullptr;
}
inline std::int64_t int_attr(::onnx::NodeProto const& n, char const* name, std::int64_t def) {
  auto const* a = find_attr(n, name);
  return a ? a->i() : def;
}
inline float float_attr(::onnx::NodeProto const& n, char const* name, float def) {
  auto const* a = find_attr(n, name);
  return a ? a->f() : def;
}
inline std::vector<std::int64_t> ints_attr(::onnx::NodeProto const& n, char const* name,
                                           std::vector<std::int64_t> def) {
  auto const* a = find_attr(n, name);
  return a ? std::vector<std::int64_t>(a->ints().begin(), a->ints().end()) : def;
}
inline std::string string_attr(::onnx::NodeProto const& n, char const* name, std::string def) {
  auto const* a = find_attr(n, name);
  return a ? a->s() : def;
}

// Who makes and who reads each tensor; constants (initializers and Constant
// nodes) by name. Constant nodes are literals: PyTorch writes its
// parameters and buffers as initializers, and the values a forward writes
// out (`x + 1.0`, `torch.tensor([...])`) as Constant nodes.
struct GraphIndex {
  std::map<std::string, ::onnx::TensorProto const*> constants;
  std::set<std::string> literals; // the outputs of Constant nodes
  std::map<std::string, std::vector<::onnx::NodeProto const*>> consumers;
  std::set<::onnx::NodeProto const*> aliases; // Identity nodes of a constant

  explicit GraphIndex(::onnx::GraphProto const& g) {
    for (auto const& t : g.initializer())
      constants[t.name()] = &t;
    for (auto const& n : g.node()) {
      if (n.op_type() == "Constant" && n.output_size() == 1) {
        if (auto const* v = find_attr(n, "value")) {
          constants[n.output(0)] = &v->t();
          literals.insert(n.output(0));
        }
        continue;
      }
      // PyTorch shares one initializer between uses through Identity nodes.
      if (n.op_type() == "Identity" && n.input_size() == 1 && constants.count(n.input(0))) {
        constants[n.output(0)] = constants[n.input(0)];
        if (literals.count(n.input(0)))
          literals.insert(n.output(0));
        aliases.insert(&n);
        continue;
      }
      for (auto const& in : n.input())
        if (!in.empty() && !constants.count(in))
          consumers[in].push_back(&n);
    }
  }
  bool is_constant(std::string const& name) const { return constants.count(name) > 0; }
  // A Constant node's value (fixed when imported), not an initializer.
  bool is_literal(std::string const& name) const { return literals.count(name) > 0; }
  ::onnx::TensorProto const* constant(std::string const& name) const {
    auto it = constants.find(name);
    return it == constants.end() ? nullptr : it->second;
  }
  std::vector<::onnx::NodeProto const*> const& readers(std::string const& name) const {
    static std::vector<::onnx::NodeProto const*> const none;
    auto it = consumers.find(name);
    return it == consumers.end() ? none : it->second;
  }
  // A float constant with a single value, or NaN.
  float scalar(std::string const& name) const {
    auto const* t = constant(name);
    if (!t || t->data_type() != ::onnx::TensorProto::FLOAT)
      return std::numeric_limits<float>::quiet_NaN();
    auto const v = floats_of(*t);
    return v.size() == 1 ? v[0] : std::numeric_limits<float>::quiet_NaN();
  }
};

} // namespace telar::onnx::detail
