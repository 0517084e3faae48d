// Activation recomputation (telar::Recompute): gradients by finite
// differences, bitwise equality with the model that keeps its activations
// (in the orders the schedules use: B then W, W then B, W alone, many
// micro-batches between B and W), the workspace it keeps, saved objects
// reused across steps, parameter names, and exact replay of a stochastic
// layer keyed by a counter.
#include "support.hpp"

#include <telar/core/detail/counter_rng.hpp>
#include <telar/core/recompute.hpp>
#include <telar/core/residual.hpp>
#include <telar/core/sequential.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/normalization.hpp>
#include <telar/testing/check_gradients.hpp>

#include <catch2/catch_test_macros.hpp>

#include <string>
#include <vector>

using telar::test::Exec;
using telar::test::random_matrix;
using telar::test::to_host;

namespace {

// Inverted dropout whose mask is a pure function of (seed, counter, element):
// the counter advances once per forward and is exposed, so recomputation
// replays the same mask. backward regenerates the mask from the key.
template <class T>
struct CountedDropout {
  using value_type = T;
  using memory_space = telar::DefaultMemorySpace;
  struct saved_type {
    std::uint64_t key = 0;
  };
  static constexpr char const* name() { return "CountedDropout"; }
  static constexpr bool preserves_shape = true;
  telar::Shape output_shape(telar::Shape const& in) const { return in; }
  std::uint64_t random_counter() const { return counter; }
  void set_random_counter(std::uint64_t c) { counter = c; }

  template <class E>
  void forward(E const& exec, telar::ConstMatrix<T> x, telar::Matrix<T> y, saved_type& saved) {
    saved.key = telar::detail::mix_seed(seed, counter++);
    apply(exec, x, y, saved.key);
  }
  template <class E>
  void backward_input(E const& exec, telar::ConstMatrix<T> dy, telar::Matrix<T> dx,
                      saved_type const& saved) const {
    apply(exec, dy, dx, saved.key);
  }
  template <class E>
  static void apply(E const& exec, telar::ConstMatrix<T> in, telar::Matrix<T> out,
                    std::uint64_t key) {
    std::size_t const k = in.extent(1);
    Kokkos::parallel_for(
        Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {in.extent(0), in.extent(1)}),
        KOKKOS_LAMBDA(int i, int j) {
          T const u = telar::detail::uniform_at<T>(key, std::uint64_t(i) * k + j, T(0), T(1));
          out(i, j) = u < T(0.5) ? T(0) : T(2) * in(i, j);
        });
  }

  std::uint64_t seed = 11;
  std::uint64_t counter = 0;
};

template <class T>
using D = telar::Dense<T>;
template <class T>
using Mlp = telar::Sequential<D<T>, telar::GELU<T>, D<T>>;
template <class T>
using PreNorm = telar::Residual<telar::LayerNorm<T>, D<T>, telar::GELU<T>, D<T>>;
template <class T>
using Down = telar::ProjectedResidual<D<T>, D<T>, telar::ReLU<T>>;
// [P, 4] -> Dense -> [P, 6] -> ReLU -> Mlp -> PreNorm -> Down -> [P, 3]
template <class T>
using Net = telar::Sequential<D<T>, telar::ReLU<T>, Mlp<T>, PreNorm<T>, Down<T>>;

template <class T>
Mlp<T> make_mlp(std::size_t in = 6, std::size_t hidden = 8, std::size_t out = 6) {
  return Mlp<T>(D<T>(in, hidden), {}, D<T>(hidden, out));
}
template <class T>
PreNorm<T> make_prenorm() {
  return PreNorm<T>(telar::LayerNorm<T>(6), D<T>(6, 8), {}, D<T>(8, 6));
}
template <class T>
Net<T> make_net() {
  return Net<T>(D<T>(4, 6), {}, make_mlp<T>(), make_prenorm<T>(),
                Down<T>(D<T>(6, 3), D<T>(6, 3), {}));
}
// Selective: the two inner blocks recomputed, the rest kept.
template <class T>
using Selective = telar::Sequential<D<T>, telar::ReLU<T>, telar::Recompute<Mlp<T>>,
                                    telar::Recompute<PreNorm<T>>, Down<T>>;
template <class T>
Selective<T> make_selective() {
  return Selective<T>(D<T>(4, 6), {}, telar::Recompute<Mlp<T>>(make_mlp<T>()),
                      telar::Recompute<PreNorm<T>>(make_prenorm<T>()),
                      Down<T>(D<T>(6, 3), D<T>(6, 3), {}));
}

// Dropout inside blocks, inside a recomputed block.
template <class T>
using Noisy = telar::Sequential<D<T>, CountedDropout<T>,
                                telar::Residual<D<T>, telar::GELU<T>, CountedDropout<T>>, D<T>>;
