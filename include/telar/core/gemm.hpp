#pragma once
/*! \file
 *  \brief Matrix product policies: C = alpha op(A) op(B) + beta C on
 *  row-major matrices.
 *
 *  Which library multiplies matrices is a policy, chosen by measurement
 *  (docs/design.md has the figures): on x86 hosts oneDNN's sgemm is about
 *  twice as fast as OpenBLAS (which Kokkos Kernels calls through its BLAS
 *  TPL) at MLP shapes; on GPUs Kokkos Kernels reaches cuBLAS/rocBLAS.
 */
#include <telar/config.hpp>
#include <telar/core/detail/bf16_env.hpp>
#include <telar/core/detail/host_simd.hpp>
#include <telar/core/detail/type_traits.hpp>
#include <telar/core/error.hpp>
#include <telar/core/tensor.hpp>
#include <telar/profile/detail/launches.hpp>
#include <telar/profile/detail/region.hpp>

#if TELAR_HAVE_ONEDNN
#include <telar/core/detail/onednn_bf16_gemm.hpp>

#include <dnnl.h>
#endif
#if TELAR_HAVE_KOKKOSKERNELS
#include <KokkosBlas3_gemm.hpp>
#endif
// Only builds with a device compile Kokkos Kernels' batched GEMM (host-only
// builds never take that path; its headers cost every file that multiplies).
/// \cond TELAR_INTERNAL
#if TELAR_HAVE_KOKKOSKERNELS &&                                                                    \
    (defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP) || defined(KOKKOS_ENABLE_SYCL))
#define TELAR_GEMM_DEVICE_BATCHED 1
#else
#define TELAR_GEMM_DEVICE_BATCHED 0
#endif
/// \endcond
#if TELAR_GEMM_DEVICE_BATCHED
#include <telar/core/detail/team_gemm_batched.hpp>
#endif
#include <telar/core/detail/cublas_bf16_gemm.hpp> // defines TELAR_GEMM_CUBLAS_BF16

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>

namespace telar {

/*! \brief GEMM through oneDNN's dnnl_sgemm (host memory, float only). */
struct OneDnnGemm {
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "onednn"; }
  /*! \brief Whether this policy multiplies T in MemorySpace.
   *  \tparam T value type \tparam MemorySpace memory space */
  template <class T, class MemorySpace>
  static constexpr bool supports() {
    return TELAR_HAVE_ONEDNN && std::is_same_v<T, float> &&
           Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible;
  }
};

/*! \brief Mixed-precision GEMM: A and B are rounded to bf16, products
 *  accumulate in fp32, C stays fp32 (float matrices only). On the host
 *  through oneDNN's matmul; in CUDA memory through cuBLAS (GemmEx with bf16
 *  operands and fp32 compute), where Telar was built with CUDA and found
 *  cuBLAS.
 *
 *  For the compute of a layer, not its state: telar::Dense<float,
 *  telar::HostSpace, telar::Bf16Gemm> keeps fp32 weights, gradients and
 *  optimizer state and only multiplies in bf16. Each operand is converted on
 *  every call (the weights change every step). The instruction set is checked
 *  at run time: without AVX512-BF16 or AMX, telar::gemm throws telar::Error
 *  naming it (emulated bf16 is slower than fp32), unless the environment
 *  variable TELAR_BF16_FALLBACK=fp32 asks for fp32 with a warning.
 *  \code
 *  telar::Dense<float, Kokkos::HostSpace, telar::Bf16Gemm> fc(784, 2048);
 *  \endcode
 */
struct Bf16Gemm {
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "onednn-bf16"; }
  /*! \brief Whether this policy multiplies T in MemorySpace: float on host
   *  memory, when Telar was built with oneDNN; float in CUDA memory, when
   *  it was built with cuBLAS.
   *  \tparam T value type \tparam MemorySpace memory space */
  template <class T, class MemorySpace>
  static constexpr bool supports() {
    return OneDnnGemm::supports<T, MemorySpace>() || on_device<T, MemorySpace>();
  }
  /*! \brief Whether cuBLAS multiplies T in MemorySpace (float in memory only
   *  CUDA reaches). \tparam T value type \tparam MemorySpace memory space */
  template <class T, class MemorySpace>
  static constexpr bool on_device() {
#if TELAR_GEMM_CUBLAS_BF16
    return std::is_same_v<T, float> &&
           std::is_same_v<typename MemorySpace::execution_space, Kokkos::Cuda> &&
           !Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible;
#else
    return false;
#endif
  }
};

