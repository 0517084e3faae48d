// What telar/comm/detail/topology.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/comm/detail/topology.hpp>

namespace telar::detail {

TELAR_DECL long env_positive(detail::CommHandle const& h, const char* var) {
  const char* s = std::getenv(var);
  if (!s || !*s)
    return 0;
  errno = 0;
  char* end = nullptr;
  long const v = std::strtol(s, &end, 10);
  if (*end != '\0' || errno != 0 || v <= 0 || v > 1000000)
    throw CommError(std::string("telar: ") + var + "='" + s + "' on rank " +
                        std::to_string(h.rank) + " of " + std::to_string(h.size) +
                        ": expected a positive integer",
                    h.rank, var);
  return v;
}

TELAR_DECL long launch_rank(detail::CommHandle const& h) {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"})
    if (const char* s = std::getenv(var); s && *s)
      return std::strtol(s, nullptr, 10);
  if (h.size == 1)
    return 0; // a singleton run
  throw CommError("telar: TELAR_RANKS_PER_NODE is set but rank " + std::to_string(h.rank) + " of " +
                      std::to_string(h.size) +
                      " finds no launch rank (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK or "
                      "SLURM_PROCID) in its environment",
                  h.rank, "TELAR_RANKS_PER_NODE");
}

TELAR_DECL MPI_Comm split_node(detail::CommHandle const& h) {
  long const fake = env_positive(h, "TELAR_RANKS_PER_NODE");
  long const color = fake > 0 ? launch_rank(h) / fake : 0;
  // Both bounded, and duplicates of the first node split (comm_cache.hpp).
  return fake > 0 ? split_comm(h, static_cast<int>(color), h.rank) : split_shared_comm(h);
}

TELAR_DECL NodeCounts node_counts(detail::CommHandle const& h) {
  MPI_Comm node = split_node(h);
  int mine[2] = {1, 0};
  MPI_Comm_size(node, &mine[0]);
  MPI_Comm_rank(node, &mine[1]);
  MPI_Comm_free(&node);
  std::vector<int> const all = allgather_pairs(h, mine[0], mine[1], "MPI_Allgather");
  NodeCounts c;
  c.ranks_per_node = mine[0];
  c.local_rank = mine[1];
  c.nodes = 0;
  for (int r = 0; r < h.size; ++r) {
    int const size = all[2 * r], local = all[2 * r + 1];
    c.nodes += local == 0 ? 1 : 0;
    c.uniform = c.uniform && size == all[0];
    c.consecutive = c.consecutive && local == r % size;
  }
  return c;
}

TELAR_DECL int node_group_size(CommHandle& h) {
  if (h.node_group == 0) {
    NodeCounts const c = node_counts(h);
    bool const two_level = c.uniform && c.consecutive && c.nodes > 1 && c.ranks_per_node > 1;
    h.node_group = two_level ? c.ranks_per_node : 1;
  }
  return h.node_group;
}

} // namespace telar::detail
