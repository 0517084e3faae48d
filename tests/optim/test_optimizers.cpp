// Optimizers against values computed independently: PyTorch 1.13's
// torch.optim (float64, three steps, printed once and written down here) and a
// host re-derivation of LAMB.
#include "support.hpp"

#include <telar/optim/adam.hpp>
#include <telar/optim/detail/engine.hpp>
#include <telar/optim/lamb.hpp>
#include <telar/optim/sgd.hpp>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <vector>

using Catch::Approx;
using telar::test::Exec;
using Vec = telar::Vector<double>;

namespace {
double const grads[3][3] = {{0.5, 0.25, -1.0}, {0.1, -0.3, 0.2}, {-0.4, 0.05, 0.3}};

template <class Opt>
std::vector<double> three_steps(Opt opt, double lr) {
  Vec w("w", 3), g("g", 3);
  auto hw = Kokkos::create_mirror_view(w);
  hw(0) = 1.0;
  hw(1) = -2.0;
  hw(2) = 0.5;
  Kokkos::deep_copy(w, hw);
  telar::detail::OptimizerEngine<Opt, telar::DefaultMemorySpace> engine(opt, 3);
  std::vector<telar::detail::TensorSegment> segs{{0, 3, 1}};
  for (int s = 0; s < 3; ++s) {
    auto hg = Kokkos::create_mirror_view(g);
    for (int i = 0; i < 3; ++i)
      hg(i) = grads[s][i];
    Kokkos::deep_copy(g, hg);
    telar::StepInfo<double> info;
    info.lr = lr;
    info.step = s + 1;
    engine.step(Exec{}, w, g, segs, {0}, 1, info, 0, {});
  }
  auto out = telar::test::to_host(w);
  return {out(0), out(1), out(2)};
}

void check_close(std::vector<double> const& got, std::vector<double> const& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    CHECK(got[i] == Approx(want[i]).epsilon(1e-12));
}
} // namespace

TEST_CASE("SGD matches torch.optim.SGD", "[optim]") {
  check_close(three_steps(telar::SGD<double>{}, 0.1), {0.98, -2.0, 0.55});
  telar::SGD<double> m;
  m.momentum = 0.9;
  check_close(three_steps(m, 0.1), {0.8855, -2.01575, 0.703});
  telar::SGD<double> n;
  n.momentum = 0.9;
  n.nesterov = true;
  n.weight_decay = 0.01;
  check_close(three_steps(n, 0.1), {0.869465558191, -1.9979558237569999, 0.7277255364705001});
}

TEST_CASE("Adam and AdamW match torch.optim", "[optim]") {
  check_close(three_steps(telar::Adam<double>{}, 0.1),
              {0.8103259663582117, -2.0828640234600186, 0.6709517162559174});
  telar::Adam<double> l2;
  l2.weight_decay = 0.1;
  check_close(three_steps(l2, 0.1), {0.7829837790790071, -1.9641580618929873, 0.65538458344036});
  telar::AdamW<double> w;
  w.weight_decay = 0.1;
  check_close(three_steps(w, 0.1), {0.7834180072745651, -2.021614968265096, 0.6536001902057224});
}

TEST_CASE("LAMB scales each tensor by its own trust ratio", "[optim]") {
  // Two tensors: [0, 2) and [2, 5) of a flat buffer.
  std::vector<double> w0{1.0, -2.0, 0.5, 3.0, -1.0}, g0{0.5, 0.25, -1.0, 0.2, 0.1};
  Vec w("w", 5), g("g", 5);
  auto hw = Kokkos::create_mirror_view(w), hg = Kokkos::create_mirror_view(g);
  for (int i = 0; i < 5; ++i) {
    hw(i) = w0[i];
    hg(i) = g0[i];
  }
  Kokkos::deep_copy(w, hw);
  Kokkos::deep_copy(g, hg);
  telar::LAMB<double> opt;
  telar::detail::OptimizerEngine<telar::LAMB<double>, telar::DefaultMemorySpace> engine(opt, 5);
  std::vector<telar::detail::TensorSegment> segs{{0, 2, 1}, {2, 3, 1}};
  telar::StepInfo<double> info;
  info.lr = 0.01;
  info.step = 1;
  engine.step(Exec{}, w, g, segs, {0, 1}, 2, info, 0, {});
  auto got = telar::test::to_host(w);

  // By hand: step 1 has m_hat = g, v_hat = g^2, so u = g / (|g| + eps) + wd w.
  for (auto [b, e] : {std::pair<int, int>{0, 2}, {2, 5}}) {
    double wn = 0, un = 0;
    std::vector<double> u(5);
    for (int i = b; i < e; ++i) {
      u[i] = g0[i] / (std::abs(g0[i]) + opt.eps) + opt.weight_decay * w0[i];
      wn += w0[i] * w0[i];
      un += u[i] * u[i];
    }
    double const trust = std::sqrt(wn) / std::sqrt(un);
    for (int i = b; i < e; ++i)
      CHECK(got(i) == Approx(w0[i] - 0.01 * trust * u[i]).epsilon(1e-12));
  }
}

TEST_CASE("Gradient clipping scales by max_norm / ||g||", "[optim]") {
  Vec w("w", 2), g("g", 2);
  Kokkos::deep_copy(w, 1.0);
  auto hg = Kokkos::create_mirror_view(g);
  hg(0) = 3;
  hg(1) = 4; // ||g|| = 5
  Kokkos::deep_copy(g, hg);
  telar::detail::OptimizerEngine<telar::SGD<double>, telar::DefaultMemorySpace> engine({}, 2);
  telar::StepInfo<double> info;
  info.lr = 1;
  engine.step(Exec{}, w, g, {{0, 2, 1}}, {0}, 1, info, 1.0, {});
  auto hw = telar::test::to_host(w);
  CHECK(hw(0) == Approx(1 - 3.0 / (5 + 1e-6)));
  CHECK(hw(1) == Approx(1 - 4.0 / (5 + 1e-6)));
}

TEST_CASE("Replicated tensors count once in the global gradient norm", "[optim]") {
  Vec g("g", 4);
  Kokkos::deep_copy(g, 1.0);
  telar::detail::OptimizerEngine<telar::SGD<double>, telar::DefaultMemorySpace> engine({}, 4);
  // The second tensor is held identically by 2 ranks of the reduce group;
  // the callback plays the group: the other rank contributes the same sum.
  double norm = engine.grad_norm(Exec{}, g, {{0, 2, 1}, {2, 2, 2}}, [](double* v, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
      v[i] *= 2;
  });
  // rank-local: 2 + 2/2 = 3; over two ranks with distinct first tensors: 6.
  CHECK(norm == Approx(std::sqrt(6.0)));
}