template <class T>
Noisy<T> make_noisy() {
  using Res = telar::Residual<D<T>, telar::GELU<T>, CountedDropout<T>>;
  return Noisy<T>(D<T>(4, 6), {}, Res(D<T>(6, 6), {}, {}), D<T>(6, 3));
}

template <class M>
std::vector<std::string> names(M& m) {
  std::vector<std::string> out;
  m.parameters([&](char const* n, auto&, auto&) { out.emplace_back(n); });
  return out;
}
template <class M>
void zero_grads(M& m) {
  m.parameters([](char const*, auto&, auto& g) { Kokkos::deep_copy(g, 0.0); });
}
template <class M>
std::vector<double> grads(M& m) {
  std::vector<double> out;
  m.parameters([&](char const*, auto&, auto& g) {
    auto h = to_host(g);
    out.insert(out.end(), h.data(), h.data() + h.size());
  });
  return out;
}
template <class V>
std::vector<double> values(V const& v) {
  auto h = to_host(v);
  return std::vector<double>(h.data(), h.data() + h.size());
}

struct Pass {
  std::vector<double> y, dx, grads;
};

enum class Order { input_then_weight, weight_then_input, weight_only };

// Micro-batches xs/dys through `m`: all forwards first, then the backwards
// in the given order per micro-batch (all B before any W for
// input_then_weight, as a zero-bubble schedule may run them). Gradients
// accumulate over the micro-batches.
template <class M>
std::vector<Pass> run(M& m, std::vector<typename M::saved_type>& saved,
                      std::vector<telar::Matrix<double>> const& xs,
                      std::vector<telar::Matrix<double>> const& dys, Order order) {
  std::size_t const mb = xs.size();
  saved.resize(mb);
  std::vector<Pass> out(mb);
  std::vector<telar::Matrix<double>> ys, dxs;
  for (std::size_t i = 0; i < mb; ++i) {
    ys.emplace_back("y", xs[i].extent(0), dys[i].extent(1));
    dxs.emplace_back("dx", xs[i].extent(0), xs[i].extent(1));
    m.forward(Exec{}, xs[i], ys[i], saved[i]);
  }
  zero_grads(m);
  if (order == Order::input_then_weight) {
    for (std::size_t i = 0; i < mb; ++i)
      m.backward_input(Exec{}, dys[i], dxs[i], saved[i]);
    for (std::size_t i = 0; i < mb; ++i)
      m.backward_weight(Exec{}, dys[i], saved[i]);
  } else {
    for (std::size_t i = 0; i < mb; ++i) {
      m.backward_weight(Exec{}, dys[i], saved[i]);
      if (order == Order::weight_then_input)
        m.backward_input(Exec{}, dys[i], dxs[i], saved[i]);
    }
  }
  Kokkos::fence();
  for (std::size_t i = 0; i < mb; ++i)
    out[i] = {values(ys[i]), order == Order::weight_only ? std::vector<double>{} : values(dxs[i]),
              grads(m)};
  return out;
}

bool same(std::vector<Pass> const& a, std::vector<Pass> const& b) {
  if (a.size() != b.size())
    return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].y != b[i].y || a[i].dx != b[i].dx || a[i].grads != b[i].grads)
      return false;
  return true;
}

struct Batches {
  std::vector<telar::Matrix<double>> x, dy;
};
Batches batches(std::size_t mb, std::size_t rows, std::size_t in, std::size_t out,
                std::uint64_t seed) {
  Batches b;
  for (std::size_t i = 0; i < mb; ++i) {
    b.x.push_back(random_matrix<double>(rows, in, seed + 2 * i));
    b.dy.push_back(random_matrix<double>(rows, out, seed + 2 * i + 1));
  }
  return b;
}

template <class M>
void setup(M& m, telar::Shape in, std::uint64_t seed) {
  m.build(in);
  m.initialize(seed);
}

} // namespace

TEST_CASE("Recompute: gradients match finite differences", "[recompute][fd]") {
  SECTION("Recompute<Sequential<Dense, GELU, Dense>>") {
    telar::Recompute<Mlp<double>> block(make_mlp<double>(4, 7, 5));
    auto const report = telar::check_gradients(block, telar::Shape{3, 4}, 2);
    INFO(report.str());
    CHECK(report.tensors.size() == 5);
    CHECK(report.passed(1e-6));
  }
  SECTION("Recompute<Residual<LayerNorm, Dense, GELU, Dense>>") {
    telar::Recompute<PreNorm<double>> block(make_prenorm<double>());
    auto const report = telar::check_gradients(block, telar::Shape{2, 6}, 3);
    INFO(report.str());
    CHECK(report.tensors.size() == 7);
    CHECK(report.passed(1e-6));
  }
  SECTION("selective and full recomputation of a model with blocks") {
    auto sel = make_selective<double>();
    auto const r1 = telar::check_gradients(sel, telar::Shape{3, 4}, 2);
    INFO(r1.str());
    CHECK(r1.tensors.size() == 17);
    CHECK(r1.passed(1e-6));
    auto full = telar::recompute_all(make_net<double>());
    auto const r2 = telar::check_gradients(full, telar::Shape{3, 4}, 2);
    INFO(r2.str());
    CHECK(r2.tensors.size() == 17);
    CHECK(r2.passed(1e-6));
  }
}