namespace detail {
// Whether a layer of T in MemorySpace under GEMM policy G multiplies with
// oneDNN's bf16 matmul (host memory): its compact copies and bf16 word
// operands are that library's, not cuBLAS's.
template <class G, class T, class MemorySpace>
inline constexpr bool onednn_bf16_v = (std::is_same_v<G, Bf16Gemm> &&
                                       OneDnnGemm::supports<T, MemorySpace>());
} // namespace detail

/*! \brief Whether layers of T in MemorySpace compute in bf16 under
 *  telar::Precision<telar::bf16, float>: float layers in host memory, where
 *  Telar has oneDNN (its bf16 matmuls and convolutions, compact copies of
 *  saved inputs, the weights rounded once a step), and float layers in CUDA
 *  memory, where it has cuBLAS (every GEMM through cuBLAS's bf16 GEMM,
 *  convolutions as im2col and that GEMM; inputs saved in fp32).
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T, class MemorySpace>
constexpr bool bf16_layers_supported() {
  return Bf16Gemm::supports<T, MemorySpace>();
}

/*! \brief Whether Bf16Gemm and the bf16 layers run bf16 on data in
 *  \p MemorySpace: on the host, oneDNN reports AVX512-BF16 or AMX (false
 *  without oneDNN); in CUDA memory, the current GPU has bf16 tensor cores
 *  (compute capability 8.0 or later). \tparam MemorySpace where the layers'
 *  data lie (host memory by default) */
template <class MemorySpace = Kokkos::HostSpace>
bool bf16_available() {
#if TELAR_GEMM_CUBLAS_BF16
  if constexpr (Bf16Gemm::on_device<float, MemorySpace>())
    return detail::cuda_capability().bf16();
  else
#endif
#if TELAR_HAVE_ONEDNN
    return detail::bf16_isa_available();
#else
  return false;
#endif
}

/*! \brief The check a bf16 run's first GEMM makes, for a program to make
 *  before it starts (e.g. before a search of many runs): true when Bf16Gemm
 *  and the bf16 layers will run bf16 on data in \p MemorySpace; false when
 *  they will run fp32 because TELAR_BF16_FALLBACK=fp32 allows it (warned
 *  once). \tparam MemorySpace where the layers' data lie (host memory by
 *  default) \param who what asks, first in the message
 *  \throws Error naming \p who and the CPU's instruction set (or the GPU's
 *  compute capability) when neither (docs/errors.md), or when Telar has
 *  neither oneDNN (host memory) nor cuBLAS (CUDA memory) */
template <class MemorySpace = Kokkos::HostSpace>
bool require_bf16(char const* who) {
#if TELAR_GEMM_CUBLAS_BF16
  if constexpr (Bf16Gemm::on_device<float, MemorySpace>())
    return detail::cuda_bf16_check(who);
  else
#endif
#if TELAR_HAVE_ONEDNN
    return detail::bf16_check_isa(who);
#else
  throw Error(std::string(who) + ": bf16 compute on the host is oneDNN's, and Telar was built "
                                 "without it");
#endif
}

/*! \brief The implementations that ran bf16 products in this process,
 *  comma-separated: oneDNN's matmuls and convolutions (e.g.
 *  "matmul:brg:avx512_core_bf16"), cuBLAS's GEMM (e.g.
 *  "cublas:gemm-ex:sm_90"); empty if none ran. For benchmark summaries. */
inline std::string bf16_kernels() {
  std::string out;
  std::lock_guard<std::mutex> lock(detail::bf16_impls_mutex());
  for (auto const& s : detail::bf16_impls())
    out += (out.empty() ? "" : ",") + s;
  return out;
}

/*! \brief Which copy of Telar's own host loops runs (activations,
 *  normalisation rows, softmax, sums): "avx512" where the CPU has it and
 *  GCC compiled the second copy, else "baseline" (the build's target; also
 *  under TELAR_HOST_SIMD=baseline). For benchmark summaries. */
