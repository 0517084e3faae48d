#pragma once
/*! \file
 *  \brief Finite-difference gradient check for layer authors (no test
 *  framework needed).
 *
 *  \code
 *  MyConv<double> conv(3, 8, 3);
 *  auto report = telar::check_gradients(conv, telar::Shape{3, 9, 9}, 4);  // 4 samples
 *  if (!report.passed(1e-6)) std::cerr << report.str();
 *  \endcode
 *  The layer (value_type double) gets its input shape through build() (if it
 *  has one) and its parameters through initialize(seed) (if it has one). The
 *  check takes L(x, W) = sum(y .* R) for a fixed random R, so dL/dy = R, runs
 *  the layer's backward (split or fused), and compares dL/dx and every
 *  parameter gradient with central differences, entry by entry.
 */
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace telar {

/*! \brief Worst relative differences between analytic and finite-difference
 *  gradients, per tensor. */
struct GradientReport {
  /*! \brief One checked tensor. */
  struct Entry {
    std::string tensor;  //!< "input" or the parameter's name
    double worst = 0;    //!< max over entries of |fd - analytic| / max(|fd|, |analytic|, floor)
    std::size_t at = 0;  //!< flat index of the worst entry
    double analytic = 0; //!< the layer's gradient there
    double numeric = 0;  //!< the central difference there
  };
  std::vector<Entry> tensors; //!< input first, then each parameter
  /*! \brief The largest difference over all tensors. */
  double worst() const {
    double w = 0;
    for (auto const& e : tensors)
      w = std::max(w, e.worst);
    return w;
  }
  /*! \brief True when every tensor is within \p tol. \param tol relative tolerance */
  bool passed(double tol) const { return worst() <= tol; }
  /*! \brief One line per tensor, for a failure message. */
  std::string str() const {
    std::string s;
    for (auto const& e : tensors)
      s += e.tensor + ": worst " + std::to_string(e.worst) + " at " + std::to_string(e.at) +
           " (analytic " + std::to_string(e.analytic) + ", numeric " + std::to_string(e.numeric) +
           ")\n";
    return s;
  }
};

/*! \brief Settings of check_gradients. */
struct GradientCheckOptions {
  double step = 1e-6;       //!< central-difference step h
  double floor = 1e-3;      //!< relative differences use max(|a|, |b|, floor) below
  std::uint64_t seed = 1;   //!< seeds the input, R and initialize()
  double input_scale = 1.0; //!< inputs uniform in [-input_scale, input_scale)
  bool initialize = true;   //!< call initialize(seed) if the layer has it
};

namespace detail {

inline double fd_uniform(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + i + 1;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return double(x >> 11) / double(1ull << 53) * 2.0 - 1.0;
}

template <class M>
void fd_fill(M const& m, std::uint64_t seed, double scale) {
  auto h = Kokkos::create_mirror_view(m);
  for (std::size_t i = 0; i < m.size(); ++i)
    h.data()[i] = scale * fd_uniform(seed, i);
  Kokkos::deep_copy(m, h);
}

// sum(y .* R) after a fresh forward.
template <class L, class M>
double fd_probe(L& layer, M const& x, M const& R) {
  using Exec = typename M::memory_space::execution_space;
  M y("telar::check_gradients::y", x.extent(0), R.extent(1));
  typename layer_traits<L>::saved_type saved;
  layer.forward(Exec{}, x, y, saved);
  Exec{}.fence();
  auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, y);
  auto hr = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, R);
  double s = 0;
  for (std::size_t i = 0; i < hy.size(); ++i)
    s += hy.data()[i] * hr.data()[i];
  return s;
}

