#pragma once
// A bf16 Dense's compact copy of its input (telar::Dense<float, M,
// telar::Bf16Gemm>, when the stage runner sets saved_type::compact): the
// input rounded to bf16, 2 bytes a value, in place of a 4-byte activation
// the runner would otherwise keep per micro-batch for the weight gradient.
// A bf16 convolution (telar::OneDnnConvBf16) keeps its input the same way
// for its weight gradient, telar::KeptInBf16 (a bf16 GELU, GELUTanh, SiLU)
// for its slope.
//
// The words are those the product's own conversion makes (the same oneDNN
// 1-D reorder of a dense operand), and both products read them: forward's
// x W^T and backward's dy^T x. A convolution's words are its forward
// primitive's converted input, copied out (layers/detail/onednn_conv.hpp),
// which its weight gradient reads. So results are bit for bit those of the
// view, and x is converted once per micro-batch instead of twice. Where
// bf16 falls back to fp32 (TELAR_BF16_FALLBACK=fp32 on a CPU without the
// instructions) the copy is the fp32 input itself, 4 bytes a value, as
// exact as the view.
#include <telar/config.hpp>

#include <type_traits>

#if TELAR_HAVE_ONEDNN
#include <telar/core/detail/onednn.hpp>
#include <telar/core/detail/onednn_bf16_gemm.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

namespace telar::detail {

template <class MemorySpace>
class Bf16SavedInput {
public:
  // Bytes kept for `values` inputs: bf16 where it runs, else fp32 (what
  // keep() allocates; the memory plan's figure).
  static std::size_t bytes(std::size_t values) {
    return bf16_isa_available() ? view_bytes<std::uint16_t>(values) : view_bytes<float>(values);
  }

  // Keeps x [rows, cols] (dense): rounded to bf16 where it runs, copied in
  // fp32 where it falls back (`bf16`: bf16_check_isa's answer). Reallocated
  // only when the extents change.
  template <class Exec, class X>
  void keep(Exec const& exec, X const& x, bool bf16) {
    std::size_t const rows = x.extent(0), cols = x.extent(1);
    if (bf16) {
      std::uint16_t* const words = room(rows, cols);
      exec.fence(); // oneDNN runs on the calling thread: x must be written
      if (rows * cols > 0)
        onednn_to_bf16(x.data(), words, std::int64_t(rows * cols));
      return;
    }
    words_ = {};
    if (values_.extent(0) != rows || values_.extent(1) != cols)
      values_ = Matrix<float, MemorySpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::fp32_input"), rows, cols);
    Kokkos::deep_copy(exec, values_, x);
  }

  // Room for the words of an input [rows, cols], which the caller fills (a
  // convolution's primitive: with x as it converted it, in its own layout).
  std::uint16_t* room(std::size_t rows, std::size_t cols) {
    values_ = {};
    if (words_.extent(0) != rows || words_.extent(1) != cols)
      words_ =
          Words(Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::bf16_input"), rows, cols);
    return words_.data();
  }
  // Whether the copy is bf16 (words()), not fp32 (values()): keep() sizes
  // one of them to x, so this holds for an empty batch too.
  bool rounded() const { return words_.extent(1) != 0; }
  // The kept words (null when the copy is fp32).
  std::uint16_t const* words() const { return words_.data(); }
  // The kept fp32 input (empty when the copy is bf16).
  ConstMatrix<float, MemorySpace> values() const { return values_; }
  // The kept input's extents [rows, cols], whichever the copy is.
  std::size_t rows() const { return rounded() ? words_.extent(0) : values_.extent(0); }
  std::size_t cols() const { return rounded() ? words_.extent(1) : values_.extent(1); }
  // A view of the input's shape whose values are not to be read (the
  // products that take words() need only its extents).
  ConstMatrix<float, MemorySpace> shape() const {
    return ConstMatrix<float, MemorySpace>(static_cast<float const*>(nullptr), words_.extent(0),
                                           words_.extent(1));
  }

private:
  using Words = Kokkos::View<std::uint16_t**, Kokkos::LayoutRight, MemorySpace>;
  Words words_;
  Matrix<float, MemorySpace> values_;
};

} // namespace telar::detail

#endif // TELAR_HAVE_ONEDNN

namespace telar::detail {
// What a layer keeps besides its view of x: room for the compact copy where
// it runs in bf16 (`Bf16`: its GEMM or convolution policy), else nothing.
struct NoSavedInput {};
template <class MemorySpace, bool Bf16>
#if TELAR_HAVE_ONEDNN
using saved_input_t = std::conditional_t<Bf16, Bf16SavedInput<MemorySpace>, NoSavedInput>;
#else
using saved_input_t = NoSavedInput;
#endif
} // namespace telar::detail