inline char const* host_loops() {
  return detail::host_simd_name();
}

/*! \brief GEMM through KokkosBlas::gemm (BLAS, cuBLAS or rocBLAS underneath). */
struct KokkosKernelsGemm {
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "kokkos-kernels"; }
  /*! \brief Whether this policy multiplies T in MemorySpace.
   *  \tparam T value type \tparam MemorySpace memory space */
  template <class T, class MemorySpace>
  static constexpr bool supports() {
    return TELAR_HAVE_KOKKOSKERNELS != 0;
  }
};

/*! \brief Portable GEMM written with Kokkos::parallel_for; slow, but runs
 *  anywhere Kokkos does and serves as the reference in tests. */
struct ReferenceGemm {
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "reference"; }
  /*! \brief Whether this policy multiplies T in MemorySpace (always).
   *  \tparam T value type \tparam MemorySpace memory space */
  template <class T, class MemorySpace>
  static constexpr bool supports() {
    return true;
  }
};

/*! \brief Picks, per value type and memory space, the fastest available
 *  policy: oneDNN, then Kokkos Kernels, then the reference kernel. */
struct AutoGemm {
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "auto"; }
  /*! \brief Always usable. \tparam T value type \tparam MemorySpace memory space */
  template <class T, class MemorySpace>
  static constexpr bool supports() {
    return true;
  }
  /*! \brief The concrete policy used for T in MemorySpace.
   *  \tparam T value type \tparam MemorySpace memory space */
  template <class T, class MemorySpace>
  using select =
      std::conditional_t<OneDnnGemm::supports<T, MemorySpace>(), OneDnnGemm,
                         std::conditional_t<KokkosKernelsGemm::supports<T, MemorySpace>(),
                                            KokkosKernelsGemm, ReferenceGemm>>;
};

/*! \brief True for the GEMM policy types above. \tparam P a type */
template <class P>
inline constexpr bool is_gemm_policy_v =
    std::is_same_v<P, OneDnnGemm> || std::is_same_v<P, KokkosKernelsGemm> ||
    std::is_same_v<P, ReferenceGemm> || std::is_same_v<P, AutoGemm> || std::is_same_v<P, Bf16Gemm>;

/*! \brief Name of the policy AutoGemm resolves to for T in MemorySpace. */
template <class T, class MemorySpace>
constexpr char const* gemm_backend_name() {
  return AutoGemm::select<T, MemorySpace>::name();
}

namespace detail {

inline std::size_t op_rows(char t, std::size_t r, std::size_t c) {
  return t == 'N' ? r : c;
}
inline std::size_t op_cols(char t, std::size_t r, std::size_t c) {
  return t == 'N' ? c : r;
}

template <class Exec, class AV, class BV, class CV, class T>
void reference_gemm(Exec const& exec, char ta, char tb, T alpha, AV A, BV B, T beta, CV C) {
  std::size_t const K = op_cols(ta, A.extent(0), A.extent(1));
  bool const tA = ta != 'N', tB = tb != 'N';
  Kokkos::parallel_for(
      "telar::gemm::reference",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {C.extent(0), C.extent(1)}),
      KOKKOS_LAMBDA(std::size_t i, std::size_t j) {
        T acc = 0;
        for (std::size_t k = 0; k < K; ++k)
          acc += (tA ? A(k, i) : A(i, k)) * (tB ? B(j, k) : B(k, j));
        C(i, j) = (beta == T(0) ? T(0) : beta * C(i, j)) + alpha * acc;
      });
}

// op(A) op(B)'s inner extent, after checking that it fits C.
template <class AV, class BV, class CV>
std::size_t gemm_inner_extent(char ta, char tb, AV const& A, BV const& B, CV const& C) {
  std::size_t const m = C.extent(0), n = C.extent(1);
  std::size_t const k = op_cols(ta, A.extent(0), A.extent(1));
  if (op_rows(ta, A.extent(0), A.extent(1)) != m || op_rows(tb, B.extent(0), B.extent(1)) != k ||
      op_cols(tb, B.extent(0), B.extent(1)) != n)
    throw ShapeError(
        "telar::gemm: op(A) is " + std::to_string(op_rows(ta, A.extent(0), A.extent(1))) + "x" +
        std::to_string(k) + ", op(B) is " + std::to_string(op_rows(tb, B.extent(0), B.extent(1))) +
        "x" + std::to_string(op_cols(tb, B.extent(0), B.extent(1))) + ", C is " +
        std::to_string(m) + "x" + std::to_string(n));
  return k;
}

