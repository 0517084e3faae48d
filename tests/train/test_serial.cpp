// The serial Trainer: whole-model gradients by finite differences, learning,
// determinism, micro-batch equivalence and a user-written optimizer.
#include "huber_loss.hpp"
#include "support.hpp"

#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/adam.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

using Exec = telar::DefaultMemorySpace::execution_space;

namespace {

// Two Gaussian-ish blobs per class along random directions: learnable.
template <class T>
std::pair<telar::Matrix<T>, telar::Labels<>> blobs(std::size_t n, std::size_t f, int classes,
                                                   std::uint64_t seed) {
  telar::Matrix<T> x("x", n, f);
  telar::Labels<> y("y", n);
  auto hx = Kokkos::create_mirror_view(x);
  auto hy = Kokkos::create_mirror_view(y);
  for (std::size_t i = 0; i < n; ++i) {
    int const c = int(i % classes);
    hy(i) = c;
    for (std::size_t j = 0; j < f; ++j)
      hx(i, j) = T(0.8 * telar::test::hash_uniform(seed, i * f + j) +
                   1.5 * telar::test::hash_uniform(777, c * f + j));
  }
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(y, hy);
  return {x, y};
}

template <class T>
using Mlp = telar::Sequential<telar::Dense<T>, telar::GELU<T>, telar::Dense<T>, telar::ReLU<T>,
                              telar::Dense<T>>;
template <class T>
Mlp<T> make_mlp(std::size_t in, std::size_t hidden, std::size_t out) {
  return Mlp<T>(telar::Dense<T>(in, hidden), {}, telar::Dense<T>(hidden, hidden), {},
                telar::Dense<T>(hidden, out));
}

// Lion (Chen et al. 2023), written as a user would: the docs' example.
template <class T>
struct Lion {
  using value_type = T;
  static constexpr int state_size = 1;
  T beta1 = T(0.9), beta2 = T(0.99), weight_decay = 0;
  KOKKOS_INLINE_FUNCTION void update(T& w, T g, telar::OptimizerState<T> s,
                                     telar::StepInfo<T> const& info) const {
    T const c = beta1 * s[0] + (T(1) - beta1) * g;
    w -= info.lr * (T((c > 0) - (c < 0)) + weight_decay * w);
    s[0] = beta2 * s[0] + (T(1) - beta2) * g;
  }
};

} // namespace

TEST_CASE("Whole-model gradient matches finite differences of the mean loss", "[train][fd]") {
  // Not a structured binding: lambdas capture x and y, and capturing a binding is C++20.
  auto const xy = blobs<double>(12, 5, 3, 1);
  auto const& x = xy.first;
  auto const& y = xy.second;
  telar::TrainerOptions opts;
  opts.seed = 3;
  opts.lr = telar::constant_lr(1.0);
  opts.microbatches = 3;
  telar::Trainer<Mlp<double>, telar::Serial, telar::SGD<double>> trainer(make_mlp<double>(5, 4, 3),
                                                                         {}, opts, 5);
  auto const w0 = trainer.parameters();
  trainer.step(x, y);
  auto const w1 = trainer.parameters();
  // With plain SGD and lr = 1 the step is exactly -gradient.
  std::vector<double> grad(w0.size());
  for (std::size_t i = 0; i < w0.size(); ++i)
    grad[i] = w0[i] - w1[i];

  // Finite differences of the mean loss on a fresh copy at w0.
  telar::Trainer<Mlp<double>, telar::Serial, telar::SGD<double>> probe(make_mlp<double>(5, 4, 3),
                                                                       {}, opts, 5);
  auto values = telar::test::to_host(probe.parameter_store().values());
  auto dev_values = probe.parameter_store().values();
  auto loss_at = [&] {
    Kokkos::deep_copy(dev_values, values);
    return probe.evaluate(x, y).loss;
  };
  double worst = 0;
  std::size_t k = 0;
  for (auto const& p : probe.parameter_store().entries())
    for (std::size_t i = 0; i < p.size; ++i, ++k) {
      double& v = values(p.offset + i);
      double const old = v, h = 1e-6;
      v = old + h;
      double const up = loss_at();
      v = old - h;
      double const down = loss_at();
      v = old;
      worst = std::max(worst, telar::test::rel_diff((up - down) / (2 * h), grad[k], 1e-7));
    }
  CHECK(k == grad.size());
  CHECK(worst < 1e-5);
}

