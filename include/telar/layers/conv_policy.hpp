#pragma once
/*! \file
 *  \brief Convolution policies: which implementation telar::Convolution runs.
 *
 *  Like the GEMM policies (telar/core/gemm.hpp), chosen by measurement
 *  (docs/design.md has the figures): on x86 hosts oneDNN's direct
 *  convolutions (telar::OneDnnConv) are several times faster than lowering
 *  each sample to a matrix and multiplying (telar::Im2colConv), which stays
 *  the portable path (any value type, any memory space, GPUs included) and
 *  the reference in tests. telar::AutoConv picks oneDNN for float on host
 *  memory when Telar was built with it, and im2col + GEMM elsewhere.
 *  \code
 *  telar::Conv2D<float> a(3, 16, 3, 1, 1);  // AutoConv
 *  telar::Conv2D<float, telar::DefaultMemorySpace, telar::AutoGemm, telar::Im2colConv> b(3, 16, 3);
 *  \endcode
 */
#include <telar/config.hpp>
#include <telar/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <type_traits>

namespace telar {

/*! \brief Portable convolution: im2col (a Kokkos kernel) and the layer's GEMM
 *  policy per sample, col2im for the input gradient. */
struct Im2colConv {
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "im2col"; }
  /*! \brief Whether this policy convolves T in MemorySpace (always).
   *  \tparam T value type \tparam MemorySpace memory space */
  template <class T, class MemorySpace>
  static constexpr bool supports() {
    return true;
  }
};

/*! \brief oneDNN's convolution primitives (forward, backward data, backward
 *  weights with bias) on host memory, float only. Primitives are created once
 *  per layer and batch size and reused. */
struct OneDnnConv {
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "onednn"; }
  /*! \brief Whether this policy convolves T in MemorySpace.
   *  \tparam T value type \tparam MemorySpace memory space */
  template <class T, class MemorySpace>
  static constexpr bool supports() {
    return TELAR_HAVE_ONEDNN && std::is_same_v<T, float> &&
           Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible;
  }
};

/*! \brief oneDNN's convolution primitives in mixed precision: src, weights
 *  and output gradients are rounded to bf16, accumulation and the results
 *  (output, input gradient, weight and bias gradients) are fp32 (host memory,
 *  float only).
 *
 *  The layer's weights, gradients and optimizer state stay fp32; only the
 *  primitives' inputs are converted: the weights on every call, x and the
 *  output gradient once per micro-batch (the backward primitives read the
 *  copies an earlier primitive converted). The instruction set is
 *  checked at run time when primitives are made: without AVX512-BF16 or AMX
 *  the layer throws telar::Error naming it, unless TELAR_BF16_FALLBACK=fp32
 *  asks for the fp32 primitives with a warning (see telar::Bf16Gemm).
 *  \code
 *  telar::Conv2D<float, Kokkos::HostSpace, telar::AutoGemm, telar::OneDnnConvBf16> c(3, 16, 3, 1,
 * 1); \endcode
 */
struct OneDnnConvBf16 {
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "onednn-bf16"; }
  /*! \brief Whether this policy convolves T in MemorySpace (as OneDnnConv).
   *  \tparam T value type \tparam MemorySpace memory space */
  template <class T, class MemorySpace>
  static constexpr bool supports() {
    return OneDnnConv::supports<T, MemorySpace>();
  }
};

/*! \brief Picks, per value type and memory space, oneDNN when it supports
 *  them, else im2col + GEMM. */
struct AutoConv {
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
  using select = std::conditional_t<OneDnnConv::supports<T, MemorySpace>(), OneDnnConv, Im2colConv>;
};

/*! \brief The policy of a convolution of T in MemorySpace computing in
 *  bf16 (what telar::Precision<telar::bf16, float> rebinds convolutions
 *  to): OneDnnConvBf16 where oneDNN runs it, else Im2colConv, whose GEMMs
 *  are then the layer's telar::Bf16Gemm (cuBLAS in CUDA memory).
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T, class MemorySpace>
using bf16_conv_policy_t =
    std::conditional_t<OneDnnConvBf16::supports<T, MemorySpace>(), OneDnnConvBf16, Im2colConv>;

/*! \brief True for the convolution policy types above. \tparam P a type */
template <class P>
inline constexpr bool is_conv_policy_v =
    std::is_same_v<P, Im2colConv> || std::is_same_v<P, OneDnnConv> ||
    std::is_same_v<P, OneDnnConvBf16> || std::is_same_v<P, AutoConv>;

/*! \brief True for the policies that run oneDNN's convolution primitives.
 *  \tparam P a convolution policy */
template <class P>
inline constexpr bool is_onednn_conv_v =
    std::is_same_v<P, OneDnnConv> || std::is_same_v<P, OneDnnConvBf16>;

/*! \brief Name of the policy AutoConv resolves to for T in MemorySpace.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T, class MemorySpace>
constexpr char const* conv_backend_name() {
  return AutoConv::select<T, MemorySpace>::name();
}

} // namespace telar