// Leading dimension of a row-major matrix whose rows are contiguous.
template <class V>
std::int64_t row_ld(V const& v) {
  return std::int64_t(
      std::max<std::size_t>({std::size_t(v.stride(0)), v.extent(1), std::size_t{1}}));
}

// A Bf16Gemm product (or batch) in CUDA memory: cuBLAS in bf16 where the
// GPU has bf16, else (TELAR_BF16_FALLBACK=fp32) AutoGemm's fp32 policy.
template <class Exec, class AV, class BV, class CV>
void cuda_bf16_gemm(Exec const& exec, char ta, char tb, float alpha, AV const& A, BV const& B,
                    float beta, CV const& C) {
#if TELAR_GEMM_CUBLAS_BF16
  static_assert(std::is_same_v<Exec, Kokkos::Cuda>,
                "telar::gemm: telar::Bf16Gemm multiplies CUDA memory on a Kokkos::Cuda instance");
  if (cuda_bf16_check("telar::gemm (telar::Bf16Gemm)")) {
    count_library_call("telar::gemm::cublas-bf16");
    ScopedRegion const region("telar::gemm::cublas-bf16");
    return cublas_bf16_gemm(exec, ta, tb, alpha, A, B, beta, C);
  }
  using M = typename CV::memory_space;
  if constexpr (CV::rank == 4)
    gemm_batched(AutoGemm{}, exec, ta, tb, alpha, A, B, beta, C);
  else
    gemm(typename AutoGemm::template select<float, M>{}, exec, ta, tb, alpha, A, B, beta, C);
#else
  (void)exec, (void)ta, (void)tb, (void)alpha, (void)A, (void)B, (void)beta, (void)C;
#endif
}

#if TELAR_HAVE_ONEDNN
// One Bf16Gemm product where bf16 runs (the caller checked); `a_words` /
// `b_words` as OneDnnBf16Matmul::run takes them. Empty products as gemm
// treats them: nothing, or C = beta C without reading an operand.
template <class Exec, class AV, class BV, class CV>
void bf16_matmul(Exec const& exec, char ta, char tb, float alpha, AV const& A,
                 std::uint16_t const* a_words, BV const& B, std::uint16_t const* b_words,
                 float beta, CV const& C) {
  if (C.extent(0) == 0 || C.extent(1) == 0)
    return;
  if (op_cols(ta, A.extent(0), A.extent(1)) == 0)
    return reference_gemm(exec, ta, tb, alpha, A, B, beta, C);
  exec.fence(); // oneDNN runs on the calling thread: earlier kernels must be done
  count_library_call("telar::gemm::onednn-bf16");
  ScopedRegion const region("telar::gemm::onednn-bf16");
  onednn_bf16_matmul().run({ta, tb, std::int64_t(C.extent(0)), std::int64_t(C.extent(1)),
                            std::int64_t(op_cols(ta, A.extent(0), A.extent(1))), row_ld(A),
                            row_ld(B), row_ld(C)},
                           alpha, A.data(), B.data(), beta, C.data(), a_words, b_words);
}
#endif

} // namespace detail

/*! \brief C = alpha op(A) op(B) + beta C for row-major matrices.
 *
 *  op(X) is X for 'N' and X^T for 'T'. Rows must be contiguous (LayoutRight or
 *  a row range of one). A shape mismatch throws ShapeError.
 *  \tparam Policy a GEMM policy (OneDnnGemm, KokkosKernelsGemm, ReferenceGemm, AutoGemm,
 *  Bf16Gemm)
 *  \param exec execution space instance that runs the product
 *  \param ta 'N' or 'T' for A \param tb 'N' or 'T' for B
 *  \param alpha scale of the product \param A left matrix \param B right matrix
 *  \param beta scale of the old C \param C result
 */
