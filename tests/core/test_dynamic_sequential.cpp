// telar::DynamicSequential (layers chosen at run time) trains exactly as the
// telar::Sequential of the same layers: the same parameters, bit for bit,
// serial and under dp, pp and tp at 2 ranks; DynamicResidual as Residual.
// telar::DynamicGraph: a chain trains as the DynamicSequential of its layers,
// joins match hand-written references, gradients through tensors read by
// several nodes match finite differences, dp and ZeRO-3 match serial, and
// each malformed graph is refused with a message naming the fault; a node
// range recomputed in backward (DynamicGraph::recompute) gives the plain
// graph's gradients.
#include "support.hpp"

#include <telar/core/dynamic_graph.hpp>
#include <telar/core/dynamic_sequential.hpp>
#include <telar/core/graph_chain.hpp>
#include <telar/core/residual.hpp>
#include <telar/data/synthetic.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/batch_norm.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/dropout.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/parallel/precision.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/testing/check_gradients.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <mpi.h>

#include <cmath>
#include <string>
#include <variant>
#include <vector>

namespace {

using T = float;
using D = telar::Dense<T>;
using Col = telar::ColumnParallel<D>;
using Row = telar::RowParallel<D>;
using Static = telar::Sequential<Col, telar::ReLU<T>, Row, telar::Residual<D, telar::Tanh<T>>,
                                 telar::Sigmoid<T>, D>;
using Branch = std::variant<D, telar::Tanh<T>>;
using Dynamic = telar::DynamicSequential<
    std::variant<Col, Row, D, telar::ReLU<T>, telar::Sigmoid<T>, telar::DynamicResidual<Branch>>>;
using Full =
    telar::Strategy<telar::DataParallel<>, telar::PipelineParallel<>, telar::TensorParallel<>>;

Static make_static() {
  return Static(Col(10, 16), {}, Row(16, 8), telar::Residual<D, telar::Tanh<T>>(D(8, 8), {}), {},
                D(8, 3));
}
Dynamic make_dynamic() {
  Dynamic m;
  m.push_back(Col(10, 16));
  m.push_back(telar::ReLU<T>{});
  m.push_back(Row(16, 8));
  telar::DynamicSequential<Branch> body;
  body.push_back(D(8, 8));
  body.push_back(telar::Tanh<T>{});
  m.push_back(telar::DynamicResidual<Branch>(body));
  m.push_back(telar::Sigmoid<T>{});
  m.push_back(D(8, 3));
  return m;
}

template <class Model, class StrategyT = Full>
std::vector<T> train(MPI_Comm comm, Model model, telar::GridShape grid,
                     std::vector<std::size_t> stage_boundaries = {}) {
  std::size_t const batch = 8, steps = 3;
  auto ds = telar::make_synthetic(batch * steps, 10, 3, 5);
  telar::Matrix<T> x("x", batch * steps, 10);
  telar::Labels<> y("y", batch * steps);
  auto hx = Kokkos::create_mirror_view(x);
  auto hy = Kokkos::create_mirror_view(y);
  for (std::size_t i = 0; i < batch * steps; ++i) {
    hy(i) = ds.y[i];
    for (std::size_t j = 0; j < 10; ++j)
      hx(i, j) = T(ds.x[i * 10 + j]);
  }
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(y, hy);
  telar::TrainerOptions o;
  o.grid = grid;
  o.microbatches = grid.pp > 1 ? 2 : 1;
  if (grid.pp > 1)
    o.stage_boundaries = std::move(stage_boundaries);
  o.lr = telar::constant_lr(0.1);
  telar::Trainer<Model, StrategyT, telar::SGD<T>> trainer(comm, std::move(model), {}, o, 10);
  std::size_t const local = batch / std::size_t(trainer.grid_shape().dp);
  for (std::size_t s = 0; s < steps; ++s) {
    std::size_t const b = s * batch + std::size_t(trainer.grid_coords().dp) * local;
    trainer.step(telar::rows(x, b, b + local), telar::rows(y, b, b + local));
  }
  return trainer.parameters();
}

} // namespace

