#pragma once
// Gradients that are zero because a step just zeroed them (telar::Trainer::
// step registers its store's gradients for its forward and backward).
//
// A Dense layer's weight gradient is one product, dW += dy^T x. Its first
// product of a step may then be written with beta = 0 (dW = dy^T x) instead
// of being added to the zeros: the same values (0 + v is v; only a zero's
// sign may differ), and GEMMs that do not read C first are faster. oneDNN
// 2.6's bf16 matmul most of all: a sum into a large C from a short k costs
// about 0.7 ns a value (MLP 784-2048-2048-10 at batch 128: 2048x128 *
// 128x2048 took 2.8 ms without the sum, 3.4-3.5 ms with it through the
// padded gemm-based matmul, 5.0 ms through the brgemm one; see
// OneDnnBf16Matmul::pads_a). Only while registered, only inside the
// registered range, and once per tensor and step: a later micro-batch, or
// a layer used outside a Trainer, adds as before. Per thread: the thread
// that runs a step is the one whose layers compute its gradients.
#include <cstddef>
#include <cstdint>
#include <unordered_set>
#include <utility>

namespace telar::detail {

struct ZeroedGrads {
  std::uintptr_t lo = 0, hi = 0;            // the registered range, in bytes
  std::unordered_set<std::uintptr_t> taken; // tensors whose first product was written

  // Whether the `bytes` at p lie in the registered range and nothing has
  // been written to them since it was registered; true at most once.
  bool take(void const* p, std::size_t bytes) {
    auto const at = reinterpret_cast<std::uintptr_t>(p);
    if (lo == hi || at < lo || at + bytes > hi)
      return false;
    return taken.insert(at).second;
  }
};
inline ZeroedGrads& zeroed_grads() {
  thread_local ZeroedGrads z;
  return z;
}

// Registers [grads, grads + n), all zero, while in scope.
class ZeroedGradsScope {
public:
  template <class T>
  ZeroedGradsScope(T const* grads, std::size_t n) : saved_(zeroed_grads()) {
    ZeroedGrads& z = zeroed_grads();
    z.lo = reinterpret_cast<std::uintptr_t>(grads);
    z.hi = z.lo + n * sizeof(T);
    z.taken.clear();
  }
  ~ZeroedGradsScope() { zeroed_grads() = std::move(saved_); }
  ZeroedGradsScope(ZeroedGradsScope const&) = delete;
  ZeroedGradsScope& operator=(ZeroedGradsScope const&) = delete;

private:
  ZeroedGrads saved_;
};

} // namespace telar::detail