template <class Policy, class Exec, class AV, class BV, class CV>
void gemm(Policy, Exec const& exec, char ta, char tb, typename CV::value_type alpha, AV const& A,
          BV const& B, typename CV::value_type beta, CV const& C) {
  static_assert(is_gemm_policy_v<Policy>, "telar::gemm: Policy must be a Telar GEMM policy");
  using T = typename CV::non_const_value_type;
  using M = typename CV::memory_space;
  static_assert(Kokkos::SpaceAccessibility<Exec, M>::accessible,
                "telar::gemm: the execution space cannot access the matrices' memory space");
  if constexpr (std::is_same_v<Policy, AutoGemm>) {
    gemm(typename AutoGemm::template select<T, M>{}, exec, ta, tb, alpha, A, B, beta, C);
  } else {
    static_assert(!std::is_same_v<Policy, Bf16Gemm> || Policy::template supports<T, M>(),
                  "telar::gemm: telar::Bf16Gemm multiplies float matrices in host memory "
                  "(oneDNN's bf16 matmul) or, in a build with cuBLAS, in CUDA memory; use "
                  "telar::AutoGemm elsewhere");
    static_assert(Policy::template supports<T, M>(),
                  "telar::gemm: this policy does not support the value type or memory space "
                  "(use telar::AutoGemm)");
    std::size_t const m = C.extent(0), n = C.extent(1);
    std::size_t const k = detail::gemm_inner_extent(ta, tb, A, B, C);
    if (m == 0 || n == 0)
      return;
    // K = 0 means C = beta C; libraries disagree on the leading dimensions of
    // empty operands, so it never reaches them.
    if (k == 0 || std::is_same_v<Policy, ReferenceGemm>) {
      detail::reference_gemm(exec, ta, tb, alpha, A, B, beta, C);
    } else if constexpr (std::is_same_v<Policy, OneDnnGemm>) {
#if TELAR_HAVE_ONEDNN
      exec.fence(); // dnnl runs on the calling thread: earlier kernels must be done
      auto const ld = [](auto const& v) { return dnnl_dim_t(detail::row_ld(v)); };
      detail::count_library_call("telar::gemm::onednn");
      detail::ScopedRegion const region("telar::gemm::onednn"); // for Kokkos Tools
      dnnl_status_t st = dnnl_sgemm(ta, tb, dnnl_dim_t(m), dnnl_dim_t(n), dnnl_dim_t(k), alpha,
                                    A.data(), ld(A), B.data(), ld(B), beta, C.data(), ld(C));
      if (st != dnnl_success)
        throw Error("telar::gemm: dnnl_sgemm failed with status " + std::to_string(int(st)));
#endif
    } else if constexpr (std::is_same_v<Policy, Bf16Gemm> && Bf16Gemm::on_device<T, M>()) {
      detail::cuda_bf16_gemm(exec, ta, tb, alpha, A, B, beta, C);
    } else if constexpr (std::is_same_v<Policy, Bf16Gemm>) {
#if TELAR_HAVE_ONEDNN
      if (detail::bf16_check_isa("telar::gemm (telar::Bf16Gemm)")) {
        detail::bf16_matmul(exec, ta, tb, alpha, A, nullptr, B, nullptr, beta, C);
      } else {
        gemm(OneDnnGemm{}, exec, ta, tb, alpha, A, B, beta, C);
      }
#endif
    } else if constexpr (std::is_same_v<Policy, KokkosKernelsGemm>) {
#if TELAR_HAVE_KOKKOSKERNELS
      char tas[2] = {ta, 0}, tbs[2] = {tb, 0};
      // The execution-space overload is not in every supported Kokkos Kernels
      // release; order with a fence instead.
      exec.fence();
      detail::count_library_call("telar::gemm::kokkos-kernels");
      detail::ScopedRegion const region("telar::gemm::kokkos-kernels");
      KokkosBlas::gemm(tas, tbs, alpha, A, B, beta, C);
#endif
    }
  }
}

/*! \brief A batch of row-major matrices as a rank-4 view [n1, n2, rows, cols]
 *  over existing memory: entry (b1, b2) starts at \p data + b1 \p s1 + b2
 *  \p s2 and its rows are \p ld apart (columns contiguous). E.g. head h of
 *  sample s in Q [n * seq, heads * d]: strided_batch<M>(q, n, seq * heads * d,
 *  heads, d, seq, heads * d, d).
 *  \tparam MemorySpace where \p data lives \tparam T value type */
