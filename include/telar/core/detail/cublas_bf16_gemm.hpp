#pragma once
// telar::Bf16Gemm on CUDA memory: cuBLAS's strided-batched GemmEx with bf16
// operands (CUDA_R_16BF), fp32 accumulation (CUBLAS_COMPUTE_32F) and fp32
// C, the device counterpart of oneDNN's bf16 matmul on the host
// (onednn_bf16_gemm.hpp). Telar's matrices are fp32: a Kokkos kernel rounds
// each operand to bf16 (nearest even, as oneDNN's reorder and Bf16Word do)
// into scratch words kept per thread, whatever the operand's layout (rows
// of a matrix, a strided batch of attention heads), then cuBLAS multiplies.
// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so cuBLAS
// gets B first and n, m swapped.
//
// A GPU's "instruction set" is its compute capability: bf16 tensor cores
// from 8.0 (Ampere). Below it cuBLAS would emulate bf16, slower than fp32,
// so Telar refuses as it refuses a CPU without AVX512-BF16
// (TELAR_BF16_FALLBACK=fp32 runs fp32 instead, warned once).
//
// Compiled only where Kokkos has CUDA and Telar found cuBLAS
// (TELAR_HAVE_CUBLAS).
#include <telar/config.hpp>

#include <Kokkos_Core.hpp>

#if TELAR_HAVE_CUBLAS && defined(KOKKOS_ENABLE_CUDA)
#define TELAR_GEMM_CUBLAS_BF16 1
#include <telar/comm/detail/bf16_word.hpp>
#include <telar/core/detail/bf16_env.hpp>
#include <telar/core/error.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>

namespace telar::detail {

// The current device's compute capability, asked once per thread and
// device (a product asks on every call).
struct CudaCapability {
  int device = -1, major = 0, minor = 0;
  bool bf16() const { return major >= 8 && !bf16_isa_hidden(); }
};
inline CudaCapability const& cuda_capability() {
  thread_local CudaCapability c;
  int device = 0;
  cudaGetDevice(&device);
  if (device != c.device) {
    cudaDeviceGetAttribute(&c.major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&c.minor, cudaDevAttrComputeCapabilityMinor, device);
    c.device = device;
  }
  return c;
}

// true: this GPU multiplies bf16 natively (recorded for
// telar::bf16_kernels() the first time on each thread and device); false:
// run fp32 (fallback asked for, warned once). Throws naming `who` and the
// device otherwise.
inline bool cuda_bf16_check(char const* who) {
  CudaCapability const& c = cuda_capability();
  if (c.bf16()) {
    thread_local int noted = -1;
    if (noted != c.device)
      note_bf16_impl("cublas:gemm-ex:sm_" + std::to_string(c.major) + std::to_string(c.minor));
    noted = c.device;
    return true;
  }
  std::string const found =
      bf16_isa_hidden() ? std::string("hidden by TELAR_TEST_HIDE_BF16")
                        : "device " + std::to_string(c.device) + " has compute capability " +
                              std::to_string(c.major) + "." + std::to_string(c.minor);
  static std::once_flag warned;
  return bf16_fall_back(who,
                        {"no bf16 tensor cores",
                         "this GPU has no bf16 tensor cores (compute capability 8.0 or later; ",
                         "telar::AutoGemm"},
                        found, warned);
}

inline void cublas_check(cublasStatus_t st, char const* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("telar::gemm (telar::Bf16Gemm): ") + what +
                " failed: " + cublasGetStatusString(st));
}

// Every value of a rank-2 [rows, cols] or rank-4 [n1, n2, rows, cols] view
// rounded to bf16, densely in index order, at `out`.
template <class Exec, class V>
void cuda_round_to_bf16(Exec const& exec, V const& v, std::uint16_t* out) {
  if constexpr (V::rank == 2) {
    std::int64_t const cols = std::int64_t(v.extent(1));
    Kokkos::parallel_for(
        "telar::gemm::cublas-bf16::round",
        Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {v.extent(0), v.extent(1)}),
        KOKKOS_LAMBDA(std::int64_t i, std::int64_t j) {
          out[i * cols + j] = Bf16Word::from_float(v(i, j)).bits;
        });
  } else {
    std::int64_t const n2 = std::int64_t(v.extent(1)), r = std::int64_t(v.extent(2)),
                       c = std::int64_t(v.extent(3));
    Kokkos::parallel_for(
        "telar::gemm::cublas-bf16::round",
        Kokkos::MDRangePolicy<Exec, Kokkos::Rank<4>>(
            exec, {0, 0, 0, 0}, {v.extent(0), v.extent(1), v.extent(2), v.extent(3)}),
        KOKKOS_LAMBDA(std::int64_t b1, std::int64_t b2, std::int64_t i, std::int64_t j) {
          out[((b1 * n2 + b2) * r + i) * c + j] = Bf16Word::from_float(v(b1, b2, i, j)).bits;
        });
  }
}

