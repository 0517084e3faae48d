#pragma once
// The structure of a telar::DynamicGraph, independent of its layer types:
// named nodes that read and write named tensors, checked and ordered once.
// Kept apart from the layer variant so it is compiled once per translation
// unit, whatever the variant, and its errors are plain host code.
#include <telar/core/detail/decl.hpp>
#include <telar/core/error.hpp>
#include <telar/core/shape.hpp>

#include <algorithm>
#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace telar::detail {

// What a node computes: a layer (one input) or a join of several inputs.
enum class GraphOp { layer, add, concat, mul, matmul, sub, div };

TELAR_DECL char const* graph_op_name(GraphOp op);

struct GraphNode {
  std::string name;
  GraphOp op = GraphOp::layer;
  std::vector<std::string> inputs;
  std::string output;
  std::vector<std::size_t> in_ids; // tensor ids of inputs (after finalize)
  std::size_t out_id = 0;          // tensor id of output (after finalize)
};

// "'h1' [8], 'h2' [4]": a node's inputs with their shapes, for messages.
TELAR_DECL std::string graph_inputs_str(GraphNode const& n, std::vector<Shape> const& in);

// [P..., M, N] of a batched product [P..., M, K] x [P..., K, N] (rank 2 to
// 4 per sample); an unknown Shape when the two do not match.
TELAR_DECL Shape graph_matmul_shape(Shape const& a, Shape const& b);

// Output shape of a join; ShapeError naming the node and its inputs.
// Add of three or more: equal shapes. Concat: along the first per-sample
// dimension (channels), the others equal. Add of two, Mul, Sub, Div: equal
// shapes, or one input per channel ([C] or [C, 1, 1]: as many elements as
// the other's first dimension) or per sample (one element) against [C, ...].
TELAR_DECL Shape graph_join_shape(GraphNode const& n, std::vector<Shape> const& in);

class GraphTopology {
public:
  static constexpr std::size_t none = std::size_t(-1);

  // Appends a node; checks its name and the number of its inputs.
  TELAR_DECL std::size_t add(std::string name, GraphOp op, std::vector<std::string> inputs,
                             std::string output);
  void set_input(std::string name) { input_ = std::move(name), ready_ = false; }
  void set_output(std::string name) { output_ = std::move(name), ready_ = false; }
  std::string const& input() const { return input_; }
  std::string const& output() const { return output_; }
  std::vector<GraphNode> const& nodes() const { return nodes_; }
  bool ready() const { return ready_; }

  // Checks the graph and orders its nodes; each failure an Error naming the
  // nodes and tensors at fault.
  TELAR_DECL void finalize();

  std::vector<std::size_t> const& order() const { return order_; } // topological
  std::size_t tensor_count() const { return tensors_.size(); }
  std::string const& tensor_name(std::size_t t) const { return tensors_[t]; }
  std::size_t output_id() const { return output_id_; }
  std::size_t producer(std::size_t t) const { return producer_[t]; } // none: the input
  std::size_t consumers(std::size_t t) const { return consumers_[t]; }

private:
  // Tensor ids (0: the graph input, then node outputs in node order) and
  // their producers and consumer counts.
  TELAR_DECL void index_tensors();

  // Kahn's algorithm, ready nodes in the order they were added (a chain keeps
  // its order); a node left over lies on or after a cycle.
  TELAR_DECL void sort();

  // "'a' -> 'b' -> 'a'": walks producers back from an unordered node (each
  // has an unordered producer) until a node repeats: that node is on a cycle.
  TELAR_DECL std::string cycle() const;

  // Refuses a node whose result reaches nothing: its parameters would get no
  // gradient and its work would be wasted; usually a wiring mistake.
  TELAR_DECL void check_reach() const;

  std::vector<GraphNode> nodes_;
  std::string input_ = "input", output_;
  bool ready_ = false;
  std::vector<std::string> tensors_;
  std::vector<std::size_t> producer_, consumers_, order_;
  std::size_t output_id_ = 0;
};

} // namespace telar::detail

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/core/detail/graph_topology.ipp>
#endif