TEST_CASE("Serial training learns a synthetic problem", "[train]") {
  auto const xy = blobs<float>(512, 16, 4, 2);
  auto const& x = xy.first;
  auto const& y = xy.second;
  telar::TrainerOptions opts;
  opts.seed = 1;
  opts.lr = telar::constant_lr(0.01);
  telar::Trainer<Mlp<float>, telar::Serial, telar::Adam<float>> trainer(make_mlp<float>(16, 32, 4),
                                                                        {}, opts, 16);
  double const before = trainer.evaluate(x, y).loss;
  for (int epoch = 0; epoch < 5; ++epoch)
    for (std::size_t b = 0; b + 64 <= 512; b += 64)
      trainer.step(telar::rows(x, b, b + 64), telar::rows(y, b, b + 64));
  auto after = trainer.evaluate(x, y);
  CHECK(after.loss < 0.5 * before);
  CHECK(after.accuracy > 0.9);
  CHECK(trainer.steps() == 40);
}

TEST_CASE("Same seed, same parameters, bit for bit; another seed differs", "[train]") {
  auto const xy = blobs<float>(128, 8, 3, 4);
  auto const& x = xy.first;
  auto const& y = xy.second;
  auto run = [&](std::uint64_t seed) {
    telar::TrainerOptions opts;
    opts.seed = seed;
    telar::Trainer<Mlp<float>, telar::Serial, telar::AdamW<float>> t(make_mlp<float>(8, 16, 3), {},
                                                                     opts, 8);
    for (int s = 0; s < 4; ++s)
      t.step(telar::rows(x, 32 * s, 32 * s + 32), telar::rows(y, 32 * s, 32 * s + 32));
    return t.parameters();
  };
  auto a = run(5), b = run(5), c = run(6);
  CHECK(a == b);
  CHECK(a != c);
}