TEST_CASE("Recompute: parameter names, shapes and names pass through", "[recompute]") {
  auto net = make_net<float>();
  auto full = telar::recompute_all(make_net<float>());
  static_assert(std::is_same_v<decltype(full), telar::RecomputeAll<Net<float>>>);
  auto sel = make_selective<float>();
  CHECK(full.shapes(telar::Shape{5, 4}) == net.shapes(telar::Shape{5, 4}));
  CHECK(full.layer_names() == net.layer_names());
  CHECK(full.flops(8, telar::Shape{5, 4}) == net.flops(8, telar::Shape{5, 4}));
  setup(net, telar::Shape{5, 4}, 1);
  setup(full, telar::Shape{5, 4}, 1);
  setup(sel, telar::Shape{5, 4}, 1);
  CHECK(names(full) == names(net));
  CHECK(names(sel) == names(net));
  // The same initial values: initialisation does not see the wrapper.
  std::vector<double> a, b;
  net.parameters([&](char const*, auto& v, auto&) {
    auto h = values(v);
    a.insert(a.end(), h.begin(), h.end());
  });
  full.parameters([&](char const*, auto& v, auto&) {
    auto h = values(v);
    b.insert(b.end(), h.begin(), h.end());
  });
  CHECK(a == b);
  // A static shape flows through the wrapper.
  using Act = telar::Recompute<telar::ReLU<float>>;
  static_assert(Act::preserves_shape == telar::ReLU<float>::preserves_shape);
  CHECK(std::string(Act::name()) == "ReLU");
  // Run together, B goes first: one recomputation, reused by W.
  static_assert(telar::layer_traits<telar::Recompute<D<float>>>::backward_input_first);
  static_assert(telar::layer_traits<telar::Recompute<Mlp<float>>>::has_backward_weight);
  static_assert(!telar::layer_traits<Act>::has_backward_weight);
}

TEST_CASE("Recompute: outputs and gradients are bitwise those of the plain model", "[recompute]") {
  telar::Shape const in{3, 4};
  auto const data = batches(3, 2, 12, 9, 21);
  for (Order order : {Order::input_then_weight, Order::weight_then_input, Order::weight_only}) {
    INFO("order " << int(order));
    auto net = make_net<double>();
    auto full = telar::recompute_all(make_net<double>());
    auto sel = make_selective<double>();
    setup(net, in, 3);
    setup(full, in, 3);
    setup(sel, in, 3);
    std::vector<Net<double>::saved_type> sn;
    std::vector<telar::RecomputeAll<Net<double>>::saved_type> sf;
    std::vector<Selective<double>::saved_type> ss;
    auto const want = run(net, sn, data.x, data.dy, order);
    CHECK(same(run(full, sf, data.x, data.dy, order), want));
    CHECK(same(run(sel, ss, data.x, data.dy, order), want));
    // Again on the same saved objects (reused across steps).
    CHECK(same(run(full, sf, data.x, data.dy, order), want));
    CHECK(same(run(sel, ss, data.x, data.dy, order), want));
    // Nothing rebuilt is left alive once every W has run (W alone: one state
    // waits for the layer's next call), top level or nested.
    CHECK(full.layer<2>().states_live() == 0);
    CHECK(sel.layer<2>().states_live() == 0);
    CHECK(sel.layer<3>().states_live() == 0);
    CHECK(full.layer<0>().states_live() == (order == Order::weight_only ? 1 : 0));
  }
}

