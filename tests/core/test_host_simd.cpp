// The two copies of a host loop (the build's and AVX-512's, picked when it
// runs: core/detail/host_simd.hpp) compute the same bits: activations
// forward and backward (specials included), LayerNorm's rows and parameter
// gradients, attention (softmax and its recomputation), the optimizers'
// update and the non-finite count. Where the machine or compiler has only
// the build's copy, the test says so and compares that copy with itself.
#include "support.hpp"

#include <telar/core/detail/host_simd.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/attention.hpp>
#include <telar/layers/normalization.hpp>
#include <telar/optim/adam.hpp>
#include <telar/optim/detail/engine.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/parallel/detail/nonfinite.hpp>

#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

using telar::test::Exec;
using telar::test::random_matrix;
using telar::test::to_host;
using Mat = telar::Matrix<float>;
using Floats = std::vector<float>;
using telar::detail::HostSimd;

namespace {

Floats values(Mat const& m) {
  auto h = to_host(m);
  return Floats(h.data(), h.data() + h.size());
}
template <class L>
Floats gradients(L& layer) {
  Floats out;
  layer.parameters([&](char const*, auto&, auto& grad) {
    auto h = to_host(grad);
    out.insert(out.end(), h.data(), h.data() + h.size());
  });
  return out;
}

// run() under the build's copy and, where there is one, AVX-512's; checks
// the two results are the same bits (NaNs included).
template <class Run>
void same_bits_under_both(std::string const& what, Run run) {
  INFO(what);
  HostSimd& choice = telar::detail::host_simd_choice();
  HostSimd const before = choice;
  choice = HostSimd::baseline;
  Floats const base = run();
  choice = telar::detail::host_simd_available();
  if (choice == HostSimd::baseline)
    WARN("only the build's copy here (no AVX-512, another compiler or TELAR_HOST_SIMD)");
  Floats const wide = run();
  choice = before;
  REQUIRE(base.size() == wide.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < base.size(); ++i)
    differ += std::memcmp(&base[i], &wide[i], sizeof(float)) != 0;
  CHECK(differ == 0);
}

// A layer's output, input gradient and parameter gradients for input x
// and output gradient dy (both [n, k], the output as the input).
template <class L>
Floats forward_backward(L& layer, Mat x, Mat dy) {
  Mat y("y", x.extent(0), x.extent(1)), dx("dx", x.extent(0), x.extent(1));
  typename L::saved_type saved;
  layer.forward(Exec{}, x, y, saved);
  layer.backward_input(Exec{}, dy, dx, saved);
  layer.backward_weight(Exec{}, dy, saved);
  Floats out = values(y), g = values(dx), w = gradients(layer);
  out.insert(out.end(), g.begin(), g.end());
  out.insert(out.end(), w.begin(), w.end());
  return out;
}

// Forward and backward of an element-wise layer over n values: random ones
// over [-8, 8] after a row of specials.
template <class L>
void check_activation(std::string const& name, L layer, std::size_t n) {
  same_bits_under_both(name, [&] {
    Mat x = random_matrix<float>(1, n, 31, 8.0), y("y", 1, n), dx("dx", 1, n);
    Mat dy = random_matrix<float>(1, n, 32);
    auto hx = Kokkos::create_mirror_view(x);
    Kokkos::deep_copy(hx, x);
    float const inf = std::numeric_limits<float>::infinity();
    float const specials[] = {0.f, -0.f, inf, -inf, std::nanf(""), 1e-30f, 88.f, -88.f, 4.f, -4.f};
    for (std::size_t i = 0; i < std::size(specials); ++i)
      hx(0, i) = specials[i];
    Kokkos::deep_copy(x, hx);
    typename L::saved_type saved;
    layer.forward(Exec{}, x, y, saved);
    layer.backward_input(Exec{}, dy, dx, saved);
    Floats out = values(y), g = values(dx);
    out.insert(out.end(), g.begin(), g.end());
    return out;
  });
}

// Three steps of an optimizer over n values; the weights after them, and
// the gradients' non-finite count as the last value.
template <class Opt>
Floats three_steps(Opt opt, std::size_t n) {
  telar::Vector<float> w("w", n), g("g", n);
  Kokkos::deep_copy(w, Kokkos::subview(random_matrix<float>(1, n, 61), 0, Kokkos::ALL));
  telar::detail::OptimizerEngine<Opt, telar::DefaultMemorySpace> engine(opt, n);
  std::vector<telar::detail::TensorSegment> segs{{0, n, 1}};
  for (int s = 0; s < 3; ++s) {
    Kokkos::deep_copy(g, Kokkos::subview(random_matrix<float>(1, n, 62 + s), 0, Kokkos::ALL));
    telar::StepInfo<float> info;
    info.lr = 0.01f;
    info.step = s + 1;
    engine.step(Exec{}, w, g, segs, {0}, 1, info, 0, {});
  }
  auto hg = Kokkos::create_mirror_view(g);
  Kokkos::deep_copy(hg, g);
  hg(n / 2) = std::nanf("");
  hg(n - 1) = -std::numeric_limits<float>::infinity();
  Kokkos::deep_copy(g, hg);
  Floats out = values(telar::Matrix<float>(w.data(), 1, n));
  out.push_back(float(telar::detail::count_nonfinite(Exec{}, g, 0, n)));
  return out;
}

} // namespace

