#pragma once
// When a pipeline rank gives a micro-batch's slot back (PipelineExecutor and
// the memory plan both use this, so the slot count is the schedule's, never
// MPI's timing's). A slot can be reused once the micro-batch's last
// instruction has run AND every message sent from its buffers has been
// received. The rank cannot see the second, but it can know that the peer
// has POSTED the matching receive: when a message the peer sent after that
// receive (in the peer's instruction order) has arrived here. From then on
// waiting for the send cannot deadlock, so the slot is released right there,
// waiting for its sends; otherwise it is kept to the end of the step.
#include <telar/core/detail/decl.hpp>
#include <telar/schedule/schedule.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <map>
#include <utility>
#include <vector>

namespace telar::detail {

inline constexpr std::size_t keep_to_end = std::numeric_limits<std::size_t>::max();

// Index of the Send / Recv instruction of `rank` that carries `key` (npos if none).
TELAR_DECL std::size_t find_message(schedule::Schedule const& s, int rank, schedule::MessageKey key,
                                    bool send);

// For each (micro-batch, chunk) of `rank`: the instruction index after which
// its slot is released (keep_to_end: at the end of the step).
TELAR_DECL std::map<std::pair<int, int>, std::size_t>
slot_release_points(schedule::Schedule const& s, int rank);

// Slots `rank` allocates for `chunk`: a micro-batch takes a free slot (or a
// new one) at its first instruction and gives it back at its release point.
TELAR_DECL std::size_t schedule_slots(schedule::Schedule const& s, int rank, int chunk);

} // namespace telar::detail

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/parallel/detail/slot_release.ipp>
#endif
