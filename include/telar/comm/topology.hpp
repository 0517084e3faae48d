#pragma once
/*! \file
 *  \brief telar::node_layout: which ranks of a communicator share a node, and
 *         the testing aid `TELAR_RANKS_PER_NODE` that fakes nodes on one host.
 */

#include <telar/comm/communicator.hpp>
#include <telar/comm/detail/topology.hpp>

namespace telar {

/*! \brief How the ranks of a communicator are spread over nodes.
 *
 *  "Regular" (uniform and consecutive) is what the topology-aware code
 *  acts on: nodes of g consecutive ranks, `node = rank / g`,
 *  `local_rank = rank % g`.
 */
struct NodeLayout {
  int nodes = 1;           //!< number of distinct nodes
  int ranks_per_node = 1;  //!< ranks on this rank's node
  int local_rank = 0;      //!< rank among the ranks of its node
  bool uniform = true;     //!< every node holds the same number of ranks
  bool consecutive = true; //!< every node's ranks are consecutive, in order
  /*! \brief Uniform and consecutive: rank = node · ranks_per_node + local_rank. */
  bool regular() const noexcept { return uniform && consecutive; }
};

/*! \brief The node layout of \p comm (collective; bounded by its timeout).
 *
 *  Nodes come from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), or, when the
 *  environment variable `TELAR_RANKS_PER_NODE=k` is set (a testing aid for
 *  one host), from the launch rank r (OMPI_COMM_WORLD_RANK, PMI_RANK,
 *  PMIX_RANK or SLURM_PROCID): ranks with the same r / k form one fake node.
 *  \param comm communicator to inspect
 *  \throws telar::CommError if `TELAR_RANKS_PER_NODE` is not a positive
 *          integer, or is set but no launch rank is in the environment
 */
inline NodeLayout node_layout(Communicator const& comm) {
  detail::NodeCounts const c = detail::node_counts(*comm.handle_ptr());
  return NodeLayout{c.nodes, c.ranks_per_node, c.local_rank, c.uniform, c.consecutive};
}

} // namespace telar