// Central differences of f over every entry of v against `analytic`.
template <class V, class A, class F>
GradientReport::Entry fd_compare(std::string name, V v, A const& analytic, F&& f,
                                 GradientCheckOptions const& o) {
  GradientReport::Entry e;
  e.tensor = std::move(name);
  auto hv = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(hv, v);
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, analytic);
  for (std::size_t i = 0; i < v.size(); ++i) {
    double const old = hv.data()[i];
    hv.data()[i] = old + o.step;
    Kokkos::deep_copy(v, hv);
    double const up = f();
    hv.data()[i] = old - o.step;
    Kokkos::deep_copy(v, hv);
    double const down = f();
    hv.data()[i] = old;
    Kokkos::deep_copy(v, hv);
    double const fd = (up - down) / (2 * o.step);
    double const a = ha.data()[i];
    double const scale = std::max({std::fabs(fd), std::fabs(a), o.floor});
    double const rel = std::fabs(fd - a) / scale;
    if (rel > e.worst || i == 0) {
      e.worst = std::max(e.worst, rel);
      e.at = i;
      e.analytic = a;
      e.numeric = fd;
    }
  }
  return e;
}

// dx and the parameter gradients from dy: split backward (input, then
// weight) or fused, whichever the layer has.
template <class L, class Exec, class M, class S>
void run_backward(L& layer, Exec const& exec, M const& dy, M const& dx, S const& saved) {
  if constexpr (layer_traits<L>::has_split_backward) {
    layer.backward_input(exec, dy, dx, saved);
    if constexpr (layer_traits<L>::has_backward_weight)
      layer.backward_weight(exec, dy, saved);
  } else {
    layer.backward(exec, dy, dx, saved);
  }
}

} // namespace detail

/*! \brief Checks a layer's input and parameter gradients against central
 *  differences for a batch of \p samples samples of shape \p in.
 *  \param layer a layer with value_type double (built and initialised here)
 *  \param in per-sample input shape \param samples batch size \param o settings
 *  \return the worst relative difference of each tensor */
template <class L>
GradientReport check_gradients(L& layer, Shape const& in, std::size_t samples,
                               GradientCheckOptions const& o = {}) {
  static_assert(is_layer_v<L>, "telar::check_gradients: L must satisfy the Layer concept");
  static_assert(std::is_same_v<typename L::value_type, double>,
                "telar::check_gradients: check a layer instantiated with value_type double "
                "(float round-off swamps finite differences)");
  using M = Matrix<double, typename L::memory_space>;
  using Exec = typename L::memory_space::execution_space;
  Shape const out = layer.output_shape(in);
  if constexpr (layer_traits<L>::has_build)
    layer.build(in);
  if constexpr (layer_traits<L>::has_initialize)
    if (o.initialize)
      layer.initialize(o.seed);
  M x("telar::check_gradients::x", samples, in.size());
  M R("telar::check_gradients::R", samples, out.size());
  M y("telar::check_gradients::y", samples, out.size());
  M dx("telar::check_gradients::dx", samples, in.size());
  detail::fd_fill(x, o.seed + 11, o.input_scale);
  detail::fd_fill(R, o.seed + 12, 1.0);

  typename layer_traits<L>::saved_type saved;
  layer.forward(Exec{}, x, y, saved);
  if constexpr (layer_traits<L>::has_parameters)
    layer.parameters([](char const*, auto&, auto& g) { Kokkos::deep_copy(g, 0.0); });
  detail::run_backward(layer, Exec{}, R, dx, saved);
  Exec{}.fence();

  auto f = [&] { return detail::fd_probe(layer, x, R); };
  GradientReport report;
  report.tensors.push_back(detail::fd_compare("input", x, dx, f, o));
  if constexpr (layer_traits<L>::has_parameters) {
    // Copies of the gradients: perturbing a value must not touch them.
    std::vector<std::string> names;
    std::vector<Kokkos::View<double*, Kokkos::HostSpace>> grads;
    layer.parameters([&](char const* name, auto&, auto& g) {
      names.emplace_back(name);
      auto hg = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, g);
      Kokkos::View<double*, Kokkos::HostSpace> flat("telar::check_gradients::grad", hg.size());
      for (std::size_t i = 0; i < hg.size(); ++i)
        flat(i) = hg.data()[i];
      grads.push_back(flat);
    });
    std::size_t k = 0;
    layer.parameters([&](char const*, auto& v, auto&) {
      report.tensors.push_back(detail::fd_compare(names[k], v, grads[k], f, o));
      ++k;
    });
  }
  return report;
}

} // namespace telar