// A cuBLAS handle and scratch words per thread (the thread that calls
// telar::gemm). Released at thread exit; errors then are ignored (the CUDA
// context may be gone).
class CublasBf16 {
public:
  static CublasBf16& instance() {
    thread_local CublasBf16 c;
    return c;
  }
  ~CublasBf16() {
    if (handle_)
      cublasDestroy(handle_);
    if (words_)
      cudaFree(words_);
  }

  // Room for n words, usable in order on `stream` (work queued on another
  // stream that may still read the room is waited for first).
  std::uint16_t* room(std::size_t n, cudaStream_t stream) {
    if (stream != stream_ && stream_used_)
      cudaStreamSynchronize(stream_);
    stream_ = stream;
    stream_used_ = true;
    if (n > size_) {
      cudaStreamSynchronize(stream);
      if (words_)
        cudaFree(words_);
      words_ = nullptr;
      if (cudaMalloc(reinterpret_cast<void**>(&words_), n * sizeof(std::uint16_t)) != cudaSuccess)
        throw Error("telar::gemm (telar::Bf16Gemm): cannot allocate " +
                    std::to_string(n * sizeof(std::uint16_t)) + " bytes for bf16 operands");
      size_ = n;
    }
    return words_;
  }
  cublasHandle_t handle(cudaStream_t stream) {
    if (!handle_)
      cublas_check(cublasCreate(&handle_), "cublasCreate");
    cublas_check(cublasSetStream(handle_, stream), "cublasSetStream");
    return handle_;
  }

private:
  CublasBf16() = default;
  cublasHandle_t handle_ = nullptr;
  std::uint16_t* words_ = nullptr;
  std::size_t size_ = 0;
  cudaStream_t stream_ = nullptr;
  bool stream_used_ = false;
};

// C(b1, b2) = alpha op(A(b1, b2)) op(B(b1, b2)) + beta C(b1, b2) in bf16
// with fp32 accumulation, for rank-2 views (one product) or rank-4 batches
// whose matrices have contiguous columns; the caller checked the shapes
// and that this GPU has bf16 (cuda_bf16_check). One strided-batched call
// per b1: C's entries along b2 are equally spaced, along b1 not always.
template <class AV, class BV, class CV>
void cublas_bf16_gemm(Kokkos::Cuda const& exec, char ta, char tb, float alpha, AV const& A,
                      BV const& B, float beta, CV const& C) {
  constexpr bool batch = CV::rank == 4;
  auto const ext = [](auto const& v, int d) { return std::int64_t(v.extent(batch ? d + 2 : d)); };
  std::int64_t const n1 = batch ? std::int64_t(C.extent(0)) : 1;
  std::int64_t const n2 = batch ? std::int64_t(C.extent(1)) : 1;
  std::int64_t const m = ext(C, 0), n = ext(C, 1), k = ta == 'N' ? ext(A, 1) : ext(A, 0);
  std::int64_t const a_size = ext(A, 0) * ext(A, 1), b_size = ext(B, 0) * ext(B, 1);
  std::int64_t const ldc = batch ? std::int64_t(C.stride(2)) : std::int64_t(C.stride(0));
  std::int64_t const c_b2 = batch ? std::int64_t(C.stride(1)) : 0;
  std::int64_t const c_b1 = batch ? std::int64_t(C.stride(0)) : 0;
  auto& ctx = CublasBf16::instance();
  cudaStream_t const stream = exec.cuda_stream();
  std::uint16_t* const wa = ctx.room(std::size_t((a_size + b_size) * n1 * n2), stream);
  std::uint16_t* const wb = wa + a_size * n1 * n2;
  cuda_round_to_bf16(exec, A, wa);
  cuda_round_to_bf16(exec, B, wb);
  cublasHandle_t const h = ctx.handle(stream);
  auto const op = [](char t) { return t == 'N' ? CUBLAS_OP_N : CUBLAS_OP_T; };
  for (std::int64_t b1 = 0; b1 < n1; ++b1)
    cublas_check(cublasGemmStridedBatchedEx(
                     h, op(tb), op(ta), int(n), int(m), int(k), &alpha, wb + b1 * n2 * b_size,
                     CUDA_R_16BF, int(ext(B, 1)), b_size, wa + b1 * n2 * a_size, CUDA_R_16BF,
                     int(ext(A, 1)), a_size, &beta, C.data() + b1 * c_b1, CUDA_R_32F, int(ldc),
                     c_b2, int(n2), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx");
}

} // namespace telar::detail

#else
#define TELAR_GEMM_CUBLAS_BF16 0
#endif
