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

inline ProcessKey process_key(PeerInfo const& p) {
  auto text = [](char const* s, std::size_t n) { return std::string(s, strnlen(s, n)); };
  return {p.pid, p.start, text(p.host, sizeof p.host), text(p.boot_id, sizeof p.boot_id),
          text(p.pid_ns, sizeof p.pid_ns)};
}

// The processes behind ranks of h, in the order given; empty when a process
// cannot be named (no pid on this platform): such groups are never cached.
inline Members members_of(CommHandle const& h, std::vector<int> const& ranks) {
  Members out;
  for (int r : ranks) {
    if (static_cast<std::size_t>(r) >= h.peers.size() || h.peers[r].pid < 0)
      return {};
    out.push_back(process_key(h.peers[r]));
  }
  return out;
}

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
inline MPI_Comm keep_prototype(std::map<Members, MPI_Comm>& cache, Members key, MPI_Comm made,
                               CommHandle const& h) {
  if (key.empty() || made == MPI_COMM_NULL)
    return made;
  MPI_Comm_set_errhandler(made, MPI_ERRORS_RETURN);
  cache.emplace(std::move(key), made);
  return bounded_dup(made, h);
}

// The ranks of h with this rank's color, ordered by (key, rank) as
// MPI_Comm_split orders them; empty for MPI_UNDEFINED. Gathering the colors
// is bounded, so a missing rank is a CommTimeout rather than a hang.
inline std::vector<int> split_ranks(CommHandle const& h, int color, int key) {
  if (color < 0 && color != MPI_UNDEFINED)
    h.check(MPI_ERR_ARG, "MPI_Comm_split (a color must be >= 0 or MPI_UNDEFINED)");
  std::vector<int> const all = allgather_pairs(h, color, key, "MPI_Comm_split (colors)");
  std::vector<int> ranks;
  if (color == MPI_UNDEFINED)
    return ranks;
  for (int r = 0; r < h.size; ++r)
    if (all[2 * r] == color)
      ranks.push_back(r);
  std::stable_sort(ranks.begin(), ranks.end(),
                   [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  return ranks;
}

// MPI_Comm_split semantics (collective over h); the caller owns the result.
inline MPI_Comm split_comm(CommHandle const& h, int color, int key) {
  std::vector<int> const ranks = split_ranks(h, color, key);
  if (ranks.empty())
    return MPI_COMM_NULL;
  Members members = members_of(h, ranks);
  auto& cache = group_prototypes();
  if (auto it = cache.find(members); it != cache.end())
    return bounded_dup(it->second, h);
  MPI_Group parent = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  h.check(MPI_Comm_group(h.comm, &parent), "MPI_Comm_group");
  h.check(MPI_Group_incl(parent, static_cast<int>(ranks.size()), ranks.data(), &group),
          "MPI_Group_incl");
  MPI_Comm made = MPI_COMM_NULL;
  // The tag tells concurrent creations on one parent apart; Telar makes one
  // at a time per communicator.
  int const rc = MPI_Comm_create_group(h.comm, group, 0, &made);
  MPI_Group_free(&group);
  MPI_Group_free(&parent);
  h.check(rc, "MPI_Comm_create_group");
  return keep_prototype(cache, std::move(members), made, h);
}

// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) semantics (collective over h):
// the ranks of h on this rank's node. The caller owns the result.
inline MPI_Comm split_shared_comm(CommHandle const& h) {
  std::vector<int> all(static_cast<std::size_t>(h.size));
  std::iota(all.begin(), all.end(), 0);
  Members parent = members_of(h, all);
  auto& cache = node_prototypes();
  if (auto it = cache.find(parent); it != cache.end())
    return bounded_dup(it->second, h);
  bounded_barrier(h); // the split below cannot time out on its own
  MPI_Comm made = MPI_COMM_NULL;
  h.check(MPI_Comm_split_type(h.comm, MPI_COMM_TYPE_SHARED, h.rank, MPI_INFO_NULL, &made),
          "MPI_Comm_split_type");
  return keep_prototype(cache, std::move(parent), made, h);
}

} // namespace telar::detail
