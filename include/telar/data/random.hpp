#pragma once
/*! \file
 *  \brief `telar::Rng`: Telar's own seeded random number generator, with the
 *  same output on every platform, and the shuffles built on it.
 *
 *  Telar needs the same random stream on every rank and every machine (data
 *  shuffling, parameter initialisation, synthetic data), so it does not use
 *  `std::mt19937` with `std::*_distribution` or `std::shuffle`: the standard
 *  fixes the engines but not the distributions or the shuffle, and libstdc++,
 *  libc++ and MSVC give different numbers. Everything here is defined bit for
 *  bit: xoshiro256** seeded through splitmix64, integers by rejection,
 *  uniforms from the top bits, normals by the polar form of Box-Muller with a
 *  logarithm of our own (libm's `log` may differ in the last bit between
 *  libraries). The only assumption is IEEE-754 arithmetic without fused
 *  multiply-add contraction across statements, which is what C++17 compilers
 *  do in their standard (non-GNU, non-fast-math) modes. */

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

namespace telar {

namespace detail {

// splitmix64's output function (Stafford's variant 13): a bijection on 64-bit
// integers that mixes every input bit into every output bit.
constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr std::uint64_t rotl64(std::uint64_t x, int k) noexcept {
  return (x << k) | (x >> (64 - k));
}

// Natural logarithm of a positive, finite, normal double from + - * / only, so
// that it gives the same bits everywhere (libm's log is only faithfully
// rounded and differs between libraries). Accurate to a few ulp:
// x = m * 2^e with m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(t), t = (m-1)/(m+1).
inline double portable_log(double x) noexcept {
  int e = 0;
  double m = std::frexp(x, &e); // exact: m in [1/2, 1)
  if (m < 0.70710678118654752440) {
    m = m * 2.0; // exact
    e = e - 1;
  }
  double const t = (m - 1.0) / (m + 1.0); // |t| <= 0.1716
  double const t2 = t * t;
  // atanh(t)/t = sum t^(2k) / (2k + 1); 12 terms reach 2^-53 for |t| <= 0.1716.
  // One operation per statement keeps compilers from fusing into FMAs.
  double poly = 1.0 / 23.0;
  for (int k = 10; k >= 0; --k) {
    double const scaled = poly * t2;
    poly = scaled + 1.0 / double(2 * k + 1);
  }
  double const ln2_hi = 6.93147180369123816490e-01; // top 32 bits of log(2)
  double const ln2_lo = 1.90821492927058770002e-10; // log(2) - ln2_hi
  double const de = double(e);
  double const two_t = 2.0 * t;
  double const series = two_t * poly;
  double const low = de * ln2_lo;
  double const high = de * ln2_hi; // exact: e has at most 11 bits
  double const small = series + low;
  return high + small;
}

} // namespace detail

/*! \brief Combines a seed with a value (a tag, an index, a rank) into a new
 *  seed, so that independent consumers of one user seed get unrelated
 *  streams.
 *
 *  \code
 *  telar::Rng init(telar::seed_combine(seed, layer_index));
 *  \endcode
 *  \param seed the seed to derive from
 *  \param value what distinguishes the derived seed
 *  \return a seed that differs for every `value` under one `seed` */
constexpr std::uint64_t seed_combine(std::uint64_t seed, std::uint64_t value) noexcept {
  return detail::mix64(detail::mix64(seed ^ 0x6A09E667F3BCC909ull) + value);
}

/*! \brief Telar's random number generator: xoshiro256** (Blackman and Vigna),
 *  seeded through splitmix64, with distributions that give the same bits on
 *  every platform.
 *
 *  Fast (about 1 ns a number), 256 bits of state, period 2^256 - 1. One seed
 *  gives a family of independent streams: `Rng(seed, stream)`; use the stream
 *  for the epoch, the rank or the sample index. Satisfies the standard's
 *  UniformRandomBitGenerator, but prefer the members below to the
 *  `std::*_distribution`s, whose output depends on the standard library.
 *  Host code only.
 *
 *  \code
 *  telar::Rng rng(42);
 *  std::uint64_t k = rng.below(10); // 0..9
 *  float u = rng.uniform();         // [0, 1)
 *  float z = rng.normal();          // N(0, 1)
 *  \endcode */
class Rng {
public:
  /*! \brief The type of the raw numbers. */
  using result_type = std::uint64_t;

  /*! \brief Smallest raw number, for UniformRandomBitGenerator. */
  static constexpr result_type min() noexcept { return 0; }
  /*! \brief Largest raw number, for UniformRandomBitGenerator. */
  static constexpr result_type max() noexcept { return std::numeric_limits<result_type>::max(); }

