#pragma once
// The content of one synthetic volume: smooth structured background (a
// gradient and a few low-frequency waves), white noise, and ellipsoidal
// lesions of random size, class and contrast. A function of (options,
// sample index) only, so any rank can make any sample.
#include <telar/data/random.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace telar::detail {

struct VolumeParams { // what write_synthetic_volumes needs of its options
  long long channels, depth, height, width;
  int classes, max_lesions;
  std::uint64_t seed;
};

struct Lesion {
  float centre[3], radius[3], contrast;
  std::uint8_t cls;
};

// Draws sample n's lesions: 1 .. max_lesions, radii 8 % to 25 % of each
// extent (at least one voxel), contrast 0.6 .. 1.5 (the background's
// structure spans about +-1.5, so no threshold separates lesions).
inline std::vector<Lesion> draw_lesions(VolumeParams const& p, Rng& rng) {
  long long const dims[3] = {p.depth, p.height, p.width};
  std::vector<Lesion> out(1 + rng.below(std::uint64_t(p.max_lesions)));
  for (Lesion& l : out) {
    l.cls = std::uint8_t(1 + rng.below(std::uint64_t(p.classes - 1)));
    for (int a = 0; a < 3; ++a) {
      float const e = float(dims[a]);
      l.centre[a] = rng.uniform(0.0f, e);
      l.radius[a] = rng.uniform(std::max(1.0f, 0.08f * e), std::max(1.5f, 0.25f * e));
    }
    l.contrast = rng.uniform(0.6f, 1.5f);
  }
  return out;
}

// Fills img [C, D, H, W] and lab [D, H, W] with sample n.
inline void make_volume(VolumeParams const& p, long long n, float* img, std::uint8_t* lab) {
  Rng rng(seed_combine(p.seed, 0x766F6C756D6573ull), std::uint64_t(n)); // "volumes"
  float grad[3], freq[4][3], phase[4], amp[4];
  for (float& g : grad)
    g = rng.uniform(-1.0f, 1.0f);
  for (int k = 0; k < 4; ++k) {
    for (float& f : freq[k])
      f = rng.uniform(-2.0f, 2.0f) * 6.2831853f; // up to 2 periods per volume
    phase[k] = rng.uniform(0.0f, 6.2831853f);
    amp[k] = rng.uniform(0.15f, 0.35f);
  }
  std::vector<Lesion> const lesions = draw_lesions(p, rng);
  long long const vox = p.depth * p.height * p.width;
  std::vector<float> base(std::size_t(vox), 0.0f), bump(std::size_t(vox), 0.0f);
  for (long long d = 0, i = 0; d < p.depth; ++d)
    for (long long h = 0; h < p.height; ++h)
      for (long long w = 0; w < p.width; ++w, ++i) {
        float const x[3] = {(float(d) + 0.5f) / float(p.depth), (float(h) + 0.5f) / float(p.height),
                            (float(w) + 0.5f) / float(p.width)};
        float b = grad[0] * x[0] + grad[1] * x[1] + grad[2] * x[2];
        for (int k = 0; k < 4; ++k)
          b += amp[k] *
               std::cos(freq[k][0] * x[0] + freq[k][1] * x[1] + freq[k][2] * x[2] + phase[k]);
        base[std::size_t(i)] = b;
        lab[i] = 0;
        float const v[3] = {float(d) + 0.5f, float(h) + 0.5f, float(w) + 0.5f};
        for (Lesion const& l : lesions) { // a later lesion covers an earlier one
          float q = 0;
          for (int a = 0; a < 3; ++a)
            q += (v[a] - l.centre[a]) * (v[a] - l.centre[a]) / (l.radius[a] * l.radius[a]);
          if (q <= 1.0f) {
            lab[i] = l.cls;
            bump[std::size_t(i)] =
                l.contrast * (1.0f - 0.4f * q) * (1.0f + 0.3f * float(l.cls - 1));
          }
        }
      }
  for (long long c = 0; c < p.channels; ++c) {
    float const gain = 1.0f + 0.25f * float(c);
    for (long long i = 0; i < vox; ++i)
      img[c * vox + i] =
          gain * (base[std::size_t(i)] + bump[std::size_t(i)]) + rng.normal(0, 0.25f);
  }
}

} // namespace telar::detail
