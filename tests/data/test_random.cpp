// telar::Rng: the exact xoshiro256** stream, pinned values (the same on every
// platform), bounded integers, uniforms, normals and shuffles.
#include <telar/data/random.hpp>

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

namespace {

// Vigna's reference code, seeded the way Telar documents: splitmix64 started
// at mix64(mix64(seed) + stream).
struct ReferenceXoshiro {
  std::uint64_t s[4];
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static std::uint64_t splitmix64(std::uint64_t& x) {
    std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  ReferenceXoshiro(std::uint64_t seed, std::uint64_t stream) {
    std::uint64_t x = mix(mix(seed) + stream);
    for (auto& w : s) {
      w = splitmix64(x);
    }
  }
  std::uint64_t next() {
    std::uint64_t const result = rotl(s[1] * 5, 7) * 9;
    std::uint64_t const t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
  }
};

} // namespace

TEST_CASE("Rng is xoshiro256** seeded through splitmix64", "[data][random]") {
  for (std::uint64_t seed : {0ull, 1ull, 42ull, 0xFFFFFFFFFFFFFFFFull}) {
    for (std::uint64_t stream : {0ull, 7ull}) {
      telar::Rng rng(seed, stream);
      ReferenceXoshiro ref(seed, stream);
      for (int i = 0; i < 1000; ++i) {
        REQUIRE(rng.next_u64() == ref.next());
      }
    }
  }
}

TEST_CASE("Rng gives pinned values on every platform", "[data][random]") {
  // If one of these changes, every seeded result in Telar changes with it:
  // shuffles, initialisations, synthetic data.
  telar::Rng rng(42);
  std::uint64_t const u0 = rng.next_u64();
  std::uint64_t const u1 = rng.next_u64();
  CHECK(u0 == 0xA079BE94A9A52920ull);
  CHECK(u1 == 0xEFCBDB5DDC36F0B2ull);
  telar::Rng r2(42, 3);
  CHECK(r2.below(1000) == 740u);
  CHECK(r2.uniform() == 0x1.4e1792p-1f);
  CHECK(r2.normal_double() == 0x1.14cef0f3eb36ap-1);
}

TEST_CASE("Rng streams and seeds are distinct", "[data][random]") {
  std::set<std::uint64_t> firsts;
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    for (std::uint64_t stream = 0; stream < 50; ++stream) {
      firsts.insert(telar::Rng(seed, stream).next_u64());
    }
  }
  CHECK(firsts.size() == 2500);
  CHECK(telar::seed_combine(1, 2) != telar::seed_combine(2, 1));
  CHECK(telar::seed_combine(1, 2) != telar::seed_combine(1, 3));
  // Same arguments, same stream.
  telar::Rng a(9, 9), b(9, 9);
  for (int i = 0; i < 100; ++i) {
    REQUIRE(a() == b());
  }
}

TEST_CASE("Rng::below is in range and unbiased", "[data][random]") {
  telar::Rng rng(5);
  CHECK_THROWS_AS(rng.below(0), std::invalid_argument);
  CHECK(rng.below(1) == 0);
  std::vector<int> counts(7, 0);
  int const n = 70000;
  for (int i = 0; i < n; ++i) {
    auto const k = rng.below(7);
    REQUIRE(k < 7);
    ++counts[k];
  }
  for (int c : counts) {
    CHECK(std::abs(c - n / 7) < 500); // sigma ~ 93
  }
  // A bound near 2^64 exercises the rejection branch.
  std::uint64_t const big = 0xC000000000000000ull;
  for (int i = 0; i < 1000; ++i) {
    REQUIRE(rng.below(big) < big);
  }
}

TEST_CASE("Rng uniforms lie in [0, 1) with the right moments", "[data][random]") {
  telar::Rng rng(11);
  double sum = 0, sum_d = 0;
  int const n = 200000;
  for (int i = 0; i < n; ++i) {
    float const u = rng.uniform();
    double const d = rng.uniform_double();
    REQUIRE(u >= 0.0f);
    REQUIRE(u < 1.0f);
    REQUIRE(d >= 0.0);
    REQUIRE(d < 1.0);
    sum += u;
    sum_d += d;
  }
  CHECK(std::abs(sum / n - 0.5) < 0.005);
  CHECK(std::abs(sum_d / n - 0.5) < 0.005);
  for (int i = 0; i < 1000; ++i) {
    float const v = rng.uniform(-2.0f, 3.0f);
    REQUIRE(v >= -2.0f);
    REQUIRE(v <= 3.0f);
  }
}

TEST_CASE("Rng normals have mean 0 and variance 1", "[data][random]") {
  telar::Rng rng(3);
  int const n = 200000;
  double sum = 0, sum2 = 0, sum4 = 0;
  int beyond3 = 0;
  for (int i = 0; i < n; ++i) {
    double const z = rng.normal_double();
    sum += z;
    sum2 += z * z;
    sum4 += z * z * z * z;
    beyond3 += std::abs(z) > 3.0;
  }
  double const mean = sum / n, var = sum2 / n - mean * mean;
  CHECK(std::abs(mean) < 0.01);
  CHECK(std::abs(var - 1.0) < 0.02);
  CHECK(std::abs(sum4 / n - 3.0) < 0.1);                  // kurtosis of a normal
  CHECK(std::abs(beyond3 / double(n) - 0.0027) < 0.0007); // two-sided 3-sigma tail
  float const z = telar::Rng(3).normal(10.0f, 0.0f);
  CHECK(z == 10.0f);
}

TEST_CASE("portable_log agrees with std::log", "[data][random]") {
  telar::Rng rng(1);
  double worst = 0;
  for (int i = 0; i < 100000; ++i) {
    // Values across many binades, including those the polar method feeds it.
    double const x = std::ldexp(0.5 + rng.uniform_double(), int(rng.below(200)) - 150);
    double const ref = std::log(x);
    double const err =
        std::abs(telar::detail::portable_log(x) - ref) / std::max(std::abs(ref), 1e-300);
    worst = std::max(worst, err);
  }
  CHECK(worst < 1e-15); // a few ulp
  CHECK(telar::detail::portable_log(1.0) == 0.0);
  for (double const x : {1.0 + 0x1.0p-40, 1.0 - 0x1.0p-40, 0x1.0p-1000, 0x1.fffffffffffffp+1023}) {
    CHECK(std::abs(telar::detail::portable_log(x) / std::log(x) - 1.0) < 1e-15);
  }
}

TEST_CASE("shuffle_range makes uniform permutations", "[data][random]") {
  std::map<std::vector<int>, int> seen;
  telar::Rng rng(77);
  int const n = 24000;
  for (int i = 0; i < n; ++i) {
    std::vector<int> v{0, 1, 2, 3};
    telar::shuffle_range(v.begin(), v.end(), rng);
    ++seen[v];
  }
  CHECK(seen.size() == 24);
  for (auto const& [perm, count] : seen) {
    CHECK(std::abs(count - 1000) < 150); // sigma ~ 31
  }
  telar::Rng r1(8), r2(8);
  auto const p = telar::random_permutation(1000, r1);
  auto sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    REQUIRE(sorted[i] == i);
  }
  CHECK(p == telar::random_permutation(1000, r2));
  CHECK(telar::random_permutation(0, r1).empty());
}