template <class MemorySpace, class T>
auto strided_batch(T* data, std::size_t n1, std::size_t s1, std::size_t n2, std::size_t s2,
                   std::size_t rows, std::size_t ld, std::size_t cols) {
  using V = Kokkos::View<T****, Kokkos::LayoutStride, MemorySpace,
                         Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  return V(data, Kokkos::LayoutStride(n1, s1, n2, s2, rows, ld, cols, 1));
}

namespace detail {

// All entries of a batched product in one kernel: the portable path, and the
// one every device takes (a vendor strided-batched GEMM is the GPU tuning's).
template <class Exec, class AV, class BV, class CV, class T>
void reference_gemm_batched(Exec const& exec, char ta, char tb, T alpha, AV A, BV B, T beta, CV C) {
  std::size_t const K = op_cols(ta, A.extent(2), A.extent(3));
  bool const tA = ta != 'N', tB = tb != 'N';
  Kokkos::parallel_for(
      "telar::gemm_batched::reference",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<4>>(
          exec, {0, 0, 0, 0}, {C.extent(0), C.extent(1), C.extent(2), C.extent(3)}),
      KOKKOS_LAMBDA(std::size_t b1, std::size_t b2, std::size_t i, std::size_t j) {
        T acc = 0;
        for (std::size_t k = 0; k < K; ++k)
          acc +=
              (tA ? A(b1, b2, k, i) : A(b1, b2, i, k)) * (tB ? B(b1, b2, j, k) : B(b1, b2, k, j));
        C(b1, b2, i, j) = (beta == T(0) ? T(0) : beta * C(b1, b2, i, j)) + alpha * acc;
      });
}

#if TELAR_HAVE_ONEDNN
// gemm_batched under Bf16Gemm on the host: the whole batch as one oneDNN
// matmul (its conversions to bf16 too), where every matrix has contiguous
// rows (strided_batch's views do) and the CPU has bf16. False: not done.
template <class Exec, class AV, class BV, class CV>
bool bf16_gemm_batched(Exec const& exec, char ta, char tb, float alpha, AV const& A, BV const& B,
                       float beta, CV const& C) {
  std::size_t const k = op_cols(ta, A.extent(2), A.extent(3));
  if (k == 0 || A.stride(3) != 1 || B.stride(3) != 1 || C.stride(3) != 1 ||
      !bf16_check_isa("telar::gemm_batched (telar::Bf16Gemm)"))
    return false;
  auto ld = [](auto const& v) {
    return std::int64_t(std::max<std::size_t>({std::size_t(v.stride(2)), v.extent(3), 1}));
  };
  auto const i = [](auto v) { return std::int64_t(v); };
  auto const between = [&](auto const& v) { return std::array{i(v.stride(0)), i(v.stride(1))}; };
  OneDnnBf16Matmul::Geometry const g{
      ta,         tb,         i(C.extent(2)), i(C.extent(3)), i(k),
      ld(A),      ld(B),      ld(C),          i(C.extent(0)), i(C.extent(1)),
      between(A), between(B), between(C)};
  exec.fence(); // oneDNN runs on the calling thread: earlier kernels must be done
  count_library_call("telar::gemm::onednn-bf16");
  ScopedRegion const region("telar::gemm::onednn-bf16");
  onednn_bf16_matmul().run(g, alpha, A.data(), B.data(), beta, C.data());
  return true;
}
#endif

} // namespace detail

/*! \brief C(b1, b2) = alpha op(A(b1, b2)) op(B(b1, b2)) + beta C(b1, b2) for
 *  every entry of rank-4 batches [n1, n2, rows, cols] (see strided_batch).
 *
 *  The launches do not grow with the batch where they cost: on a device the
 *  whole batch is one kernel (KokkosKernelsGemm: one team per entry running
 *  KokkosBatched::TeamGemm; otherwise the reference kernel), and so it is
 *  for ReferenceGemm everywhere, and for Bf16Gemm on the host (one oneDNN
 *  matmul, its bf16 conversions included). On the host the other library
 *  policies (oneDNN fp32, Kokkos Kernels' BLAS) multiply entry by entry,
 *  which costs no launch there and keeps their speed. A shape mismatch
 *  throws ShapeError.
 *  \tparam Policy a GEMM policy \param exec execution space instance
 *  \param ta 'N' or 'T' for A \param tb 'N' or 'T' for B \param alpha scale of
 *  the products \param A left matrices \param B right matrices \param beta
 *  scale of the old C \param C results */
