// What telar/core/detail/graph_topology.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/core/detail/graph_topology.hpp>

namespace telar::detail {

TELAR_DECL char const* graph_op_name(GraphOp op) {
  switch (op) {
  case GraphOp::add:
    return "Add";
  case GraphOp::concat:
    return "Concat";
  case GraphOp::mul:
    return "Mul";
  case GraphOp::matmul:
    return "MatMul";
  case GraphOp::sub:
    return "Sub";
  case GraphOp::div:
    return "Div";
  default:
    return "layer";
  }
}

TELAR_DECL std::string graph_inputs_str(GraphNode const& n, std::vector<Shape> const& in) {
  std::string s;
  for (std::size_t i = 0; i < in.size(); ++i)
    s += (i ? ", '" : "'") + n.inputs[i] + "' " + in[i].str();
  return s;
}

TELAR_DECL Shape graph_matmul_shape(Shape const& a, Shape const& b) {
  if (a.rank < 2 || a.rank != b.rank || a[a.rank - 1] != b[b.rank - 2])
    return Shape();
  for (int d = 0; d + 2 < a.rank; ++d)
    if (a[d] != b[d])
      return Shape();
  Shape out = a;
  out.dims[std::size_t(a.rank - 1)] = b[b.rank - 1];
  return out;
}

TELAR_DECL Shape graph_join_shape(GraphNode const& n, std::vector<Shape> const& in) {
  auto const fail = [&](std::string const& why) {
    return ShapeError("telar::DynamicGraph: " + std::string(graph_op_name(n.op)) + " node '" +
                      n.name + "' joins " + graph_inputs_str(n, in) + ": " + why);
  };
  Shape out = in[0];
  if (n.op == GraphOp::add && in.size() > 2) {
    for (Shape const& s : in)
      if (s != out)
        throw fail("an Add of three inputs or more needs equal shapes (of two, one may be "
                   "spread: one value per channel or per sample)");
  } else if (n.op == GraphOp::concat) {
    for (std::size_t i = 1; i < in.size(); ++i) {
      Shape rest = in[i];
      rest.dims[0] = out.dims[0];
      if (rest != out)
        throw fail("a Concat needs equal shapes but for the first (channel) dimension");
      out.dims[0] += in[i].dims[0];
    }
  } else if (n.op == GraphOp::matmul) {
    out = graph_matmul_shape(in[0], in[1]);
    if (!out.known())
      throw fail("a MatMul needs [..., M, K] and [..., K, N] with equal leading extents");
  } else { // add, mul, sub, div: element-wise, one side possibly spread (graph_elementwise)
    out = in[0].size() >= in[1].size() ? in[0] : in[1];
    for (Shape const& s : in)
      if (s != out && !(s.size() == out[0] && s[0] == out[0]) && s.size() != 1)
        throw fail(std::string(n.op == GraphOp::add ? "an " : "a ") + graph_op_name(n.op) +
                   " needs equal shapes, or one of [C] or [C, 1, 1] (one value per channel) or "
                   "[1] (one per sample) against [C, ...]");
  }
  return out;
}

TELAR_DECL std::size_t GraphTopology::add(std::string name, GraphOp op,
                                          std::vector<std::string> inputs, std::string output) {
  std::string const what = "telar::DynamicGraph: node '" + name + "'";
  if (name.empty() || output.empty())
    throw Error("telar::DynamicGraph: a node needs a name and an output tensor name");
  for (GraphNode const& n : nodes_)
    if (n.name == name)
      throw Error(what + " is added twice: node names must be unique");
  std::size_t const k = inputs.size();
  bool const pair = op != GraphOp::add && op != GraphOp::concat;
  if (op == GraphOp::layer ? k != 1 : pair ? k != 2 : k < 2)
    throw Error(what + " (" + graph_op_name(op) + ") takes " +
                (op == GraphOp::layer ? "one input"
                 : pair               ? "two inputs"
                                      : "two inputs or more") +
                ", not " + std::to_string(k));
  nodes_.push_back({std::move(name), op, std::move(inputs), std::move(output), {}, 0});
  ready_ = false;
  return nodes_.size() - 1;
}

TELAR_DECL void GraphTopology::finalize() {
  if (ready_)
    return;
  if (nodes_.empty())
    throw Error("telar::DynamicGraph: the graph has no node");
  index_tensors();
  sort();
  check_reach();
  ready_ = true;
}

TELAR_DECL void GraphTopology::index_tensors() {
  std::map<std::string, std::size_t> id{{input_, 0}};
  tensors_ = {input_};
  producer_ = {none};
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    GraphNode& n = nodes_[i];
    auto const [it, fresh] = id.emplace(n.output, tensors_.size());
    if (!fresh)
      throw Error("telar::DynamicGraph: tensor '" + n.output + "' is produced by node '" + n.name +
                  "' and " +
                  (it->second == 0 ? std::string("is the graph input")
                                   : "by node '" + nodes_[producer_[it->second]].name + "'"));
    n.out_id = it->second;
    tensors_.push_back(n.output);
    producer_.push_back(i);
  }
  consumers_.assign(tensors_.size(), 0);
  for (GraphNode& n : nodes_) {
    n.in_ids.clear();
    for (std::string const& t : n.inputs) {
      auto const it = id.find(t);
      if (it == id.end())
        throw Error("telar::DynamicGraph: node '" + n.name + "' reads tensor '" + t +
                    "', which no node produces and which is not the graph input '" + input_ + "'");
      n.in_ids.push_back(it->second);
      ++consumers_[it->second];
    }
  }
  auto const out = id.find(output_);
  if (output_.empty() || out == id.end() || out->second == 0)
    throw Error("telar::DynamicGraph: the graph output '" + output_ +
                "' is produced by no node (call set_output with a node's output tensor)");
  output_id_ = out->second;
}

