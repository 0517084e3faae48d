#pragma once
// Placing the mapped nodes: chains and DynamicGraph runs: members of
// telar::onnx::detail::GraphReader (import_graph.hpp, which includes this
// file at its end).
#include <telar/onnx/detail/import_graph.hpp>

namespace telar::onnx::detail {

// The graph output stored as [batch, ...].
template <class T, class M>
void GraphReader<T, M>::output_in_place() {
  for (auto const& n : g_.node())
    if (n.output_size() > 0 && n.output(0) == plan_.output_name &&
        shapes_.count(resolve(n.output(0))))
      plain(n, n.output(0), "the graph output");
}

// Every node must lead to the output (its parameters would get no gradient).
template <class T, class M>
void GraphReader<T, M>::check_reach(std::string const& out) const {
  std::set<std::string> needed{out};
  for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it) {
    if (!needed.count(it->output))
      fail(it->label + ": its result '" + it->output + "' does not reach the graph output '" +
           plan_.output_name + "'");
    needed.insert(it->inputs.begin(), it->inputs.end());
  }
}

// A layer that alone reads the only live tensor joins the chain; every run
// of other nodes becomes one DynamicGraph from the live tensor before it
// to the one after it.
template <class T, class M>
void GraphReader<T, M>::place(std::string const& out) {
  std::map<std::string, std::size_t> left; // readers not yet placed
  for (auto const& nd : nodes_)
    for (auto const& in : nd.inputs)
      ++left[in];
  std::set<std::string> live{plan_.input_name};
  std::vector<std::size_t> run;
  std::string run_in;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    Ir& nd = nodes_[i];
    bool const chain = nd.kind == Ir::layer && live.size() == 1 && *live.begin() == nd.inputs[0] &&
                       left[nd.inputs[0]] == 1;
    if (chain) {
      flush(run, run_in, nd.inputs[0]);
      place_layer(nd, "", std::move(*nd.op));
    } else {
      if (run.empty())
        run_in = *live.begin();
      run.push_back(i);
    }
    for (auto const& in : nd.inputs)
      if (--left[in] == 0)
        live.erase(in);
    if (left[nd.output] > 0 || nd.output == out)
      live.insert(nd.output);
  }
  flush(run, run_in, out);
}

// Every node in one DynamicGraph from the graph input to \p out.
template <class T, class M>
void GraphReader<T, M>::place_all(std::string const& out) {
  std::vector<std::size_t> run(nodes_.size());
  for (std::size_t i = 0; i < run.size(); ++i)
    run[i] = i;
  flush(run, plan_.input_name, out);
}

template <class T, class M>
template <class L>
void GraphReader<T, M>::place_layer(Ir& nd, std::string const& prefix, L&& layer) {
  for (auto b : nd.bindings) {
    b.layer = plan_.layers.size();
    b.param = prefix + b.param;
    plan_.bindings.push_back(std::move(b));
  }
  std::visit([&](auto& l) { plan_.layers.push_back(std::move(l)); }, layer);
}

template <class T, class M>
void GraphReader<T, M>::flush(std::vector<std::size_t>& run, std::string const& in,
                              std::string const& out) {
  if (run.empty())
    return;
  DynamicGraph<NodeLayer<T, M>> g(in);
  for (std::size_t i : run) {
    Ir& nd = nodes_[i];
    if (nd.kind == Ir::layer)
      g.add(nd.name, std::move(*nd.op), nd.inputs[0], nd.output);
    else if (nd.kind == Ir::add)
      g.add_add(nd.name, nd.inputs, nd.output);
    else if (nd.kind == Ir::concat)
      g.add_concat(nd.name, nd.inputs, nd.output);
    else if (nd.kind == Ir::matmul)
      g.add_matmul(nd.name, nd.inputs, nd.output);
    else if (nd.kind == Ir::sub)
      g.add_sub(nd.name, nd.inputs, nd.output);
    else if (nd.kind == Ir::div)
      g.add_div(nd.name, nd.inputs, nd.output);
    else
      g.add_mul(nd.name, nd.inputs, nd.output);
    for (auto b : nd.bindings) {
      b.layer = plan_.layers.size();
      b.param = nd.name + "." + b.param;
      plan_.bindings.push_back(std::move(b));
    }
  }
  g.set_output(out);
  plan_.layers.push_back(std::move(g));
  run.clear();
}

} // namespace telar::onnx::detail