TEST_CASE("Micro-batches accumulate to the full-batch gradient", "[train]") {
  auto const xy = blobs<float>(96, 8, 3, 5);
  auto const& x = xy.first;
  auto const& y = xy.second;
  auto run = [&](int m) {
    telar::TrainerOptions opts;
    opts.seed = 2;
    opts.microbatches = m;
    opts.lr = telar::constant_lr(0.05);
    telar::Trainer<Mlp<float>, telar::Serial, telar::SGD<float>> t(make_mlp<float>(8, 16, 3), {},
                                                                   opts, 8);
    for (int s = 0; s < 3; ++s)
      t.step(telar::rows(x, 32 * s, 32 * s + 32), telar::rows(y, 32 * s, 32 * s + 32));
    return std::make_pair(t.param_l2(), t.parameters());
  };
  auto [l1, p1] = run(1);
  for (int m : {2, 3, 4, 32}) {
    auto [lm, pm] = run(m);
    INFO("microbatches " << m);
    CHECK(telar::test::rel_diff(l1, lm) < 1e-5);
    double worst = 0;
    for (std::size_t i = 0; i < p1.size(); ++i)
      worst = std::max(worst, double(std::abs(p1[i] - pm[i])));
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("A user-written optimizer (Lion) trains the model", "[train][optim]") {
  auto const xy = blobs<float>(256, 16, 4, 6);
  auto const& x = xy.first;
  auto const& y = xy.second;
  telar::TrainerOptions opts;
  opts.seed = 1;
  opts.lr = telar::constant_lr(3e-3);
  telar::Trainer<Mlp<float>, telar::Serial, Lion<float>> trainer(make_mlp<float>(16, 32, 4), {},
                                                                 opts, 16);
  double const before = trainer.evaluate(x, y).loss;
  for (int epoch = 0; epoch < 5; ++epoch)
    for (std::size_t b = 0; b + 32 <= 256; b += 32)
      trainer.step(telar::rows(x, b, b + 32), telar::rows(y, b, b + 32));
  auto after = trainer.evaluate(x, y);
  CHECK(after.loss < 0.5 * before);
  CHECK(after.accuracy > 0.9);
}

TEST_CASE("Trainer rejects bad batches with a clear message", "[train]") {
  auto const xy = blobs<float>(8, 4, 2, 7);
  auto const& x = xy.first;
  auto const& y = xy.second;
  telar::TrainerOptions opts;
  opts.microbatches = 16;
  telar::Trainer<Mlp<float>, telar::Serial, telar::SGD<float>> t(make_mlp<float>(4, 4, 2), {}, opts,
                                                                 4);
  try {
    t.step(x, y);
    FAIL("no exception");
  } catch (telar::ShapeError const& e) {
    CHECK(std::string(e.what()) ==
          "telar::Trainer::step: a batch of 8 samples cannot be split into 16 micro-batches");
  }
  CHECK_THROWS_AS((telar::Trainer<Mlp<float>, telar::Serial, telar::SGD<float>>(
                      make_mlp<float>(5, 4, 2), {}, telar::TrainerOptions{}, 4)),
                  telar::ShapeError);
}

namespace {
std::vector<std::string> regions_seen;
void on_push_region(char const* name) {
  regions_seen.emplace_back(name);
}
} // namespace

TEST_CASE("Every phase of a step is a Kokkos Tools region named telar::...", "[train][regions]") {
  auto const xy = blobs<float>(64, 16, 4, 2);
  telar::TrainerOptions opts;
  telar::Trainer<Mlp<float>, telar::Serial, telar::Adam<float>> trainer(make_mlp<float>(16, 32, 4),
                                                                        {}, opts, 16);
  // A tool's push-region callback, as a profiler would register it (the
  // Trainer's memory meter shares the callback table and must keep it).
  auto const previous = Kokkos::Tools::Experimental::get_callbacks();
  regions_seen.clear();
  Kokkos::Tools::Experimental::set_push_region_callback(on_push_region);
  trainer.step(xy.first, xy.second);
  trainer.evaluate(xy.first, xy.second);
  Kokkos::Tools::Experimental::set_callbacks(previous);
  for (char const* phase :
       {"telar::Trainer::step", "telar::Trainer::step::forward_backward",
        "telar::Trainer::step::reduce_gradients", "telar::Trainer::step::optimizer",
        "telar::Trainer::step::publish_parameters", "telar::Trainer::step::reduce_loss",
        "telar::Trainer::evaluate"}) {
    INFO(phase);
    CHECK(std::find(regions_seen.begin(), regions_seen.end(), phase) != regions_seen.end());
  }
  for (auto const& name : regions_seen) { // Telar's own regions are all telar::
    INFO(name);
    CHECK(name.rfind("telar::", 0) == 0);
  }
}

// docs/writing_a_loss.md's example: its values and gradient, and a Trainer
// given a configured instance.
TEST_CASE("The writing-a-loss example: a configured Huber loss", "[serial][loss]") {
  HuberLoss<double> huber;
  huber.delta = 1.0;
  telar::Matrix<double> y("y", 1, 2), t("t", 1, 2), dy("dy", 1, 2);
  auto hy = Kokkos::create_mirror_view(y);
  auto ht = Kokkos::create_mirror_view(t);
  hy(0, 0) = 0.2, hy(0, 1) = -3.0; // one quadratic term, one linear
  ht(0, 0) = 0.0, ht(0, 1) = 0.0;
  Kokkos::deep_copy(y, hy);
  Kokkos::deep_copy(t, ht);
  telar::LossSum const s = huber.forward_backward(Kokkos::DefaultExecutionSpace(), y, t, dy, 1.0);
  auto hd = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dy);
  CHECK(s.loss == Catch::Approx(0.5 * 0.04 + (3.0 - 0.5)));
  CHECK(hd(0, 0) == Catch::Approx(0.2));
  CHECK(hd(0, 1) == Catch::Approx(-1.0));

  using Model = telar::Sequential<telar::Dense<double>>;
  telar::TrainerOptions opts;
  opts.lr = telar::constant_lr(0.1);
  huber.delta = 0.5;
  telar::Trainer<Model, telar::Serial, telar::SGD<double>, HuberLoss<double>> trainer(
      Model(telar::Dense<double>(3, 2)), {}, opts, 3, huber);
  telar::Matrix<double> x("x", 4, 3), target("target", 4, 2);
  Kokkos::deep_copy(x, 1.0);
  Kokkos::deep_copy(target, 2.0);
  double const first = trainer.step(x, target).loss;
  double last = first;
  for (int i = 0; i < 5; ++i)
    last = trainer.step(x, target).loss;
  CHECK(std::isfinite(first));
  CHECK(last < first);
}

namespace {

// Under Precision<bf16, float> a step rounds the parameters once into a copy
// that the bf16 matmuls read (TrainerOptions::bf16_weight_copy) instead of
// converting each weight in every forward and backward. It must change
// where the words come from and nothing else: the same parameters and loss
// bit for bit, a change made through model() between steps seen, the copy
// planned and measured with the parameters.
template <class M>
void bf16_weight_copy_case() {
  if constexpr (telar::test::onednn_bf16_v<M>) { // the copy is oneDNN's (host memory)
    if (!telar::bf16_available())
      SKIP("no AVX512-BF16 or AMX: bf16 matmuls do not run here");
    using S = telar::test::on_space_t<telar::Strategy<telar::Precision<telar::bf16, float>>, M>;
    auto const xy = blobs<float>(64, 12, 3, 5);
    struct Run {
      std::vector<float> params;
      double eval_loss = 0;
      std::uint64_t hits = 0, conversions = 0;
      std::size_t store = 0; // values in the parameter store (padded)
      telar::MemoryBytes measured, planned;
    };
    auto run = [&](bool copy) {
      telar::TrainerOptions opts;
      opts.bf16_weight_copy = copy;
      opts.microbatches = 2;
      opts.batch_size = 64;
      telar::Trainer<Mlp<float>, S, telar::SGD<float>> t(make_mlp<float>(12, 32, 3),
                                                         telar::SGD<float>{0.05f}, opts, 12);
      std::uint64_t const h0 = telar::detail::bf16_copy().hits;
      std::uint64_t const c0 = telar::detail::bf16_copy().conversions;
      for (int s = 0; s < 3; ++s) {
        t.step(xy.first, xy.second);
        if (s == 0) { // between steps, through model(): the next step must see it
          auto w = t.model().template layer<2>().weight;
          Kokkos::parallel_for(
              Kokkos::RangePolicy<typename M::execution_space>(0, w.extent(0)),
              KOKKOS_LAMBDA(std::size_t i) { w(i, 0) = -2 * w(i, 0); });
          Kokkos::fence();
        }
      }
      Run r;
      r.eval_loss = t.evaluate(xy.first, xy.second).loss;
      r.hits = telar::detail::bf16_copy().hits - h0;
      r.conversions = telar::detail::bf16_copy().conversions - c0;
      r.params = t.parameters();
      r.store = t.parameter_store().size();
      r.measured = t.memory();
      r.planned = t.memory_plan().bytes;
      return r;
    };
    Run const with = run(true), without = run(false);
    CHECK(with.params == without.params);
    CHECK(with.eval_loss == without.eval_loss);
    // Per step: 2 micro-batches x (3 forward + 2 backward) weight operands,
    // and 3 in the evaluation: 33.
    CHECK(with.hits == 33);
    CHECK(without.hits == 0);
    // ... and each of the 3 weights rounded once a step and once in the
    // evaluation: 4 x 3.
    CHECK(with.conversions == 12);
    CHECK(without.conversions == 0);
    // 2 bytes per value of the store, with the parameters.
    using telar::MemoryCategory;
    std::size_t const copy_bytes =
        with.planned[MemoryCategory::parameters] - without.planned[MemoryCategory::parameters];
    CHECK(copy_bytes == with.store * sizeof(std::uint16_t));
    CHECK(with.measured[MemoryCategory::parameters] == with.planned[MemoryCategory::parameters]);
    CHECK(without.measured[MemoryCategory::parameters] ==
          without.planned[MemoryCategory::parameters]);
  }
}

} // namespace

TEST_CASE("Under Precision<bf16, float> the parameters are rounded once a step, changing nothing "
          "else",
          "[train][bf16]") {
  bf16_weight_copy_case<telar::DefaultMemorySpace>();
}
