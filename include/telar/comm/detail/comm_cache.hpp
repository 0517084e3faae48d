#pragma once
// Sub-communicators by membership, made once per process and duplicated after.
//
// Every Trainer splits its communicator into data-, pipeline- and tensor-
// parallel groups, node groups and hierarchical-allreduce groups; a test suite
// or a hyper-parameter search makes hundreds of Trainers over the same
// processes. MPI_Comm_split and MPI_Comm_split_type have no non-blocking form,
// and some implementations spin inside them without yielding: with more ranks
// than cores (MPICH 4.0 over UCX, four ranks on two cores) one split cost
// 11 ms and one node split 36 ms, 50 of a 61 s test. So the first split that
// yields a given group of processes keeps a prototype of it, and a later one
// with the same members (the same processes, in the same order) duplicates
// the prototype with MPI_Comm_idup, which Telar's yielding wait drives.
//
// Which path a rank takes is decided the same way by every member of the new
// group, with no extra collective: the members of a group are cached exactly
// when all of them took part in making it before, which they did together.
// A group is made with MPI_Comm_create_group, collective over its members only,
// so groups of one split that take different paths do not wait for each other.
// The prototypes are never freed: a job holds a few dozen, MPI_Finalize
// releases them, and freeing after it would be erroneous.

#include <telar/comm/detail/comm_handle.hpp>
#include <telar/comm/detail/liveness.hpp>
#include <telar/core/detail/decl.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

namespace telar::detail {

// A process, as far as membership goes (PeerInfo without the rank).
struct ProcessKey {
  long long pid = -1;
  unsigned long long start = 0;
  std::string host, boot_id, pid_ns;
  bool operator<(ProcessKey const& o) const {
    return std::tie(pid, start, host, boot_id, pid_ns) <
           std::tie(o.pid, o.start, o.host, o.boot_id, o.pid_ns);
  }
};
using Members = std::vector<ProcessKey>; // in the group's rank order

TELAR_DECL ProcessKey process_key(PeerInfo const& p);

// The processes behind ranks of h, in the order given; empty when a process
// cannot be named (no pid on this platform): such groups are never cached.
TELAR_DECL Members members_of(CommHandle const& h, std::vector<int> const& ranks);

// Groups made by a split, and node groups by the communicator they split.
inline std::map<Members, MPI_Comm>& group_prototypes() {
  static std::map<Members, MPI_Comm> cache;
  return cache;
}
inline std::map<Members, MPI_Comm>& node_prototypes() {
  static std::map<Members, MPI_Comm> cache;
  return cache;
}

// Keeps `made` as the prototype for `key` and returns a duplicate for the
// caller to own; unnamed groups are returned as made.
TELAR_DECL MPI_Comm keep_prototype(std::map<Members, MPI_Comm>& cache, Members key, MPI_Comm made,
                                   CommHandle const& h);

// The ranks of h with this rank's color, ordered by (key, rank) as
// MPI_Comm_split orders them; empty for MPI_UNDEFINED. Gathering the colors
// is bounded, so a missing rank is a CommTimeout rather than a hang.
TELAR_DECL std::vector<int> split_ranks(CommHandle const& h, int color, int key);

// MPI_Comm_split semantics (collective over h); the caller owns the result.
TELAR_DECL MPI_Comm split_comm(CommHandle const& h, int color, int key);

// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) semantics (collective over h):
// the ranks of h on this rank's node. The caller owns the result.
TELAR_DECL MPI_Comm split_shared_comm(CommHandle const& h);

} // namespace telar::detail

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/comm/detail/comm_cache.ipp>
#endif