TEST_CASE("DynamicSequential trains as the Sequential of the same layers", "[dynamic]") {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  // Collective calls in a fixed order on every rank.
  auto const dyn = train(MPI_COMM_SELF, make_dynamic(), {1, 1, 1});
  auto const ref = train(MPI_COMM_SELF, make_static(), {1, 1, 1});
  CHECK(dyn == ref);
  if (n != 2)
    return;
  for (telar::GridShape g :
       {telar::GridShape{2, 1, 1}, telar::GridShape{1, 2, 1}, telar::GridShape{1, 1, 2}}) {
    INFO("dp=" << g.dp << " pp=" << g.pp << " tp=" << g.tp);
    auto const d = train(MPI_COMM_WORLD, make_dynamic(), g);
    auto const s = train(MPI_COMM_WORLD, make_static(), g);
    CHECK(d == s);
  }
}

// Under Precision<bf16, float> a DynamicSequential is rebound alternative by
// alternative (DynamicResidual's body too): it trains as the Sequential of
// the same layers under the same policy, bit for bit, serially and at dp = 2.
// Its initializer hook, which takes the fp32 variant, is kept: it writes
// into the rebound layers through the fp32 layers on the same views. A
// chain with a hook and a layer that does not convert back is refused.
namespace {
template <class M>
void bf16_dynamic_case() {
  if constexpr (!telar::bf16_layers_supported<T, M>()) {
    SKIP("no bf16 layers in this memory space (neither oneDNN nor cuBLAS)");
  } else {
    if (!telar::bf16_available<M>())
      SKIP("no bf16 instructions here: bf16 is refused, not emulated");
    using P = telar::test::on_space_t<telar::Precision<telar::bf16, float>, M>;
    using Bf16 = telar::Strategy<telar::DataParallel<>, telar::PipelineParallel<>,
                                 telar::TensorParallel<>, P>;
    using Rebound = typename telar::WithPrecision<Dynamic, P>::layer_variant;
    static_assert(std::is_same_v<std::variant_alternative_t<0, Rebound>,
                                 telar::ColumnParallel<telar::Dense<T, M, telar::Bf16Gemm>>>);
    static_assert(std::is_same_v<std::variant_alternative_t<3, Rebound>, telar::ReLU<T>>);
    int n = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    auto const dyn = train<Dynamic, Bf16>(MPI_COMM_SELF, make_dynamic(), {1, 1, 1});
    auto const ref = train<Static, Bf16>(MPI_COMM_SELF, make_static(), {1, 1, 1});
    CHECK(dyn == ref);
    CHECK(dyn != train(MPI_COMM_SELF, make_dynamic(), {1, 1, 1})); // bf16 ran
    if (n == 2)
      CHECK(train<Dynamic, Bf16>(MPI_COMM_WORLD, make_dynamic(), {2, 1, 1}) ==
            train<Static, Bf16>(MPI_COMM_WORLD, make_static(), {2, 1, 1}));
    Dynamic hooked = make_dynamic(); // layer k's parameters all k + 1 (the residual's body too)
    hooked.set_initializer([](std::size_t k, Dynamic::layer_variant& v) {
      std::visit(
          [&](auto& l) {
            if constexpr (telar::layer_traits<std::decay_t<decltype(l)>>::has_parameters)
              l.parameters(
                  [&](char const*, auto& value, auto&) { Kokkos::deep_copy(value, T(k + 1)); });
          },
          v);
    });
    auto rebound = telar::with_precision<P>(hooked);
    rebound.build(telar::Shape{10});
    rebound.initialize(1);
    std::size_t checked = 0;
    rebound.parameters([&](char const* name, auto& value, auto&) {
      auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, value);
      T const want = T(std::stoi(name) + 1); // "<k>.<name>"
      for (std::size_t i = 0; i < h.size(); ++i)
        checked += h.data()[i] == want;
    });
    CHECK(checked == rebound.parameter_count());
    using Nested = telar::DynamicSequential<std::variant<D, telar::Sequential<D, telar::ReLU<T>>>>;
    Nested nested;
    nested.push_back(telar::Sequential<D, telar::ReLU<T>>(D(4, 4), {}));
    nested.set_initializer([](std::size_t, Nested::layer_variant&) {});
    CHECK_THROWS_WITH(telar::with_precision<P>(nested),
                      Catch::Matchers::ContainsSubstring("no converting constructor back"));
  }
}
} // namespace

