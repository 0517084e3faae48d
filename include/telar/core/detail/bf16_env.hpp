#pragma once
// The environment a bf16 run reads, whichever library multiplies (oneDNN on
// the host, cuBLAS on CUDA devices): the test hook that hides the bf16
// instructions, the opt-in fp32 fallback and what happens without either;
// and the record of the kernels that ran bf16 (telar::bf16_kernels()).
#include <telar/core/error.hpp>

#include <cstdio>
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

// What a device lacks, in the words of its bf16 check.
struct Bf16Missing {
  char const* warning; // "no bf16 tensor cores"
  char const* lacks;   // the refusal, before what was found: "this GPU has no ... ("
  char const* fp32;    // the fp32 policies the refusal suggests
};

// The bf16 instructions are missing (`found` says what is there): false,
// to run fp32, where TELAR_BF16_FALLBACK=fp32 allows it (warned once per
// `warned`); else throws naming `who`, never emulates (slower than fp32).
inline bool bf16_fall_back(char const* who, Bf16Missing const& m, std::string const& found,
                           std::once_flag& warned) {
  if (bf16_fallback_allowed()) {
    std::call_once(warned, [&] {
      std::fprintf(stderr, "telar: warning: %s: %s (%s); running fp32 (TELAR_BF16_FALLBACK=fp32)\n",
                   who, m.warning, found.c_str());
    });
    return false;
  }
  throw Error(std::string(who) + ": " + m.lacks + found +
              "); bf16 would be emulated, slower than fp32. Use an fp32 policy (" + m.fp32 +
              "), or set TELAR_BF16_FALLBACK=fp32 to run fp32 with a warning");
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
