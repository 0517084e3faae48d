#pragma once
/*! \file
 *  \brief Gathering per-rank recordings onto every rank or one: Chrome trace
 *  files of every rank's TraceRecorder, and measured pipeline timelines. */
#include <telar/comm/communicator.hpp>
#include <telar/profile/trace.hpp>
#include <telar/schedule/timeline.hpp>

#include <numeric>
#include <string>
#include <vector>

namespace telar {

namespace detail {
// Every rank's values, concatenated in rank order; `lens` gets each rank's
// count (collective).
template <class T>
std::vector<T> allgather_all(Communicator const& comm, std::vector<T> const& mine,
                             std::vector<int>& lens) {
  int len = int(mine.size());
  lens.assign(static_cast<std::size_t>(comm.size()), 0);
  comm.allgather(&len, 1, lens.data());
  std::vector<T> all(static_cast<std::size_t>(std::accumulate(lens.begin(), lens.end(), 0)));
  comm.allgatherv(mine.data(), lens, all.data());
  return all;
}
} // namespace detail

/*! \brief Writes the timelines of every rank of \p comm into one Chrome trace
 *  file on its rank 0, one process row per rank (collective over \p comm).
 *  \param comm the ranks to gather (null: this rank alone)
 *  \param trace this rank's recorder
 *  \param path output file
 *  \return false on rank 0 when the file could not be written, true elsewhere */
inline bool gather_chrome_trace(Communicator const* comm, TraceRecorder const& trace,
                                std::string const& path) {
  int const rank = comm ? comm->rank() : 0;
  std::string const mine = trace.json_events(rank);
  std::vector<std::string> lists{mine};
  if (comm && comm->size() > 1) {
    std::vector<int> lens;
    auto const all =
        detail::allgather_all(*comm, std::vector<char>(mine.begin(), mine.end()), lens);
    lists.clear();
    std::size_t at = 0;
    for (int l : lens) {
      lists.emplace_back(all.data() + at, std::size_t(l));
      at += std::size_t(l);
    }
  }
  return rank != 0 || write_chrome_trace(path, lists);
}

/*! \brief The measured events of every rank of a pipeline as one timeline
 *  (collective over \p pp).
 *  \param pp the pipeline's ranks (null: this rank alone)
 *  \param events this rank's events, each naming its pipeline rank
 *  \param name the timeline's name
 *  \param ranks pipeline ranks */
inline schedule::Timeline gather_timeline(Communicator const* pp,
                                          std::vector<schedule::Event> const& events,
                                          std::string name, int ranks) {
  schedule::Timeline tl;
  tl.name = std::move(name);
  tl.ranks = ranks;
  // Six doubles per event: MPI moves plain numbers.
  std::vector<double> mine;
  for (auto const& e : events)
    mine.insert(mine.end(), {double(e.rank), double(int(e.op)), double(e.microbatch),
                             double(e.chunk), e.start, e.end});
  std::vector<int> lens;
  std::vector<double> const all =
      pp && pp->size() > 1 ? detail::allgather_all(*pp, mine, lens) : mine;
  for (std::size_t i = 0; i + 5 < all.size(); i += 6)
    tl.events.push_back({int(all[i]), static_cast<schedule::Op>(int(all[i + 1])), int(all[i + 2]),
                         int(all[i + 3]), all[i + 4], all[i + 5]});
  return tl;
}

} // namespace telar