TEST_CASE("Under Precision<bf16, float> a DynamicSequential trains as its Sequential",
          "[dynamic][bf16]") {
  bf16_dynamic_case<telar::DefaultMemorySpace>();
}

TEST_CASE("DynamicSequential names a layer that cannot take its input", "[dynamic]") {
  Dynamic m = make_dynamic();
  try {
    m.shapes(telar::Shape{7});
    FAIL("no error");
  } catch (telar::ShapeError const& e) {
    CHECK(std::string(e.what()).find("layer 0 (ColumnParallel<Dense>)") != std::string::npos);
  }
}

namespace {

using GLayer = std::variant<Col, Row, D, telar::ReLU<T>, telar::Sigmoid<T>>;
using Graph = telar::DynamicGraph<GLayer>;
// A graph and a classifier: two units, so pp=2 splits at the graph's boundary.
using GraphModel = telar::DynamicSequential<std::variant<Graph, D>>;
using Zero3 = telar::Strategy<telar::DataParallel<telar::RingAllreduce, telar::ZeRO<3>>>;

// make_dynamic's layers but the block: x -> Col -> ReLU -> Row -> Sigmoid.
GraphModel make_chain_graph() {
  Graph g("x");
  g.add("col", Col(10, 16), "x", "h1");
  g.add("relu", telar::ReLU<T>{}, "h1", "h2");
  g.add("row", Row(16, 8), "h2", "h3");
  g.add("sigmoid", telar::Sigmoid<T>{}, "h3", "y");
  g.set_output("y");
  GraphModel m;
  m.push_back(std::move(g));
  m.push_back(D(8, 3));
  return m;
}

// The same layers as a chain, drawn from the streams the graph model's
// nesting gives them (graph node k: mix_seed(mix_seed(seed, 0), k)).
Dynamic make_chain_reference() {
  Dynamic m;
  m.push_back(Col(10, 16));
  m.push_back(telar::ReLU<T>{});
  m.push_back(Row(16, 8));
  m.push_back(telar::Sigmoid<T>{});
  m.push_back(D(8, 3));
  std::uint64_t const seed = telar::TrainerOptions{}.seed;
  m.set_initializer([seed](std::size_t k, auto& layer) {
    std::visit(
        [&](auto& l) {
          using L = std::decay_t<decltype(l)>;
          if constexpr (telar::layer_traits<L>::has_initialize)
            l.initialize(k < 4 ? telar::detail::mix_seed(telar::detail::mix_seed(seed, 0), k)
                               : telar::detail::mix_seed(seed, 1));
        },
        layer);
  });
  return m;
}

// x feeds fc1 and fc2; a and b feed two joins each:
// a = relu(fc1 x), b = sigmoid(fc2 x), y = concat(a, (a + b) * b).
GraphModel make_diamond() {
  Graph g("x");
  g.add("fc1", D(10, 8), "x", "a0");
  g.add("relu", telar::ReLU<T>{}, "a0", "a");
  g.add("fc2", D(10, 8), "x", "b0");
  g.add("sigmoid", telar::Sigmoid<T>{}, "b0", "b");
  g.add_add("sum", {"a", "b"}, "s");
  g.add_mul("gate", {"s", "b"}, "m");
  g.add_concat("cat", {"a", "m"}, "y");
  g.set_output("y");
  GraphModel m;
  m.push_back(std::move(g));
  m.push_back(D(16, 3));
  return m;
}

template <class V>
void check_close(V const& a, V const& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    CHECK(a[i] == Catch::Approx(b[i]).epsilon(1e-4).margin(1e-6));
}

template <class M>
std::vector<double> host(M const& m) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, m);
  return std::vector<double>(h.data(), h.data() + h.size());
}