TELAR_DECL void GraphTopology::sort() {
  std::vector<std::size_t> waiting(nodes_.size(), 0);
  std::set<std::size_t> ready;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    for (std::size_t t : nodes_[i].in_ids)
      waiting[i] += producer_[t] != none;
    if (waiting[i] == 0)
      ready.insert(i);
  }
  order_.clear();
  while (!ready.empty()) {
    std::size_t const i = *ready.begin();
    ready.erase(ready.begin());
    order_.push_back(i);
    for (std::size_t j = 0; j < nodes_.size(); ++j)
      for (std::size_t t : nodes_[j].in_ids)
        if (t == nodes_[i].out_id && --waiting[j] == 0)
          ready.insert(j);
  }
  if (order_.size() != nodes_.size())
    throw Error("telar::DynamicGraph: the graph is not acyclic: " + cycle() +
                " (each node reads a tensor the one before it produces)");
}

TELAR_DECL std::string GraphTopology::cycle() const {
  std::vector<bool> done(nodes_.size(), false);
  for (std::size_t i : order_)
    done[i] = true;
  std::size_t cur = std::size_t(std::find(done.begin(), done.end(), false) - done.begin());
  std::vector<std::size_t> path;
  while (std::find(path.begin(), path.end(), cur) == path.end()) {
    path.push_back(cur);
    for (std::size_t t : nodes_[cur].in_ids)
      if (producer_[t] != none && !done[producer_[t]]) {
        cur = producer_[t];
        break;
      }
  }
  path.erase(path.begin(), std::find(path.begin(), path.end(), cur));
  std::string s = "'" + nodes_[cur].name + "'";
  for (auto it = path.rbegin(); it != path.rend(); ++it)
    s += " -> '" + nodes_[*it].name + "'";
  return s;
}

TELAR_DECL void GraphTopology::check_reach() const {
  std::vector<bool> live(nodes_.size(), false);
  std::vector<std::size_t> todo{producer_[output_id_]};
  while (!todo.empty()) {
    std::size_t const i = todo.back();
    todo.pop_back();
    if (live[i])
      continue;
    live[i] = true;
    for (std::size_t t : nodes_[i].in_ids)
      if (producer_[t] != none)
        todo.push_back(producer_[t]);
  }
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    if (!live[i])
      throw Error("telar::DynamicGraph: node '" + nodes_[i].name + "' produces '" +
                  nodes_[i].output + "', which does not reach the graph output '" + output_ +
                  "': remove the node or use its result");
}

} // namespace telar::detail
