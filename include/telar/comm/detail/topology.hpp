#pragma once
// Node detection behind telar::node_layout and the topology-aware allreduce.

#include <telar/comm/detail/comm_cache.hpp>
#include <telar/comm/detail/comm_handle.hpp>
#include <telar/comm/error.hpp>
#include <telar/core/detail/decl.hpp>

#include <mpi.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

namespace telar::detail {

struct NodeCounts {
  int nodes = 1, ranks_per_node = 1, local_rank = 0;
  bool uniform = true, consecutive = true;
};

// A positive integer from the environment variable `var`, 0 when unset.
TELAR_DECL long env_positive(detail::CommHandle const& h, const char* var);

// The rank the launcher gave this process: a communicator cannot tell
// (sub-communicators renumber, and the library never talks on the world).
TELAR_DECL long launch_rank(detail::CommHandle const& h);

// This rank's node as a communicator: real (shared memory) or faked.
TELAR_DECL MPI_Comm split_node(detail::CommHandle const& h);

// Every rank's (node size, node-local rank), gathered: the same answer everywhere.
TELAR_DECL NodeCounts node_counts(detail::CommHandle const& h);

// Ranks per node when the nodes are regular (g consecutive ranks each), there
// are at least two, and each holds at least two ranks; else 1. Collective on
// the first call for a communicator, then cached with it.
TELAR_DECL int node_group_size(CommHandle& h);

} // namespace telar::detail

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/comm/detail/topology.ipp>
#endif
