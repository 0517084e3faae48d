#pragma once
// The environment a bf16 run reads, whichever library multiplies (oneDNN on
// the host, cuBLAS on CUDA devices): the test hook that hides the bf16
// instructions and the opt-in fp32 fallback; and the record of the kernels
// that ran bf16 (telar::bf16_kernels()).
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

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

// The implementations that ran bf16 products in this process (e.g.
// "matmul:brg:avx512_core_bf16", "cublas:gemm-ex:sm_90"), for benchmark
// summaries.
inline std::set<std::string>& bf16_impls() {
  static std::set<std::string> s;
  return s;
}
inline std::mutex& bf16_impls_mutex() {
  static std::mutex m;
  return m;
}
inline void note_bf16_impl(std::string const& what) {
  std::lock_guard<std::mutex> lock(bf16_impls_mutex());
  bf16_impls().insert(what);
}

} // namespace telar::detail
