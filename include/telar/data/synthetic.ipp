// What telar/data/synthetic.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/data/synthetic.hpp>

namespace telar {

TELAR_DECL Dataset make_synthetic(std::size_t n, std::size_t features, int classes,
                                  std::uint64_t seed, SyntheticOptions const& options) {
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