  /*! \brief Seeds the generator.
   *  \param seed the user's seed
   *  \param stream selects one of 2^64 independent streams for this seed */
  explicit Rng(std::uint64_t seed = 0, std::uint64_t stream = 0) noexcept {
    std::uint64_t z = detail::mix64(detail::mix64(seed) + stream);
    for (auto& word : s_) {
      z += 0x9E3779B97F4A7C15ull; // splitmix64: never four zero words
      word = detail::mix64(z);
    }
  }

  /*! \brief Next raw 64-bit number (xoshiro256**). */
  std::uint64_t next_u64() noexcept {
    std::uint64_t const result = detail::rotl64(s_[1] * 5, 7) * 9;
    std::uint64_t const t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = detail::rotl64(s_[3], 45);
    return result;
  }

  /*! \brief Next raw number; the same as `next_u64()`. */
  result_type operator()() noexcept { return next_u64(); }

  /*! \brief Next 32-bit number (the high half of `next_u64()`). */
  std::uint32_t next_u32() noexcept { return std::uint32_t(next_u64() >> 32); }

  /*! \brief A uniform integer in `[0, bound)`, without modulo bias.
   *  \param bound exclusive upper end; must be positive
   *  \throws std::invalid_argument if `bound` is 0 */
  std::uint64_t below(std::uint64_t bound) {
    if (bound == 0) {
      throw std::invalid_argument("telar::Rng::below: bound must be positive");
    }
    // Reject the lowest (2^64 mod bound) values so every residue is equally likely.
    std::uint64_t const threshold = (0 - bound) % bound;
    for (;;) {
      std::uint64_t const r = next_u64();
      if (r >= threshold) {
        return r % bound;
      }
    }
  }

  /*! \brief A uniform float in `[0, 1)`: one of the 2^24 multiples of 2^-24, exactly. */
  float uniform() noexcept { return float(next_u64() >> 40) * 0x1.0p-24f; }

  /*! \brief A uniform float in `[lo, hi)` (rounding may give `hi` when the
   *  range is wide compared to its ends).
   *  \param lo lower end
   *  \param hi upper end */
  float uniform(float lo, float hi) noexcept {
    float const scaled = (hi - lo) * uniform();
    return lo + scaled;
  }

  /*! \brief A uniform double in `[0, 1)`: one of the 2^53 multiples of 2^-53, exactly. */
  double uniform_double() noexcept { return double(next_u64() >> 11) * 0x1.0p-53; }

  /*! \brief A standard normal double (mean 0, variance 1), by the polar form of
   *  Box-Muller; the second number of each pair is kept for the next call. */
  double normal_double() noexcept {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    for (;;) {
      double const u = 2.0 * uniform_double() - 1.0; // exact
      double const v = 2.0 * uniform_double() - 1.0;
      double const uu = u * u;
      double const vv = v * v;
      double const s = uu + vv;
      if (s > 0.0 && s < 1.0) {
        double const f = std::sqrt(-2.0 * detail::portable_log(s) / s); // sqrt is exact-rounded
        spare_ = v * f;
        has_spare_ = true;
        return u * f;
      }
    }
  }

  /*! \brief A normal float.
   *  \param mean the mean
   *  \param stddev the standard deviation */
  float normal(float mean = 0.0f, float stddev = 1.0f) noexcept {
    float const scaled = stddev * float(normal_double());
    return mean + scaled;
  }

private:
  std::uint64_t s_[4] = {};
  double spare_ = 0.0;
  bool has_spare_ = false;
};

/*! \brief Shuffles `[first, last)` in place with the Fisher-Yates algorithm
 *  driven by `rng`: the same permutation on every platform (unlike
 *  `std::shuffle`, whose algorithm the standard leaves open).
 *  \tparam RandomIt a random-access iterator
 *  \param first begin of the range
 *  \param last end of the range
 *  \param rng the generator; advanced by one bounded draw per element */
template <class RandomIt>
void shuffle_range(RandomIt first, RandomIt last, Rng& rng) {
  static_assert(std::is_base_of_v<std::random_access_iterator_tag,
                                  typename std::iterator_traits<RandomIt>::iterator_category>,
                "telar::shuffle_range: needs random-access iterators");
  auto const n = static_cast<std::uint64_t>(last - first);
  for (std::uint64_t i = n; i > 1; --i) {
    auto const j = rng.below(i);
    using std::swap;
    swap(first[static_cast<std::ptrdiff_t>(i - 1)], first[static_cast<std::ptrdiff_t>(j)]);
  }
}

/*! \brief A uniformly random permutation of `0 .. n-1`, the same on every platform.
 *  \param n the length
 *  \param rng the generator
 *  \return the permutation (Fisher-Yates applied to the identity) */
inline std::vector<std::size_t> random_permutation(std::size_t n, Rng& rng) {
  std::vector<std::size_t> p(n);
  std::iota(p.begin(), p.end(), std::size_t(0));
  shuffle_range(p.begin(), p.end(), rng);
  return p;
}

} // namespace telar
