#pragma once
// The environment a bf16 run reads, whichever library multiplies (oneDNN on
// the host, cuBLAS on CUDA devices): the test hook that hides the bf16
// instructions and the opt-in fp32 fallback.
#include <cstdlib>
#include <cstring>

namespace telar::detail {

// Test hook: TELAR_TEST_HIDE_BF16=1 makes Telar behave as if the CPU (or
// GPU) had no bf16 instructions, so the error path runs where they exist.
inline bool bf16_isa_hidden() {
  char const* v = std::getenv("TELAR_TEST_HIDE_BF16");
  return v && *v && std::strcmp(v, "0") != 0;
}

// Opt-in fallback: TELAR_BF16_FALLBACK=fp32 runs the fp32 primitives where
// the bf16 instructions are missing (warned once) instead of throwing.
inline bool bf16_fallback_allowed() {
  char const* v = std::getenv("TELAR_BF16_FALLBACK");
  return v && std::strcmp(v, "fp32") == 0;
}

} // namespace telar::detail
