// What telar/comm/allreduce.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/comm/allreduce.hpp>

namespace telar {
namespace detail {

TELAR_DECL bool MpiAllreduceState::advance() {
  if (req_ == MPI_REQUEST_NULL)
    return false;
  int flag = 0;
  int const rc = MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS)
    comm_->fail(rc, "MPI_Iallreduce");
  return flag != 0;
}

TELAR_DECL void MpiAllreduceState::release(double bound) noexcept {
  if (req_ == MPI_REQUEST_NULL || mpi_finalized())
    return;
  try {
    wait_until(
        [&] {
          int flag = 0;
          MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
          return flag != 0;
        },
        bound, [](double) { throw 0; });
  } catch (...) {
    // A pending collective can be neither cancelled nor freed (MPI
    // standard); its handle is abandoned.
    req_ = MPI_REQUEST_NULL;
  }
}

} // namespace detail
} // namespace telar

namespace telar {

TELAR_DECL int HierarchicalAllreduce::resolve_group_size(detail::CommHandle& h) const {
  if (group_size > 0) {
    if (h.size % group_size != 0)
      throw CommError("telar::HierarchicalAllreduce: group_size " + std::to_string(group_size) +
                          " does not divide the size " + std::to_string(h.size) +
                          " of communicator '" + h.name + "'",
                      h.rank, "telar::HierarchicalAllreduce");
    return group_size;
  }
  if (h.auto_group_size == 0)
    h.auto_group_size = auto_group_size(h);
  return h.auto_group_size;
}

TELAR_DECL int HierarchicalAllreduce::auto_group_size(detail::CommHandle& h) {
  int const g = detail::node_group_size(h);
  if (g > 1)
    return g;
  int best = h.size;
  for (int d = 1; d <= h.size; ++d)
    if (h.size % d == 0 && d * d >= h.size) {
      best = d;
      break;
    }
  return best;
}

TELAR_DECL std::pair<std::shared_ptr<detail::CommHandle>, std::shared_ptr<detail::CommHandle>>&
HierarchicalAllreduce::sub_comms(detail::CommHandle& h, int g) {
  auto it = h.hier.find(g);
  if (it != h.hier.end())
    return it->second;
  auto split = [&](int color, int key, std::string const& label) {
    return detail::adopt(detail::split_comm(h, color, key), h.name + "/" + label, h.timeout);
  };
  auto inner = split(h.rank / g, h.rank % g, "hier-inner");
  auto outer = split(h.rank % g, h.rank / g, "hier-outer");
  return h.hier.emplace(g, std::make_pair(inner, outer)).first->second;
}

TELAR_DECL AllreduceMode TopologyAwareAllreduce::effective_mode(Communicator const& comm) const {
  const char* s = std::getenv("TELAR_ALLREDUCE");
  if (!s || !*s)
    return mode;
  std::string const v = s;
  if (v == "auto")
    return AllreduceMode::automatic;
  if (v == "flat")
    return AllreduceMode::flat;
  if (v == "hierarchical")
    return AllreduceMode::hierarchical;
  throw CommError("telar: TELAR_ALLREDUCE='" + v + "' on rank " + std::to_string(comm.rank()) +
                      " of " + std::to_string(comm.size()) +
                      ": expected auto, flat or hierarchical",
                  comm.rank(), "TELAR_ALLREDUCE");
}

TELAR_DECL int TopologyAwareAllreduce::group_size_for(Communicator const& comm) const {
  AllreduceMode const m = effective_mode(comm);
  if (m == AllreduceMode::flat)
    return 0;
  int const g = detail::node_group_size(*comm.handle_ptr());
  if (m == AllreduceMode::hierarchical)
    return g;
  return g > 1 ? g : 0;
}

} // namespace telar