// What a graph must refuse, and the words its message must hold.
void check_refused(Graph const& g, std::vector<std::string> const& words) {
  try {
    (void)g.output_shape(telar::Shape{8});
    FAIL("no error");
  } catch (telar::Error const& e) {
    INFO(e.what());
    for (auto const& w : words)
      CHECK(std::string(e.what()).find(w) != std::string::npos);
  }
}

} // namespace

TEST_CASE("DynamicGraph as a chain trains as the DynamicSequential of its layers", "[graph]") {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  CHECK(train(MPI_COMM_SELF, make_chain_graph(), {1, 1, 1}) ==
        train(MPI_COMM_SELF, make_chain_reference(), {1, 1, 1}));
  if (n != 2)
    return;
  // dp; pp=2 (stages split at the graph's boundary); tp (forwarded to nodes).
  for (telar::GridShape g :
       {telar::GridShape{2, 1, 1}, telar::GridShape{1, 2, 1}, telar::GridShape{1, 1, 2}}) {
    INFO("dp=" << g.dp << " pp=" << g.pp << " tp=" << g.tp);
    // Under pp the graph is stage 0 and the classifier stage 1: the
    // reference splits its chain there too.
    CHECK(train(MPI_COMM_WORLD, make_chain_graph(), g) ==
          train(MPI_COMM_WORLD, make_chain_reference(), g, {0, 4, 5}));
  }
}

TEST_CASE("DynamicGraph trains under dp and ZeRO-3 as serially", "[graph]") {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  auto const serial = train(MPI_COMM_SELF, make_diamond(), {1, 1, 1});
  check_close(train(MPI_COMM_WORLD, make_diamond(), {n, 1, 1}), serial);
  check_close(train<GraphModel, Zero3>(MPI_COMM_WORLD, make_diamond(), {n, 1, 1}), serial);
}

TEST_CASE("DynamicGraph with an Add equals the ProjectedResidual of its nodes", "[graph]") {
  using Ref = telar::ProjectedResidual<D, D, telar::ReLU<T>, D>;
  Ref ref(D(6, 5), D(6, 7), {}, D(7, 5));
  Graph g("x");
  g.add("body0", D(6, 7), "x", "h0");
  g.add("relu", telar::ReLU<T>{}, "h0", "h1");
  g.add("body2", D(7, 5), "h1", "h");
  g.add("shortcut", D(6, 5), "x", "p");
  g.add_add("sum", {"h", "p"}, "y");
  g.set_output("y");
  ref.build(telar::Shape{6});
  g.build(telar::Shape{6});
  ref.initialize(3);
  g.initialize(4);
  std::vector<std::vector<double>> values;
  std::vector<std::string> names;
  ref.parameters([&](char const*, auto& v, auto&) { values.push_back(host(v)); });
  std::size_t k = 0;
  g.parameters([&](char const* name, auto& v, auto&) {
    names.emplace_back(name);
    auto h = Kokkos::create_mirror_view(v);
    for (std::size_t i = 0; i < h.size(); ++i)
      h.data()[i] = T(values.at(k)[i]);
    Kokkos::deep_copy(v, h);
    ++k;
  });
  CHECK(names == std::vector<std::string>{"body0.weight", "body0.bias", "body2.weight",
                                          "body2.bias", "shortcut.weight", "shortcut.bias"});
  std::size_t const rows = 4;
  telar::Matrix<T> x("x", rows, 6), dy("dy", rows, 5), y1("y1", rows, 5), y2("y2", rows, 5);
  telar::Matrix<T> dx1("dx1", rows, 6), dx2("dx2", rows, 6);
  telar::detail::fd_fill(x, 1, 1.0);
  telar::detail::fd_fill(dy, 2, 1.0);
  Ref::saved_type s1;
  Graph::saved_type s2;
  Kokkos::DefaultExecutionSpace exec;
  ref.forward(exec, x, y1, s1);
  g.forward(exec, x, y2, s2);
  ref.backward_input(exec, dy, dx1, s1);
  ref.backward_weight(exec, dy, s1);
  g.backward_input(exec, dy, dx2, s2);
  g.backward_weight(exec, dy, s2);
  CHECK(host(y1) == host(y2));
  CHECK(host(dx1) == host(dx2));
  std::vector<std::vector<double>> g1, g2;
  ref.parameters([&](char const*, auto&, auto& grad) { g1.push_back(host(grad)); });
  g.parameters([&](char const*, auto&, auto& grad) { g2.push_back(host(grad)); });
  CHECK(g1 == g2);
}

