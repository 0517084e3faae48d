// What telar/parallel/tensor_parallel.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/parallel/tensor_parallel.hpp>

namespace telar {

TELAR_DECL void TensorParallelContext::validate(std::string const& api) const {
  std::string const at = api + ": invalid TensorParallelContext: ";
  if (size < 1 || rank < 0 || rank >= size)
    throw Error(at + "rank " + std::to_string(rank) + " of " + std::to_string(size));
  if (comm == nullptr && size > 1 && !shape_only)
    throw Error(at + "size " + std::to_string(size) + " without a communicator");
  if (comm != nullptr && (!comm->valid() || comm->size() != size || comm->rank() != rank))
    throw Error(at + "rank " + std::to_string(rank) + " of " + std::to_string(size) +
                " does not match its communicator" +
                (comm->valid() ? " (rank " + std::to_string(comm->rank()) + " of " +
                                     std::to_string(comm->size()) + ")"
                               : std::string(" (null)")));
}

} // namespace telar