TEST_CASE("Recompute: the rebuilt state lives from recomputation to backward_weight",
          "[recompute][memory]") {
  telar::Shape const in{6};
  std::size_t const mb = 4;
  auto const data = batches(mb, 5, 6, 6, 31);
  Mlp<double> plain = make_mlp<double>();
  telar::Recompute<Mlp<double>> block(make_mlp<double>());
  setup(plain, in, 2);
  setup(block, in, 2);
  std::vector<Mlp<double>::saved_type> sp;
  std::vector<telar::Recompute<Mlp<double>>::saved_type> sr;
  std::vector<telar::Matrix<double>> ys, dxs;
  for (std::size_t i = 0; i < mb; ++i) {
    ys.emplace_back("y", 5, 6);
    dxs.emplace_back("dx", 5, 6);
  }
  sp.resize(mb);
  sr.resize(mb);
  // All forwards first (GPipe): one workspace state serves them all, while
  // the plain block keeps its inner activations per micro-batch.
  for (std::size_t i = 0; i < mb; ++i) {
    plain.forward(Exec{}, data.x[i], ys[i], sp[i]);
    block.forward(Exec{}, data.x[i], ys[i], sr[i]);
  }
  CHECK(block.states_allocated() == 1);
  CHECK(block.states_live() == 0);
  std::size_t plain_bytes = 0;
  for (auto const& s : sp)
    for (auto const& a : s.act)
      plain_bytes += a.span() * sizeof(double);
  CHECK(plain_bytes == mb * 5 * (8 + 8) * sizeof(double)); // two hidden activations each
  for (auto const& s : sr)
    CHECK(!s.state); // only the checkpoint (a view of the input)
  // B then W per micro-batch (1F1B, split): still one state.
  for (std::size_t i = 0; i < 2; ++i) {
    block.backward_input(Exec{}, data.dy[i], dxs[i], sr[i]);
    CHECK(block.states_live() == 1);
    block.backward_weight(Exec{}, data.dy[i], sr[i]);
    CHECK(block.states_live() == 0);
  }
  CHECK(block.states_allocated() == 1);
  // Two B before their W (zero bubble): two states alive until their W.
  block.backward_input(Exec{}, data.dy[2], dxs[2], sr[2]);
  block.backward_input(Exec{}, data.dy[3], dxs[3], sr[3]);
  CHECK(block.states_live() == 2);
  CHECK(block.states_allocated() == 2);
  block.backward_weight(Exec{}, data.dy[2], sr[2]);
  CHECK(block.states_live() == 1);
  block.backward_weight(Exec{}, data.dy[3], sr[3]);
  CHECK(block.states_live() == 0);
  // W alone (the model's first unit): kept until the next call, then freed.
  block.forward(Exec{}, data.x[0], ys[0], sr[0]);
  block.backward_weight(Exec{}, data.dy[0], sr[0]);
  CHECK(block.states_live() == 1);
  block.forward(Exec{}, data.x[1], ys[1], sr[1]);
  CHECK(block.states_live() == 0);
  CHECK(block.states_allocated() == 2);
}

TEST_CASE("Recompute: saved objects are reused across steps and batch sizes", "[recompute]") {
  auto sel = make_selective<double>();
  auto ref = make_net<double>();
  telar::Shape const in{2, 4};
  setup(sel, in, 8);
  setup(ref, in, 8);
  std::vector<Selective<double>::saved_type> ss;
  std::vector<Net<double>::saved_type> sr;
  auto const small = batches(2, 3, 8, 6, 41), large = batches(2, 5, 8, 6, 51);
  auto const want_small = run(ref, sr, small.x, small.dy, Order::input_then_weight);
  auto const want_large = run(ref, sr, large.x, large.dy, Order::input_then_weight);
  CHECK(same(run(sel, ss, small.x, small.dy, Order::input_then_weight), want_small));
  CHECK(same(run(sel, ss, large.x, large.dy, Order::input_then_weight), want_large));
  CHECK(same(run(sel, ss, small.x, small.dy, Order::input_then_weight), want_small));
  CHECK(sel.layer<2>().states_allocated() == 2); // two micro-batches between B and W
}

TEST_CASE("Recompute: a counter-keyed stochastic layer replays exactly", "[recompute][random]") {
  telar::Shape const in{4};
  auto const data = batches(3, 6, 4, 3, 61);
  for (Order order : {Order::input_then_weight, Order::weight_then_input, Order::weight_only}) {
    INFO("order " << int(order));
    auto plain = make_noisy<double>();
    telar::Recompute<Noisy<double>> whole(make_noisy<double>());
    auto full = telar::recompute_all(make_noisy<double>());
    setup(plain, in, 5);
    setup(whole, in, 5);
    setup(full, in, 5);
    std::vector<Noisy<double>::saved_type> sp;
    std::vector<telar::Recompute<Noisy<double>>::saved_type> sw;
    std::vector<telar::RecomputeAll<Noisy<double>>::saved_type> sf;
    for (int step = 0; step < 2; ++step) {
      auto const want = run(plain, sp, data.x, data.dy, order);
      CHECK(same(run(whole, sw, data.x, data.dy, order), want));
      CHECK(same(run(full, sf, data.x, data.dy, order), want));
    }
    // The masks did change between micro-batches and steps: the counters
    // advanced once per forward, as without recomputation.
    CHECK(plain.layer<1>().counter == 6);
    CHECK(whole.inner().layer<1>().counter == 6);
    CHECK(full.layer<1>().inner().counter == 6);
    CHECK(whole.inner().layer<2>().body().layer<2>().counter == 6);
  }
}