TEST_CASE("DynamicGraph: Mul per channel and Concat, checked by hand and by finite differences",
          "[graph]") {
  using DD = telar::Dense<double>;
  using G = telar::DynamicGraph<std::variant<DD, telar::Sigmoid<double>>>;
  // x [3, 5] feeds three nodes: y = concat(main(x) * sigmoid(gate(x)), x),
  // the gate one value per channel ([3, 1] against [3, 5]).
  G g("x");
  g.add("main", DD(5, 5), "x", "m");
  g.add("gate", DD(5, 1), "x", "g0");
  g.add("sigmoid", telar::Sigmoid<double>{}, "g0", "g");
  g.add_mul("scale", {"m", "g"}, "p");
  g.add_concat("cat", {"p", "x"}, "y");
  g.set_output("y");
  telar::Shape const in{3, 5};
  CHECK(g.output_shape(in) == telar::Shape{6, 5});
  CHECK(g.execution_order() == std::vector<std::string>{"main", "gate", "sigmoid", "scale", "cat"});

  auto const report = telar::check_gradients(g, in, 4);
  INFO(report.str());
  CHECK(report.passed(1e-6));

  // By hand: each node's layer run on its own, joined on the host.
  std::size_t const rows = 2;
  telar::Matrix<double> x("x", rows, 15), y("y", rows, 30), m("m", rows, 15), g0("g0", rows, 3);
  telar::detail::fd_fill(x, 5, 1.0);
  Kokkos::DefaultExecutionSpace exec;
  G::saved_type saved;
  g.forward(exec, x, y, saved);
  typename telar::layer_traits<DD>::saved_type s1, s2;
  std::get<DD>(g.layer("main")).forward(exec, x, m, s1);
  std::get<DD>(g.layer("gate")).forward(exec, x, g0, s2);
  auto const hx = host(x), hy = host(y), hm = host(m), hg = host(g0);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t c = 0; c < 3; ++c)
      for (std::size_t w = 0; w < 5; ++w) {
        double const gate = 1 / (1 + std::exp(-hg[i * 3 + c]));
        CHECK(hy[i * 30 + c * 5 + w] == Catch::Approx(hm[i * 15 + c * 5 + w] * gate));
        CHECK(hy[i * 30 + 15 + c * 5 + w] == hx[i * 15 + c * 5 + w]);
      }

  // Kept per micro-batch: m, g0, g, p and their gradients; a scratch of x's
  // width (x has three readers); the layers' own states.
  std::size_t layers = 0;
  g.for_each_layer([&](std::size_t, auto const& l) {
    if constexpr (telar::layer_traits<std::decay_t<decltype(l)>>::has_saved_bytes)
      layers += l.saved_bytes(7, in);
  });
  CHECK(g.saved_bytes(7, in) == (2 * (15 + 3 + 3 + 15) + 15) * 7 * sizeof(double) + layers);
}

