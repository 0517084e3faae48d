#pragma once
/*! \file
 *  \brief `telar::make_synthetic`: a seeded, deterministic, learnable
 *  classification problem for tests and benchmarks. */

#include <telar/core/detail/decl.hpp>
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
TELAR_DECL Dataset make_synthetic(std::size_t n, std::size_t features, int classes,
                                  std::uint64_t seed, SyntheticOptions const& options = {});

} // namespace telar

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/data/synthetic.ipp>
#endif
