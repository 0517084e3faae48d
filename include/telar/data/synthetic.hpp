#pragma once
/*! \file
 *  \brief `telar::make_synthetic`: a seeded, deterministic, learnable
 *  classification problem for tests and benchmarks. */

#include <telar/data/dataset.hpp>
#include <telar/data/random.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace telar {

/*! \brief Settings of `telar::make_synthetic` beyond the problem's size. */
struct SyntheticOptions {
  /*! \brief Standard deviation of the noise around the class centres. */
  float noise = 0.5f;
  /*! \brief Index of the first sample to make: samples `first_sample ..
   *  first_sample + n - 1` of the seed's endless sequence. A test set of the
   *  same problem is a later range (the centres depend on the seed only). */
  std::size_t first_sample = 0;
};

/*! \brief Makes `n` samples of a Gaussian-blobs classification problem.
 *
 *  Each class `c` has a centre with coordinates drawn uniformly from [-1, 1);
 *  sample `i` gets a uniformly random label `y` and features
 *  `centre[y] + noise * N(0, 1)` per coordinate. With the default noise the
 *  classes overlap little once there are more than a handful of features, so
 *  a linear model or an MLP learns it quickly; raise the noise for a harder
 *  problem.
 *
 *  The output depends only on the arguments, bit for bit on every platform
 *  (see `telar::Rng`). Sample `i` is drawn from its own stream, so any range
 *  of samples can be made on its own and a shorter set is a prefix of a
 *  longer one.
 *  \code
 *  telar::Dataset train = telar::make_synthetic(4096, 784, 10, 1);
 *  telar::Dataset test = telar::make_synthetic(1024, 784, 10, 1, {0.5f, 4096}); // held out
 *  \endcode
 *  \param n number of samples
 *  \param features features per sample (at least 1)
 *  \param classes number of classes (at least 1)
 *  \param seed the seed; it fixes the problem (the centres) and the samples
 *  \param options noise level and first sample
 *  \return the data set, named `synthetic(n=..,features=..,classes=..,seed=..)`
 *  \throws std::invalid_argument if `features` or `classes` is 0 or negative */
inline Dataset make_synthetic(std::size_t n, std::size_t features, int classes, std::uint64_t seed,
                              SyntheticOptions const& options = {}) {
  if (features == 0 || classes < 1) {
    throw std::invalid_argument("telar::make_synthetic: features = " + std::to_string(features) +
                                " and classes = " + std::to_string(classes) +
                                " must both be at least 1");
  }
  // Separate the generator's streams from other users of the same seed.
  std::uint64_t const base = seed_combine(seed, 0x73796E7468657469ull); // "synthetic"
  Dataset d;
  d.size = n;
  d.features = features;
  d.classes = classes;
  d.shape = {features};
  d.name = "synthetic(n=" + std::to_string(n) + ",features=" + std::to_string(features) +
           ",classes=" + std::to_string(classes) + ",seed=" + std::to_string(seed) +
           (options.first_sample != 0 ? ",first=" + std::to_string(options.first_sample) : "") +
           ")";

  std::vector<float> centres(std::size_t(classes) * features);
  Rng centre_rng(base, 0);
  for (auto& c : centres) {
    c = centre_rng.uniform(-1.0f, 1.0f);
  }
  d.x.resize(n * features);
  d.y.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    Rng rng(base, options.first_sample + i + 1);
    auto const label = static_cast<std::int32_t>(rng.below(std::uint64_t(classes)));
    d.y[i] = label;
    float const* centre = &centres[std::size_t(label) * features];
    float* row = &d.x[i * features];
    for (std::size_t f = 0; f < features; ++f) {
      row[f] = rng.normal(centre[f], options.noise);
    }
  }
  return d;
}

} // namespace telar