TEST_CASE("Optimizers and the non-finite count: the AVX-512 copy gives the build's bits",
          "[host_simd][optim]") {
  std::size_t const n = 10007;
  telar::SGD<float> sgd;
  sgd.momentum = 0.9f;
  sgd.weight_decay = 1e-4f;
  same_bits_under_both("SGD with momentum", [&] { return three_steps(sgd, n); });
  same_bits_under_both("AdamW", [&] { return three_steps(telar::AdamW<float>{}, n); });
  same_bits_under_both("the count itself", [&] {
    Floats out = three_steps(telar::SGD<float>{}, n);
    CHECK(out.back() == 2.f);
    return out;
  });
}

TEST_CASE("Element-wise activations: the AVX-512 copy gives the build's bits", "[host_simd]") {
  for (std::size_t n : {std::size_t(13), std::size_t(10007)}) { // remainders of 4, 16 and 4096
    check_activation("GELU", telar::GELU<float>{}, n);
    check_activation("GELUTanh", telar::GELUTanh<float>{}, n);
    check_activation("SiLU", telar::SiLU<float>{}, n);
    check_activation("Sigmoid", telar::Sigmoid<float>{}, n);
    check_activation("Tanh", telar::Tanh<float>{}, n);
    check_activation("ReLU", telar::ReLU<float>{}, n);
    check_activation("HardSwish", telar::HardSwish<float>{}, n);
  }
}

TEST_CASE("LayerNorm: the AVX-512 copy gives the build's bits", "[host_simd][normalization]") {
  for (std::size_t row : {5, 16, 37, 512}) {
    same_bits_under_both("LayerNorm(" + std::to_string(row) + ")", [&] {
      telar::LayerNorm<float> ln(row);
      ln.initialize(0);
      return forward_backward(ln, random_matrix<float>(3, 2 * row, 41, 4.0),
                              random_matrix<float>(3, 2 * row, 42));
    });
  }
}

TEST_CASE("Causal self-attention: the AVX-512 copy gives the build's bits", "[host_simd]") {
  std::size_t const hidden = 16, seq = 37;
  same_bits_under_both("CausalSelfAttention(16, 2), seq 37", [&] {
    telar::CausalSelfAttention<float> attn(hidden, 2);
    attn.initialize(5);
    return forward_backward(attn, random_matrix<float>(2, seq * hidden, 51, 2.0),
                            random_matrix<float>(2, seq * hidden, 52));
  });
}