TEST_CASE("DynamicGraph refuses a malformed graph, naming the fault", "[graph]") {
  auto dense = [] { return D(8, 8); };
  {
    Graph g("x"); // a -> b -> a
    g.add("a", dense(), "h2", "h1");
    g.add("b", dense(), "h1", "h2");
    g.add_add("out", {"x", "h2"}, "y");
    g.set_output("y");
    check_refused(g, {"not acyclic", "'a' -> 'b' -> 'a'"});
  }
  {
    Graph g("x");
    g.add("a", dense(), "nope", "y");
    g.set_output("y");
    check_refused(g, {"node 'a' reads tensor 'nope'", "not the graph input 'x'"});
  }
  {
    Graph g("x");
    g.add("a", dense(), "x", "h");
    g.add("b", dense(), "x", "h");
    g.set_output("h");
    check_refused(g, {"tensor 'h' is produced by node 'b' and by node 'a'"});
  }
  {
    Graph g("x");
    g.add("a", dense(), "x", "y");
    g.add("dead", dense(), "x", "h");
    g.set_output("y");
    check_refused(g, {"node 'dead' produces 'h'", "does not reach the graph output 'y'"});
  }
  {
    Graph g("x");
    g.add("a", dense(), "x", "y");
    check_refused(g, {"graph output ''", "set_output"});
  }
  {
    Graph g("x");
    g.add("a", dense(), "x", "h1");
    g.add("b", D(8, 4), "x", "h2");
    g.add_add("sum", {"h1", "h2"}, "y");
    g.set_output("y");
    check_refused(g, {"Add node 'sum' joins 'h1' [8], 'h2' [4]", "equal shapes"});
    CHECK_THROWS_AS(g.output_shape(telar::Shape{8}), telar::ShapeError);
  }
  {
    Graph g("x");
    g.add("a", D(5, 8), "x", "y");
    g.set_output("y");
    check_refused(g, {"node 'a' (Dense) cannot take input 'x' [8]"});
  }
  Graph g("x");
  g.add("a", dense(), "x", "h");
  CHECK_THROWS_WITH(g.add("a", dense(), "h", "y"),
                    Catch::Matchers::ContainsSubstring("node 'a' is added twice"));
  CHECK_THROWS_WITH(g.add_mul("m", {"x", "h", "h"}, "y"),
                    Catch::Matchers::ContainsSubstring("node 'm' (Mul) takes two inputs, not 3"));
  CHECK_THROWS_WITH(g.add_concat("c", {"x"}, "y"),
                    Catch::Matchers::ContainsSubstring("takes two inputs or more, not 1"));
}

TEST_CASE("DynamicGraph: set_training reaches dropout nodes", "[graph]") {
  telar::DynamicGraph<std::variant<D, telar::Dropout<T>>> g("x");
  g.add("fc", D(8, 8), "x", "h");
  g.add("drop", telar::Dropout<T>(0.5), "h", "y");
  g.set_output("y");
  telar::set_training(g, false);
  CHECK_FALSE(std::get<telar::Dropout<T>>(g.layer("drop")).training());
  telar::set_training(g, true);
  CHECK(std::get<telar::Dropout<T>>(g.layer("drop")).training());
}

TEST_CASE("DynamicGraph: buffers of its nodes, named by node; set_training reaches BatchNorm",
          "[graph]") {
  using BN = telar::BatchNorm<T>;
  telar::DynamicGraph<std::variant<D, BN>> g("x");
  g.add("fc", D(6, 4), "x", "h");
  g.add("bn", BN(4), "h", "y");
  g.set_output("y");
  g.build(telar::Shape{6});
  g.initialize(1);
  std::vector<std::string> names;
  g.buffers([&](char const* name, auto& view) {
    names.push_back(name);
    CHECK(view.extent(0) == 4);
  });
  CHECK(names == std::vector<std::string>{"bn.running_mean", "bn.running_var"});
  CHECK(g.buffer_count() == 8);
  telar::set_training(g, false);
  CHECK_FALSE(std::get<BN>(g.layer("bn")).training());
}

