// What telar/schedule/detail/validator.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/schedule/detail/validator.hpp>

namespace telar::schedule::detail {

TELAR_DECL ValidationResult Validator::run() {
  if (!check_header())
    return std::move(result_);
  usable_.resize(s_.ranks.size());
  for (int r = 0; r < s_.stages; ++r)
    check_rank(r);
  auto partner = match_messages(
      s_, [&](int r, int i) { return usable_[r][i] != 0; },
      [&](Site site) {
        auto const& in = s_.ranks[site.rank][site.index];
        auto const [q, want] = counterpart(s_, site.rank, in);
        add(site.rank, site.index,
            "no matching " + to_string(want) + " on rank " + std::to_string(q));
      });
  if (result_.ok())
    check_progress(partner);
  return std::move(result_);
}

TELAR_DECL void Validator::add(int rank, int index, std::string reason) {
  if (result_.issues.size() >= opt_.max_issues) {
    ++result_.suppressed;
    return;
  }
  Issue is;
  is.rank = rank;
  is.index = index;
  if (rank >= 0 && index >= 0 && index < static_cast<int>(s_.ranks[rank].size()))
    is.instruction = s_.ranks[rank][index];
  if (rank >= 0 && s_.chunks == 1)
    is.stage = rank;
  else if (is.instruction && is.instruction->chunk >= 0 && is.instruction->chunk < s_.chunks &&
           is.instruction->op != Op::OptimizerStep)
    is.stage = s_.virtual_stage(rank, is.instruction->chunk);
  is.reason = std::move(reason);
  result_.issues.push_back(std::move(is));
}

TELAR_DECL bool Validator::check_header() {
  bool ok = true;
  auto fail = [&](std::string what) {
    add(-1, -1, std::move(what));
    ok = false;
  };
  if (s_.stages < 1)
    fail("stages = " + std::to_string(s_.stages) + " must be >= 1");
  if (s_.microbatches < 1)
    fail("microbatches = " + std::to_string(s_.microbatches) + " must be >= 1");
  if (s_.chunks < 1)
    fail("chunks = " + std::to_string(s_.chunks) + " must be >= 1");
  // One bookkeeping slot per (micro-batch, chunk) and rank; refuse absurd sizes up front.
  if (ok && static_cast<long long>(s_.microbatches) * s_.chunks > (1LL << 24))
    fail("microbatches * chunks = " +
         std::to_string(static_cast<long long>(s_.microbatches) * s_.chunks) +
         " exceeds the validator's limit of 2^24");
  if (ok && static_cast<int>(s_.ranks.size()) != s_.stages)
    fail("ranks has " + std::to_string(s_.ranks.size()) +
         " lists but stages = " + std::to_string(s_.stages));
  return ok;
}

TELAR_DECL std::string Validator::what(Instruction const& in) const {
  std::string w = "micro-batch " + std::to_string(in.microbatch);
  if (s_.chunks > 1)
    w += " chunk " + std::to_string(in.chunk);
  return w;
}

TELAR_DECL bool Validator::check_layout(int r, int i, Instruction const& in) {
  int const vs = s_.virtual_stage(r, in.chunk);
  int const last = s_.virtual_stages() - 1;
  bool const towards_next = in.op == Op::SendActivation || in.op == Op::RecvGrad;
  if (towards_next && vs == last) {
    add(r, i,
        std::string("the last virtual stage has no next stage to ") +
            (in.op == Op::SendActivation ? "send an activation to"
                                         : "receive a gradient from (its Forward computes the "
                                           "loss)"));
    return false;
  }
  if (!towards_next && vs == 0) {
    add(r, i,
        std::string("the first virtual stage has no previous stage to ") +
            (in.op == Op::RecvActivation ? "receive an activation from" : "send a gradient to"));
    return false;
  }
  int const other = towards_next ? vs + 1 : vs - 1;
  int const q = s_.rank_of(other);
  if (q == r) {
    add(r, i,
        "virtual stage " + std::to_string(other) +
            " is on this rank: the data stays local, no message belongs here");
    return false;
  }
  if (in.peer != q) {
    add(r, i,
        "peer " + std::to_string(in.peer) + " is wrong: virtual stage " + std::to_string(other) +
            " lives on rank " + std::to_string(q));
    return false;
  }
  return true;
}

TELAR_DECL void Validator::check_rank(int r) {
  auto const& list = s_.ranks[r];
  int const n = static_cast<int>(list.size());
  int const m = s_.microbatches;
  int const last = s_.virtual_stages() - 1;
  usable_[r].assign(list.size(), 0);
  std::vector<Slot> slots(static_cast<std::size_t>(m) * s_.chunks);
  int opt_at = -1;
  auto at = [&](int i) { return std::to_string(i); };
  for (int i = 0; i < n; ++i) {
    Instruction const& in = list[i];
    if (in.op == Op::OptimizerStep) {
      if (opt_at >= 0) {
        add(r, i, "duplicate OptimizerStep (first at instruction " + at(opt_at) + ")");
      } else {
        opt_at = i;
        if (i != n - 1)
          add(r, i,
              "OptimizerStep must be the last instruction, but " + to_string(list[i + 1]) +
                  " follows at instruction " + at(i + 1));
      }
      continue;
    }
    if (in.microbatch < 0 || in.microbatch >= m) {
      add(r, i, "micro-batch " + at(in.microbatch) + " is outside [0, " + at(m) + ")");
      continue;
    }
    if (in.chunk < 0 || in.chunk >= s_.chunks) {
      add(r, i, "chunk " + at(in.chunk) + " is outside [0, " + at(s_.chunks) + ")");
      continue;
    }
    Slot& sl = slots[static_cast<std::size_t>(in.chunk) * m + in.microbatch];
    switch (in.op) {
    case Op::Forward:
      if (sl.f >= 0)
        add(r, i, "duplicate Forward of " + what(in) + " (first at instruction " + at(sl.f) + ")");
      else
        sl.f = i;
      break;
    case Op::BackwardInput:
    case Op::Backward:
      if (sl.f < 0)
        add(r, i, std::string(name(in.op)) + " before the Forward of " + what(in));
      else if (sl.b >= 0)
        add(r, i,
            "duplicate backward of " + what(in) + " (" + to_string(list[sl.b]) +
                " at instruction " + at(sl.b) + ")");
      else {
        sl.b = i;
        if (in.op == Op::Backward) {
          sl.fused = true;
          sl.w = i;
        }
      }
      break;
    case Op::BackwardWeight:
      if (sl.f < 0)
        add(r, i, "BackwardWeight before the Forward of " + what(in));
      else if (sl.b < 0)
        add(r, i, "BackwardWeight before the BackwardInput of " + what(in));
      else if (sl.fused)
        add(r, i,
            "use after free: the activations of " + what(in) +
                " were freed by the fused Backward at instruction " + at(sl.b));
      else if (sl.w >= 0)
        add(r, i,
            "duplicate BackwardWeight of " + what(in) + " (first at instruction " + at(sl.w) + ")");
      else
        sl.w = i;
      break;
    default: { // the four messages
      if (!check_layout(r, i, in))
        break;
      int* mine = in.op == Op::SendActivation   ? &sl.sa
                  : in.op == Op::RecvActivation ? &sl.ra
                  : in.op == Op::SendGrad       ? &sl.sg
                                                : &sl.rg;
      if (*mine >= 0) {
        add(r, i,
            "duplicate " + std::string(name(in.op)) + " of " + what(in) +
                " (first at instruction " + at(*mine) + ")");
        break;
      }
      *mine = i;
      usable_[r][i] = 1; // matched across ranks even if misplaced here
      if (in.op == Op::SendActivation && sl.f < 0)
        add(r, i, "SendActivation before the Forward that produces it");
      else if (in.op == Op::SendActivation && sl.w >= 0)
        add(r, i,
            "use after free: the activations of " + what(in) + " were freed by " +
                to_string(list[sl.w]) + " at instruction " + at(sl.w));
      else if (in.op == Op::RecvActivation && sl.f >= 0)
        add(r, i,
            "RecvActivation after the Forward that consumes it (instruction " + at(sl.f) + ")");
      else if (in.op == Op::SendGrad && sl.b < 0)
        add(r, i, "SendGrad before the backward that produces it");
      else if (in.op == Op::RecvGrad && sl.b >= 0)
        add(r, i,
            "RecvGrad after the backward that consumes it (" + to_string(list[sl.b]) +
                " at instruction " + at(sl.b) + ")");
      break;
    }
    }
  }
  for (int c = 0; c < s_.chunks; ++c) {
    int const vs = s_.virtual_stage(r, c);
    bool const prev_remote = vs > 0 && s_.stages > 1;
    bool const next_remote = vs < last && s_.stages > 1;
    auto stage = [&](int v) {
      return "rank " + at(s_.rank_of(v)) + " (virtual stage " + at(v) + ")";
    };
    for (int k = 0; k < m; ++k) {
      Slot const& sl = slots[static_cast<std::size_t>(c) * m + k];
      Instruction const id{Op::Forward, k, c};
      if (sl.f < 0)
        add(r, n, "missing Forward of " + what(id));
      else if (sl.b < 0)
        add(r, n, "missing Backward or BackwardInput of " + what(id));
      else if (sl.w < 0)
        add(r, n,
            "missing BackwardWeight of " + what(id) + " after its BackwardInput at instruction " +
                at(sl.b) + " (its activations are never freed)");
      if (sl.f >= 0 && prev_remote && sl.ra < 0)
        add(r, sl.f,
            "missing RecvActivation before this Forward; " + stage(vs - 1) + " sends its input");
      if (sl.f >= 0 && next_remote && sl.sa < 0)
        add(r, sl.f,
            "missing SendActivation after this Forward; " + stage(vs + 1) + " waits for it");
      if (sl.b >= 0 && next_remote && sl.rg < 0)
        add(r, sl.b,
            "missing RecvGrad before this backward; " + stage(vs + 1) + " sends the gradient");
      if (sl.b >= 0 && prev_remote && sl.sg < 0)
        add(r, sl.b, "missing SendGrad after this backward; " + stage(vs - 1) + " waits for it");
    }
  }
  if (opt_at < 0)
    add(r, n, "missing OptimizerStep: every rank must end with one, after all BackwardWeight");
}

TELAR_DECL void Validator::check_progress(std::vector<std::vector<Site>> const& partner) {
  bool const eager = opt_.send_mode == SendMode::Eager;
  int const p = s_.stages;
  auto const pc = execute(s_, partner, !eager, [](int, int) {});
  for (int r = 0; r < p; ++r) {
    auto const& list = s_.ranks[r];
    if (pc[r] >= static_cast<int>(list.size()))
      continue;
    Site const other = partner[r][pc[r]];
    auto const& theirs = s_.ranks[other.rank];
    std::string reason = eager ? "deadlock: waits for "
                               : "deadlock (rendezvous sends): waits for rank " +
                                     std::to_string(other.rank) + " to reach ";
    reason += to_string(theirs[other.index]) + " (instruction " + std::to_string(other.index) +
              (eager ? " on rank " + std::to_string(other.rank) : std::string()) + "), but rank " +
              std::to_string(other.rank) + " is blocked at instruction " +
              std::to_string(pc[other.rank]) + " " + to_string(theirs[pc[other.rank]]);
    add(r, pc[r], std::move(reason));
  }
}

} // namespace telar::schedule::detail
