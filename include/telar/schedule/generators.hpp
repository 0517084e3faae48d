#pragma once

#include <telar/core/detail/decl.hpp>
#include <telar/schedule/detail/generators.hpp>
#include <telar/schedule/schedule.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

/*! \file
    \brief Generators for GPipe, 1F1B, interleaved 1F1B, ZB-H1 and ZB-H2. */

namespace telar::schedule {

/*! \brief GPipe: every rank runs all m Forwards, then all m fused Backwards (in micro-batch
    order).

    Bubble fraction `(p-1)/(m+p-1)` for uniform stage costs; every rank holds all m activations
    at its peak. Passes validation in both SendMode::Eager and SendMode::Rendezvous.
    \throws std::invalid_argument unless p >= 1 and m >= 1. */
TELAR_DECL Schedule gpipe(int p, int m);

/*! \brief 1F1B (PipeDream-Flush): rank r runs `min(p-r-1, m)` warm-up Forwards, then alternates
    one Forward and one fused Backward, then drains the remaining Backwards.

    Same bubble as GPipe, `(p-1)/(m+p-1)`, but rank r holds at most `min(p-r, m)` activations.
    Passes SendMode::Eager; fails SendMode::Rendezvous for p >= 2 and m >= 2 (a rank sends its
    next activation while its neighbour sends it a gradient, which needs buffered sends).
    \throws std::invalid_argument unless p >= 1 and m >= 1. */
TELAR_DECL Schedule one_f_one_b(int p, int m);

/*! \brief Interleaved 1F1B (Narayanan et al., SC'21; Megatron-LM's virtual pipeline): each rank
    holds v model chunks, virtual stage `chunk * p + rank`.

    Micro-batches are processed in rounds: `floor(m/p)` rounds (one if m < p) whose sizes differ
    by at most one, so every round has at least p micro-batches when m >= p. Within a round each
    rank runs the Forwards of chunk 0 for the round's micro-batches, then chunk 1, and so on;
    Backwards follow the same order with chunks reversed. Rank r first runs
    `(v-1)*g + 2*(p-r-1)` warm-up Forwards (g = size of the first round; `p-r-1` when v = 1),
    then alternates Forward and fused Backward, then drains.

    Requirements: p >= 1, m >= 1, v >= 1; any m is accepted (no divisibility condition).
    - m >= p: bubble time / ideal time = `(p-1)/(v*m)` exactly for uniform costs per virtual stage
      (bubble fraction `(p-1)/(v*m+p-1)`).
    - m < p: a chunk's next round cannot start before its first micro-batch has crossed all p
      ranks, so the bubble grows to `((p-1) + (v-1)*(p-m)) / (v*m)` of the ideal time.

    Peak activations on rank r: `min((v-1)*g + 2*(p-r-1) + 1, v*m)` chunk activations, each
    1/v of a non-interleaved stage's. Passes SendMode::Eager only.
    \throws std::invalid_argument unless p >= 1, m >= 1 and v >= 1. */
TELAR_DECL Schedule interleaved_1f1b(int p, int m, int v);

/*! \brief ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B with the
    backward split into BackwardInput (B) and BackwardWeight (W), where W waits.

    Rank r runs `min(p-r, m)` warm-up Forwards; then for each micro-batch k in order: B(k), then
    W(k-r) once k >= r (rank r keeps r weight gradients pending), then the next Forward; the
    pending W close the list. Deferring W lets the B chain cross the pipeline at the cost of B
    alone and fills the tail with W.

    With T_F = T_B = T_W = T and m >= p the makespan is `(3m + p - 1) T`: bubble `(p-1) T` per
    rank, one third of 1F1B's `3 (p-1) T`. Peak activations `min(p, m)` on every rank (1F1B's
    peak). Passes SendMode::Eager only.
    \throws std::invalid_argument unless p >= 1 and m >= 1. */
TELAR_DECL Schedule zb_h1(int p, int m);

/*! \brief ZB-H2 (Qi et al., ICLR 2024): more memory, zero bubble.

    Rank r runs `min(2(p-r)-1, m)` warm-up Forwards (filling the time until the first gradient
    comes back), then up to 2r pairs (B, F) without W until it holds 2p-1 activations, then
    steady (B, W, F) triples, then (B, W) pairs, then the pending W.

    With T_F = T_B = T_W = T and **m >= 2p-1**, every rank works without a gap from its first
    Forward to its last W, all for `3m T`: the per-rank chart is a parallelogram, and with the
    optimizer step not synchronised across ranks consecutive iterations tile with period `3m T`
    (zero bubble; see TimelineStats::period). For m < 2p-1 the period is `(3m + 2p-1-m) T`.
    Peak activations `min(2p-1, m)` on rank 0 and never more than 2p-1. Passes SendMode::Eager
    only.
    \throws std::invalid_argument unless p >= 1 and m >= 1. */
TELAR_DECL Schedule zb_h2(int p, int m);

} // namespace telar::schedule

// generate(), schedule_names() and canonical_name() read the schedule tags,
// which build their schedules with the generators above.
#include <telar/schedule/tags.hpp>

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/schedule/generators.ipp>
#endif
