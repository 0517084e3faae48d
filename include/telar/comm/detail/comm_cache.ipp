// What telar/comm/detail/comm_cache.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/comm/detail/comm_cache.hpp>

namespace telar::detail {

TELAR_DECL ProcessKey process_key(PeerInfo const& p) {
  auto text = [](char const* s, std::size_t n) { return std::string(s, strnlen(s, n)); };
  return {p.pid, p.start, text(p.host, sizeof p.host), text(p.boot_id, sizeof p.boot_id),
          text(p.pid_ns, sizeof p.pid_ns)};
}

TELAR_DECL Members members_of(CommHandle const& h, std::vector<int> const& ranks) {
  Members out;
  for (int r : ranks) {
    if (static_cast<std::size_t>(r) >= h.peers.size() || h.peers[r].pid < 0)
      return {};
    out.push_back(process_key(h.peers[r]));
  }
  return out;
}

TELAR_DECL MPI_Comm keep_prototype(std::map<Members, MPI_Comm>& cache, Members key, MPI_Comm made,
                                   CommHandle const& h) {
  if (key.empty() || made == MPI_COMM_NULL)
    return made;
  MPI_Comm_set_errhandler(made, MPI_ERRORS_RETURN);
  cache.emplace(std::move(key), made);
  return bounded_dup(made, h);
}

TELAR_DECL std::vector<int> split_ranks(CommHandle const& h, int color, int key) {
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

TELAR_DECL MPI_Comm split_comm(CommHandle const& h, int color, int key) {
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

TELAR_DECL MPI_Comm split_shared_comm(CommHandle const& h) {
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