// DynamicGraph::recompute: nodes whose outputs are not kept per micro-batch
// but recomputed before its backward. Two micro-batches in flight, both
// backward_input before either backward_weight (as zero-bubble schedules
// do), so each backward finds the shared buffers holding the other's values:
// outputs, input and parameter gradients and BatchNorm's running statistics
// equal the plain graph's; the memory plan keeps one copy of the dropped
// tensors instead of one per micro-batch.
TEST_CASE("DynamicGraph::recompute gives the plain graph's gradients and keeps less",
          "[graph][recompute]") {
  using DD = telar::Dense<double>;
  using G = telar::DynamicGraph<
      std::variant<DD, telar::BatchNorm<double>, telar::ReLU<double>, telar::Dropout<double>>>;
  auto const make = [] {
    G g("x");
    g.add("fc1", DD(6, 8), "x", "h1");
    g.add("bn", telar::BatchNorm<double>(8), "h1", "h2");
    g.add("relu", telar::ReLU<double>{}, "h2", "h3");
    g.add("drop", telar::Dropout<double>(0.25), "h3", "h4");
    g.add("fc2", DD(8, 8), "h4", "h5");
    g.add_add("sum", {"h5", "h1"}, "s");
    g.add("fc3", DD(8, 4), "s", "y");
    g.set_output("y");
    return g;
  };
  telar::Shape const in{6};
  G plain = make(), lean = make();
  lean.recompute("bn", "sum"); // h2, h3, h4, h5 and s: 5 x 8 values per sample
  CHECK(lean.recomputes());
  CHECK_FALSE(plain.recomputes());
  CHECK_THROWS_WITH(lean.recompute("fc3", "bn"),
                    Catch::Matchers::ContainsSubstring(
                        "'fc3' to 'bn' is not a range of the execution order ('fc1', 'bn', "
                        "'relu', 'drop', 'fc2', 'sum', 'fc3')"));
  std::size_t const rows = 5;
  std::size_t const dropped = 5 * 8 * rows * sizeof(double);
  CHECK(plain.saved_bytes(rows, in) - lean.saved_bytes(rows, in) == dropped);
  // BatchNorm's sums, kept between calls, are workspace in both.
  std::size_t const sums = telar::BatchNorm<double>(8).workspace_bytes(rows, telar::Shape(8));
  CHECK(sums > 0);
  CHECK(lean.workspace_bytes(rows, in) == dropped + sums);
  CHECK(plain.workspace_bytes(rows, in) == sums);

  struct Got {
    std::vector<std::vector<double>> values; // y, dx per micro-batch, then gradients, buffers
  };
  auto const run = [&](G& g) {
    g.build(in);
    g.initialize(7);
    Kokkos::DefaultExecutionSpace exec;
    G::saved_type saved[2];
    std::vector<telar::Matrix<double>> x, y, dy, dx;
    for (std::uint64_t m = 0; m < 2; ++m) {
      x.emplace_back("x", rows, 6), y.emplace_back("y", rows, 4);
      dy.emplace_back("dy", rows, 4), dx.emplace_back("dx", rows, 6);
      telar::detail::fd_fill(x[m], 3 + m, 1.0);
      telar::detail::fd_fill(dy[m], 9 + m, 1.0);
      g.forward(exec, x[m], y[m], saved[m]);
    }
    for (std::size_t m = 0; m < 2; ++m)
      g.backward_input(exec, dy[m], dx[m], saved[m]);
    for (std::size_t m = 0; m < 2; ++m)
      g.backward_weight(exec, dy[m], saved[m]);
    Got r;
    for (std::size_t m = 0; m < 2; ++m)
      r.values.push_back(host(y[m])), r.values.push_back(host(dx[m]));
    g.parameters([&](char const*, auto&, auto& grad) { r.values.push_back(host(grad)); });
    g.buffers([&](char const*, auto& v) { r.values.push_back(host(v)); });
    return r;
  };
  Got const want = run(plain), got = run(lean);
  REQUIRE(got.values.size() == want.values.size());
  double worst = 0;
  for (std::size_t k = 0; k < want.values.size(); ++k) {
    REQUIRE(got.values[k].size() == want.values[k].size());
    for (std::size_t i = 0; i < want.values[k].size(); ++i)
      worst = std::max(worst, std::abs(got.values[k][i] - want.values[k][i]));
  }
  INFO("largest difference " << worst);
  CHECK(worst <= 1e-11);
  // A pipeline's units run the nodes one by one: recompute is refused there.
  G piped = make();
  piped.recompute("relu", "relu");
  CHECK_THROWS_WITH(telar::GraphChain<G::layer_variant>(std::move(piped)).build(in),
                    Catch::Matchers::ContainsSubstring("a GraphChain keeps every tensor"));
}
