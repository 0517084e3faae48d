// make_synthetic: deterministic (pinned), prefix-stable, labelled in range,
// and learnable.
#include <telar/data/synthetic.hpp>

#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

std::uint64_t fnv1a(telar::Dataset const& d) {
  std::uint64_t h = 1469598103934665603ull;
  auto add = [&](void const* p, std::size_t n) {
    auto const* q = static_cast<unsigned char const*>(p);
    for (std::size_t i = 0; i < n; ++i) {
      h = (h ^ q[i]) * 1099511628211ull;
    }
  };
  add(d.x.data(), d.x.size() * sizeof(float));
  add(d.y.data(), d.y.size() * sizeof(std::int32_t));
  return h;
}

} // namespace

TEST_CASE("make_synthetic is deterministic and pinned", "[data][synthetic]") {
  telar::Dataset const a = telar::make_synthetic(100, 7, 3, 2024);
  telar::Dataset const b = telar::make_synthetic(100, 7, 3, 2024);
  CHECK(a.x == b.x);
  CHECK(a.y == b.y);
  // The same bits on every platform (IEEE-754 floats, no libm in the path):
  // if this fails, seeded results of tests and examples changed too.
  CHECK(fnv1a(a) == 0x39C9C26C4E41D597ull);
  CHECK(a.name == "synthetic(n=100,features=7,classes=3,seed=2024)");

  telar::Dataset const c = telar::make_synthetic(100, 7, 3, 2025);
  CHECK(c.x != a.x);
}

TEST_CASE("make_synthetic samples are prefix-stable and addressable", "[data][synthetic]") {
  telar::Dataset const all = telar::make_synthetic(50, 5, 4, 9);
  telar::Dataset const head = telar::make_synthetic(20, 5, 4, 9);
  telar::Dataset const tail = telar::make_synthetic(30, 5, 4, 9, {0.5f, 20});
  CHECK(std::vector<float>(all.x.begin(), all.x.begin() + 100) == head.x);
  CHECK(std::vector<float>(all.x.begin() + 100, all.x.end()) == tail.x);
  CHECK(std::vector<std::int32_t>(all.y.begin() + 20, all.y.end()) == tail.y);
  CHECK(tail.name == "synthetic(n=30,features=5,classes=4,seed=9,first=20)");
}

TEST_CASE("make_synthetic fills a consistent data set", "[data][synthetic]") {
  telar::Dataset const d = telar::make_synthetic(3000, 11, 5, 1);
  CHECK(d.size == 3000);
  CHECK(d.features == 11);
  CHECK(d.classes == 5);
  CHECK(d.shape == std::vector<std::size_t>{11});
  CHECK(d.x.size() == 3000 * 11);
  REQUIRE(d.y.size() == 3000);
  std::vector<int> counts(5, 0);
  for (auto y : d.y) {
    REQUIRE(y >= 0);
    REQUIRE(y < 5);
    ++counts[std::size_t(y)];
  }
  for (int c : counts) {
    CHECK(std::abs(c - 600) < 120);
  }
  for (float v : d.x) {
    REQUIRE(std::isfinite(v));
  }
  CHECK(telar::make_synthetic(0, 3, 2, 1).x.empty());
  CHECK_THROWS_AS(telar::make_synthetic(10, 0, 2, 1), std::invalid_argument);
  CHECK_THROWS_AS(telar::make_synthetic(10, 3, 0, 1), std::invalid_argument);
}

TEST_CASE("make_synthetic is learnable", "[data][synthetic]") {
  // Nearest centroid, fitted on a training range, scored on a held-out range.
  std::size_t const f = 16;
  int const k = 4;
  telar::Dataset const train = telar::make_synthetic(2000, f, k, 5);
  telar::Dataset const test = telar::make_synthetic(1000, f, k, 5, {0.5f, 2000});
  std::vector<double> centroid(k * f, 0.0);
  std::vector<int> count(k, 0);
  for (std::size_t i = 0; i < train.size; ++i) {
    auto const y = std::size_t(train.y[i]);
    ++count[y];
    for (std::size_t j = 0; j < f; ++j) {
      centroid[y * f + j] += train.x[i * f + j];
    }
  }
  for (int c = 0; c < k; ++c) {
    for (std::size_t j = 0; j < f; ++j) {
      centroid[std::size_t(c) * f + j] /= count[std::size_t(c)];
    }
  }
  int correct = 0;
  for (std::size_t i = 0; i < test.size; ++i) {
    int best = -1;
    double best_d = std::numeric_limits<double>::max();
    for (int c = 0; c < k; ++c) {
      double dist = 0;
      for (std::size_t j = 0; j < f; ++j) {
        double const diff = test.x[i * f + j] - centroid[std::size_t(c) * f + j];
        dist += diff * diff;
      }
      if (dist < best_d) {
        best_d = dist;
        best = c;
      }
    }
    correct += best == test.y[i];
  }
  CHECK(correct > 950);
  // The noise level changes the features, not the labels.
  telar::Dataset const hard = telar::make_synthetic(100, f, k, 5, {4.0f, 0});
  CHECK(hard.y == std::vector<std::int32_t>(train.y.begin(), train.y.begin() + 100));
}
