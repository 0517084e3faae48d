#pragma once
// Where a bf16 matmul keeps its B operand rounded for the rest of a step
// (Bf16Gemm; registered by parallel/detail/bf16_weights.hpp). No oneDNN here: the Trainer holds a
// scope whether or not Telar has oneDNN.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>

namespace telar::detail {

// Room for the bf16 rounding of a range of fp32 values that do not change
// while it is registered: a Trainer's parameters during a step. A matmul
// whose B operand lies inside it rounds that operand into the room the
// first time it meets it (`ready` remembers which parts are made) and reads
// the words from then on: each weight is converted once per step, not once
// per forward and once per backward of every micro-batch, and parameters no
// matmul reads (convolution weights, biases) are never converted. Per
// thread: the thread that calls telar::gemm is the one whose step
// registered it.
struct Bf16Copy {
  float const* lo = nullptr;
  float const* hi = nullptr;
  std::uint16_t* words = nullptr;
  std::map<std::ptrdiff_t, std::int64_t> ready; // offset -> values made this step
  std::uint64_t hits = 0;                       // B operands read from here (tests)
  std::uint64_t conversions = 0;                // operands rounded into the room (tests)

  // The room of [p, p + count), or null when that is not inside the range
  // (addresses compared as integers: p is usually another allocation's).
  std::uint16_t* find(float const* p, std::int64_t count) const {
    auto const at = [](float const* q) { return reinterpret_cast<std::uintptr_t>(q); };
    if (!words || at(p) < at(lo) || at(p) + std::uintptr_t(count) * sizeof(float) > at(hi))
      return nullptr;
    return words + (p - lo);
  }
  // Whether [p, p + count) was made this step (inside one part made).
  bool made(float const* p, std::int64_t count) const {
    std::ptrdiff_t const o = p - lo;
    auto it = ready.upper_bound(o);
    if (it == ready.begin())
      return false;
    --it;
    return o + count <= it->first + it->second;
  }
  void mark(float const* p, std::int64_t count) {
    std::int64_t& n = ready[p - lo];
    n = std::max(n, count);
    ++conversions;
  }
  // Registers [values, values + n) with its rounding already made in
  // `words` (ZeRO-3's gathered words: residency_gathered.hpp).
  void share(float const* values, std::size_t n, std::uint16_t* made) {
    lo = values;
    hi = values + n;
    words = made;
    ready.clear();
    ready[0] = std::int64_t(n);
  }
  // Forgets the range starting at `values`, if it is the one registered.
  void forget(float const* values) {
    if (!lo || lo != values)
      return;
    lo = hi = nullptr;
    words = nullptr;
    ready.clear();
  }
};
inline Bf16Copy& bf16_copy() {
  thread_local Bf16Copy c;
  return c;
}

// Registers [values, values + n) and room for its words while in scope
// (nothing made yet).
class Bf16CopyScope {
public:
  // `words` null: registers nothing (the scope of a run without a copy).
  Bf16CopyScope(float const* values, std::size_t n, std::uint16_t* words) : saved_(bf16_copy()) {
    if (!words)
      return;
    Bf16Copy& c = bf16_copy();
    c.lo = values;
    c.hi = values + n;
    c.words = words;
    c.ready.clear();
  }
  ~Bf16CopyScope() { // the counters go on: tests read them after a step
    Bf16Copy& c = bf16_copy();
    std::uint64_t const hits = c.hits, conversions = c.conversions;
    c = saved_;
    c.hits = hits;
    c.conversions = conversions;
  }
  Bf16CopyScope(Bf16CopyScope const&) = delete;
  Bf16CopyScope& operator=(Bf16CopyScope const&) = delete;

private:
  Bf16Copy saved_;
};

} // namespace telar::detail
