#pragma once
// Maps C++ types to MPI datatypes and telar::ReduceOp to MPI_Op.

#include <telar/comm/detail/bf16_word.hpp>

#include <mpi.h>

#include <cstddef>
#include <stdexcept>
#include <type_traits>

namespace telar {

/*! \brief Element-wise reduction applied by reducing collectives. */
enum class ReduceOp {
  sum,  //!< a + b
  prod, //!< a * b
  max,  //!< the larger of a and b
  min,  //!< the smaller of a and b
};

namespace detail {

template <class T>
inline constexpr bool dependent_false_v = false;

// True when mpi_type<T>() names a predefined datatype.
template <class T>
inline constexpr bool has_mpi_type_v =
    std::is_arithmetic_v<T> || std::is_same_v<std::remove_cv_t<T>, std::byte>;

// The predefined MPI datatype of T. Checked at compile time so an unsupported
// element type is reported where it enters the API, not as a runtime
// MPI_ERR_TYPE. std::int64_t and std::uint8_t map through their underlying
// types (long / unsigned char on LP64), which MPI defines for reductions.
template <class T>
MPI_Datatype mpi_type() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>)
    return MPI_FLOAT;
  else if constexpr (std::is_same_v<U, double>)
    return MPI_DOUBLE;
  else if constexpr (std::is_same_v<U, long double>)
    return MPI_LONG_DOUBLE;
  else if constexpr (std::is_same_v<U, char>)
    return MPI_CHAR;
  else if constexpr (std::is_same_v<U, signed char>)
    return MPI_SIGNED_CHAR;
  else if constexpr (std::is_same_v<U, unsigned char>)
    return MPI_UNSIGNED_CHAR;
  else if constexpr (std::is_same_v<U, short>)
    return MPI_SHORT;
  else if constexpr (std::is_same_v<U, unsigned short>)
    return MPI_UNSIGNED_SHORT;
  else if constexpr (std::is_same_v<U, int>)
    return MPI_INT;
  else if constexpr (std::is_same_v<U, unsigned>)
    return MPI_UNSIGNED;
  else if constexpr (std::is_same_v<U, long>)
    return MPI_LONG;
  else if constexpr (std::is_same_v<U, unsigned long>)
    return MPI_UNSIGNED_LONG;
  else if constexpr (std::is_same_v<U, long long>)
    return MPI_LONG_LONG;
  else if constexpr (std::is_same_v<U, unsigned long long>)
    return MPI_UNSIGNED_LONG_LONG;
  else if constexpr (std::is_same_v<U, bool>)
    return MPI_CXX_BOOL;
  else if constexpr (std::is_same_v<U, std::byte>)
    return MPI_BYTE;
  else if constexpr (std::is_same_v<U, Bf16Word>) // reduced by bf16_sum_op() only
    return MPI_UINT16_T;
  else {
    static_assert(dependent_false_v<T>,
                  "telar::Communicator: no MPI datatype for this element type; use an "
                  "arithmetic type (float, double, int, std::int64_t, std::uint8_t, char...) "
                  "or std::byte and a byte count");
    return MPI_DATATYPE_NULL;
  }
}

inline MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
  case ReduceOp::sum:
    return MPI_SUM;
  case ReduceOp::prod:
    return MPI_PROD;
  case ReduceOp::max:
    return MPI_MAX;
  case ReduceOp::min:
    return MPI_MIN;
  }
  return MPI_OP_NULL;
}

// bf16 words summed as Telar's own algorithms sum them (Bf16Word::operator+=:
// each addition in float, rounded back to bf16), for MPI's reductions of
// bf16 (ZeRO's reduce-scatters under Precision<..., bf16>).
inline void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  auto const* a = static_cast<Bf16Word const*>(in);
  auto* b = static_cast<Bf16Word*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] += a[i];
}
// Created once per process (after MPI_Init), kept until MPI_Finalize frees it.
inline MPI_Op bf16_sum_op() {
  static MPI_Op const op = [] {
    MPI_Op o = MPI_OP_NULL;
    MPI_Op_create(&bf16_sum, 1, &o);
    return o;
  }();
  return op;
}

// The MPI_Op of `op` on elements of type T: bf16 words have a sum only.
template <class T>
MPI_Op mpi_op(ReduceOp op) {
  if constexpr (std::is_same_v<std::remove_cv_t<T>, Bf16Word>) {
    if (op != ReduceOp::sum)
      throw std::invalid_argument("telar: bf16 words are summed only");
    return bf16_sum_op();
  } else {
    return mpi_op(op);
  }
}

inline const char* reduce_op_name(ReduceOp op) {
  constexpr char const* names[] = {"sum", "prod", "max", "min"}; // ReduceOp's order
  return names[static_cast<int>(op)];
}

} // namespace detail
} // namespace telar
