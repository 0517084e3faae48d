#pragma once
// The worked example of docs/writing_a_loss.md, kept identical to it: a
// Huber loss with a configurable threshold (test_serial.cpp runs it).
#include <telar/core/error.hpp>
#include <telar/core/loss.hpp>

#include <Kokkos_Core.hpp>

#include <string>

template <class T = float, class MemorySpace = telar::DefaultMemorySpace>
struct HuberLoss {
  using value_type = T;
  using memory_space = MemorySpace;
  using target_type = telar::Matrix<T, MemorySpace>; // real targets [n, k]
  static constexpr char const* name() { return "HuberLoss"; }

  T delta = T(1); // quadratic below |y - t| = delta, linear above

  // Loss terms of a batch: every element (the gradient is that of their mean).
  template <class Exec>
  long long count(Exec const&, target_type const& t) const {
    return static_cast<long long>(t.extent(0) * t.extent(1));
  }

  // The summed loss of a batch, and dy = scale * d(summed loss)/dy.
  template <class Exec>
  telar::LossSum forward_backward(Exec const& exec, telar::ConstMatrix<T, MemorySpace> y,
                                  target_type const& t, telar::Matrix<T, MemorySpace> dy,
                                  T scale) const {
    std::size_t const n = y.extent(0), k = y.extent(1);
    if (t.extent(0) != n || t.extent(1) != k)
      throw telar::ShapeError("HuberLoss: outputs [" + std::to_string(n) + ", " +
                              std::to_string(k) + "] but targets [" + std::to_string(t.extent(0)) +
                              ", " + std::to_string(t.extent(1)) + "]");
    T const d = delta;
    double sum = 0;
    Kokkos::parallel_reduce(
        "HuberLoss", Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {n, k}),
        KOKKOS_LAMBDA(std::size_t i, std::size_t j, double& acc) {
          T const r = y(i, j) - t(i, j), a = r < 0 ? -r : r;
          acc += a <= d ? 0.5 * r * r : d * (a - 0.5 * d);
          dy(i, j) = scale * (a <= d ? r : (r < 0 ? -d : d));
        },
        sum);
    telar::LossSum s;
    s.loss = sum;
    s.samples = static_cast<long long>(n);
    s.count = static_cast<long long>(n * k);
    return s;
  }
};