template <class Policy, class Exec, class AV, class BV, class CV>
void gemm_batched(Policy, Exec const& exec, char ta, char tb, typename CV::value_type alpha,
                  AV const& A, BV const& B, typename CV::value_type beta, CV const& C) {
  static_assert(is_gemm_policy_v<Policy>,
                "telar::gemm_batched: Policy must be a Telar GEMM policy");
  static_assert(AV::rank == 4 && BV::rank == 4 && CV::rank == 4,
                "telar::gemm_batched: A, B and C are rank-4 batches [n1, n2, rows, cols]");
  using T = typename CV::non_const_value_type;
  using M = typename CV::memory_space;
  static_assert(Kokkos::SpaceAccessibility<Exec, M>::accessible,
                "telar::gemm_batched: the execution space cannot access the matrices' memory");
  std::size_t const n1 = C.extent(0), n2 = C.extent(1);
  bool const same = A.extent(0) == n1 && B.extent(0) == n1 && A.extent(1) == n2 &&
                    B.extent(1) == n2 &&
                    detail::op_rows(ta, A.extent(2), A.extent(3)) == C.extent(2) &&
                    detail::op_cols(tb, B.extent(2), B.extent(3)) == C.extent(3) &&
                    detail::op_cols(ta, A.extent(2), A.extent(3)) ==
                        detail::op_rows(tb, B.extent(2), B.extent(3));
  if (!same)
    throw ShapeError("telar::gemm_batched: batches or matrices do not match (C is " +
                     std::to_string(n1) + " x " + std::to_string(n2) + " of " +
                     std::to_string(C.extent(2)) + "x" + std::to_string(C.extent(3)) + ")");
  if (C.size() == 0)
    return;
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, M>::accessible;
  if constexpr (std::is_same_v<Policy, AutoGemm>) {
    gemm_batched(typename AutoGemm::template select<T, M>{}, exec, ta, tb, alpha, A, B, beta, C);
  } else if constexpr (std::is_same_v<Policy, Bf16Gemm> && Bf16Gemm::on_device<T, M>()) {
    if (detail::op_cols(ta, A.extent(2), A.extent(3)) == 0 || A.stride(3) != 1 ||
        B.stride(3) != 1 || C.stride(3) != 1)
      detail::reference_gemm_batched(exec, ta, tb, T(alpha), A, B, T(beta), C);
    else
      detail::cuda_bf16_gemm(exec, ta, tb, alpha, A, B, beta, C);
#if TELAR_GEMM_DEVICE_BATCHED
  } else if constexpr (std::is_same_v<Policy, KokkosKernelsGemm> && !host) {
    detail::kokkos_kernels_gemm_batched(exec, ta, tb, T(alpha), A, B, T(beta), C);
#endif
  } else if constexpr (std::is_same_v<Policy, ReferenceGemm> || !host) {
    detail::reference_gemm_batched(exec, ta, tb, T(alpha), A, B, T(beta), C);
  } else {
#if TELAR_HAVE_ONEDNN
    if constexpr (std::is_same_v<Policy, Bf16Gemm> && std::is_same_v<T, float>)
      if (detail::bf16_gemm_batched(exec, ta, tb, alpha, A, B, beta, C))
        return;
#endif
    using Kokkos::ALL;
    for (std::size_t b1 = 0; b1 < n1; ++b1)
      for (std::size_t b2 = 0; b2 < n2; ++b2)
        gemm(Policy{}, exec, ta, tb, alpha, Kokkos::subview(A, b1, b2, ALL, ALL),
             Kokkos::subview(B, b1, b2, ALL, ALL), beta, Kokkos::subview(C, b1, b2, ALL, ALL));
  }
}

} // namespace telar
