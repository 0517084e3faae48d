// The validator rejects hand-made broken schedules, each with a message that names the rank,
// the instruction index, the instruction and the reason.
#include <telar/schedule/generators.hpp>
#include <telar/schedule/validate.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>

using namespace telar::schedule;
using Catch::Matchers::ContainsSubstring;

namespace {

// 1F1B for p = 2, m = 2, written by hand.
Schedule hand_1f1b() {
  Schedule s;
  s.name = "hand";
  s.stages = 2;
  s.microbatches = 2;
  s.ranks = {
      {{Op::Forward, 0},
       {Op::SendActivation, 0, 0, 1},
       {Op::Forward, 1},
       {Op::SendActivation, 1, 0, 1},
       {Op::RecvGrad, 0, 0, 1},
       {Op::Backward, 0},
       {Op::RecvGrad, 1, 0, 1},
       {Op::Backward, 1},
       {Op::OptimizerStep}},
      {{Op::RecvActivation, 0, 0, 0},
       {Op::Forward, 0},
       {Op::Backward, 0},
       {Op::SendGrad, 0, 0, 0},
       {Op::RecvActivation, 1, 0, 0},
       {Op::Forward, 1},
       {Op::Backward, 1},
       {Op::SendGrad, 1, 0, 0},
       {Op::OptimizerStep}},
  };
  return s;
}

// ZB-style split backward for p = 1, m = 1: F0 Bi0 W0 Opt.
Schedule hand_split() {
  Schedule s;
  s.name = "split";
  s.stages = 1;
  s.microbatches = 1;
  s.ranks = {
      {{Op::Forward, 0}, {Op::BackwardInput, 0}, {Op::BackwardWeight, 0}, {Op::OptimizerStep}}};
  return s;
}

// True when some issue is at (rank, index) and its text contains `text`.
bool has_issue(ValidationResult const& r, int rank, int index, std::string const& text) {
  return std::any_of(r.issues.begin(), r.issues.end(), [&](Issue const& is) {
    return is.rank == rank && is.index == index && is.to_string().find(text) != std::string::npos;
  });
}

} // namespace

TEST_CASE("validate: a correct hand-written schedule passes", "[schedule]") {
  auto const r = validate(hand_1f1b());
  INFO(r.message());
  CHECK(r.ok());
  CHECK(static_cast<bool>(r));
  CHECK(r.message().empty());
  CHECK_NOTHROW(check(hand_1f1b()));
  CHECK(validate(hand_split()).ok());
}

TEST_CASE("validate: crossed order that deadlocks", "[schedule]") {
  // Rank 0 waits for gradient 0 before it sends activation 0; rank 1 needs that activation.
  auto s = hand_1f1b();
  s.ranks[0] = {{Op::Forward, 0},        {Op::RecvGrad, 0, 0, 1}, {Op::SendActivation, 0, 0, 1},
                {Op::Backward, 0},       {Op::Forward, 1},        {Op::SendActivation, 1, 0, 1},
                {Op::RecvGrad, 1, 0, 1}, {Op::Backward, 1},       {Op::OptimizerStep}};
  auto const r = validate(s);
  INFO(r.message());
  REQUIRE(r.issues.size() == 2);
  CHECK(r.issues[0].to_string() ==
        "rank 0 (stage 0), instruction 1 RecvGrad(mb=0, chunk=0, peer=1): deadlock: waits for "
        "SendGrad(mb=0, chunk=0, peer=0) (instruction 3 on rank 1), but rank 1 is blocked at "
        "instruction 0 RecvActivation(mb=0, chunk=0, peer=0)");
  CHECK(has_issue(r, 1, 0, "deadlock: waits for SendActivation(mb=0, chunk=0, peer=1)"));
  CHECK_THROWS_AS(check(s), ScheduleError);
  CHECK_THROWS_AS(check(s), telar::Error); // the base of every Telar exception
  CHECK_THROWS_WITH(check(s), ContainsSubstring("schedule \"hand\" (p=2, m=2, v=1) is invalid") &&
                                  ContainsSubstring("rank 0 (stage 0), instruction 1"));
  try {
    check(s);
  } catch (ScheduleError const& e) {
    CHECK(e.result().issues.size() == 2);
  }
}

TEST_CASE("validate: a user's compute order that deadlocks once messages are added", "[schedule]") {
  Schedule s;
  s.name = "mine";
  s.stages = 2;
  s.microbatches = 2;
  // Rank 0 wants gradient 0 before it forwards micro-batch 1; rank 1 wants micro-batch 1
  // before it sends gradient 0.
  s.ranks = {{{Op::Forward, 0}, {Op::Backward, 0}, {Op::Forward, 1}, {Op::Backward, 1}},
             {{Op::Forward, 0}, {Op::Forward, 1}, {Op::Backward, 0}, {Op::Backward, 1}}};
  auto const r = validate(with_communication(s));
  INFO(r.message());
  CHECK(has_issue(r, 0, 2, "RecvGrad(mb=0, chunk=0, peer=1): deadlock"));
  CHECK(has_issue(r, 1, 2, "RecvActivation(mb=1, chunk=0, peer=0): deadlock"));
  s.ranks[1] = {{Op::Forward, 0}, {Op::Backward, 0}, {Op::Forward, 1}, {Op::Backward, 1}};
  CHECK(validate(with_communication(s)).ok());
}

TEST_CASE("validate: missing receive", "[schedule]") {
  auto s = hand_1f1b();
  s.ranks[1].erase(s.ranks[1].begin() + 4); // RecvActivation(mb=1)
  auto const r = validate(s);
  INFO(r.message());
  CHECK(has_issue(r, 1, 4,
                  "Forward(mb=1, chunk=0): missing RecvActivation before this Forward; "
                  "rank 0 (virtual stage 0) sends its input"));
  CHECK(has_issue(r, 0, 3,
                  "SendActivation(mb=1, chunk=0, peer=1): no matching "
                  "RecvActivation(mb=1, chunk=0, peer=0) on rank 1"));
}

TEST_CASE("validate: missing send", "[schedule]") {
  auto s = hand_1f1b();
  s.ranks[1].erase(s.ranks[1].begin() + 3); // SendGrad(mb=0)
  auto const r = validate(s);
  INFO(r.message());
  CHECK(has_issue(r, 1, 2, "missing SendGrad after this backward"));
  CHECK(has_issue(r, 0, 4, "no matching SendGrad(mb=0, chunk=0, peer=0) on rank 1"));
}

TEST_CASE("validate: backward before forward", "[schedule]") {
  auto s = hand_1f1b();
  std::swap(s.ranks[1][1], s.ranks[1][2]); // B0 F0
  auto const r = validate(s);
  INFO(r.message());
  CHECK(
      has_issue(r, 1, 1, "Backward(mb=0, chunk=0): Backward before the Forward of micro-batch 0"));
}

TEST_CASE("validate: weight gradient before input gradient", "[schedule]") {
  auto s = hand_split();
  std::swap(s.ranks[0][1], s.ranks[0][2]); // F0 W0 Bi0
  auto const r = validate(s);
  INFO(r.message());
  CHECK(has_issue(r, 0, 1,
                  "BackwardWeight(mb=0, chunk=0): BackwardWeight before the BackwardInput of "
                  "micro-batch 0"));
  // Bi0 then comes without its W; that is reported at the end of the list.
  CHECK(has_issue(r, 0, 4, "end of list (instruction 4): missing BackwardWeight of micro-batch 0"));
}

TEST_CASE("validate: duplicate forward", "[schedule]") {
  auto s = hand_1f1b();
  s.ranks[0].insert(s.ranks[0].begin() + 2, Instruction{Op::Forward, 0});
  auto const r = validate(s);
  INFO(r.message());
  CHECK(has_issue(r, 0, 2, "duplicate Forward of micro-batch 0 (first at instruction 0)"));
}

TEST_CASE("validate: use after free", "[schedule]") {
  auto s = hand_split();
  s.ranks[0] = {{Op::Forward, 0}, {Op::Backward, 0}, {Op::BackwardWeight, 0}, {Op::OptimizerStep}};
  auto r = validate(s);
  INFO(r.message());
  CHECK(has_issue(r, 0, 2,
                  "BackwardWeight(mb=0, chunk=0): use after free: the activations of micro-batch 0 "
                  "were freed by the fused Backward at instruction 1"));

  // Sending an activation after its W freed it.
  auto t = hand_1f1b();
  t.ranks[0] = {{Op::Forward, 0},        {Op::Forward, 1},  {Op::SendActivation, 1, 0, 1},
                {Op::RecvGrad, 0, 0, 1}, {Op::Backward, 0}, {Op::SendActivation, 0, 0, 1},
                {Op::RecvGrad, 1, 0, 1}, {Op::Backward, 1}, {Op::OptimizerStep}};
  r = validate(t);
  INFO(r.message());
  CHECK(has_issue(r, 0, 5,
                  "use after free: the activations of micro-batch 0 were freed by "
                  "Backward(mb=0, chunk=0) at instruction 4"));
}

TEST_CASE("validate: missing or misplaced optimizer step", "[schedule]") {
  auto s = hand_1f1b();
  s.ranks[1].pop_back();
  auto r = validate(s);
  INFO(r.message());
  REQUIRE(r.issues.size() == 1);
  CHECK(r.issues[0].to_string() ==
        "rank 1 (stage 1), end of list (instruction 8): missing OptimizerStep: every rank must end "
        "with one, after all BackwardWeight");

  auto t = hand_split();
  std::swap(t.ranks[0][2], t.ranks[0][3]); // Opt before W0
  r = validate(t);
  INFO(r.message());
  CHECK(has_issue(r, 0, 2,
                  "OptimizerStep: OptimizerStep must be the last instruction, but "
                  "BackwardWeight(mb=0, chunk=0) follows at instruction 3"));

  t = hand_split();
  t.ranks[0].push_back({Op::OptimizerStep});
  CHECK(has_issue(validate(t), 0, 4, "duplicate OptimizerStep (first at instruction 3)"));
}

TEST_CASE("validate: layout and ordering of messages", "[schedule]") {
  auto s = hand_1f1b();
  s.ranks[0][1].peer = 0; // SendActivation to itself
  auto r = validate(s);
  INFO(r.message());
  CHECK(has_issue(r, 0, 1, "peer 0 is wrong: virtual stage 1 lives on rank 1"));

  s = hand_1f1b();
  std::swap(s.ranks[0][0], s.ranks[0][1]); // send before the Forward produced it
  r = validate(s);
  INFO(r.message());
  CHECK(has_issue(r, 0, 0, "SendActivation before the Forward that produces it"));

  s = hand_1f1b();
  std::swap(s.ranks[1][0], s.ranks[1][1]); // receive after the Forward used it
  r = validate(s);
  INFO(r.message());
  CHECK(has_issue(r, 1, 1, "RecvActivation after the Forward that consumes it (instruction 0)"));

  s = hand_1f1b();
  s.ranks[1].insert(s.ranks[1].begin() + 2, Instruction{Op::RecvGrad, 0, 0, 0});
  r = validate(s);
  INFO(r.message());
  CHECK(has_issue(r, 1, 2, "the last virtual stage has no next stage to receive a gradient from"));

  s = hand_1f1b();
  s.ranks[0].insert(s.ranks[0].begin() + 6, Instruction{Op::SendGrad, 0, 0, 1});
  r = validate(s);
  INFO(r.message());
  CHECK(has_issue(r, 0, 6, "the first virtual stage has no previous stage to send a gradient to"));

  s = hand_1f1b();
  s.ranks[0][2].microbatch = 7;
  r = validate(s);
  INFO(r.message());
  CHECK(has_issue(r, 0, 2, "micro-batch 7 is outside [0, 2)"));
  CHECK(has_issue(r, 0, 9, "missing Forward of micro-batch 1"));
}

TEST_CASE("validate: interleaved issues name the virtual stage", "[schedule]") {
  auto s = interleaved_1f1b(2, 2, 2);
  // Rank 0 chunk 1 is virtual stage 2; drop the receive of its first input.
  auto& l = s.ranks[0];
  auto const it = std::find(l.begin(), l.end(), Instruction{Op::RecvActivation, 0, 1, 1});
  REQUIRE(it != l.end());
  int const index = static_cast<int>(it - l.begin());
  l.erase(it);
  auto const r = validate(s);
  INFO(r.message());
  CHECK(has_issue(r, 0, index,
                  "rank 0 (stage 2), instruction " + std::to_string(index) +
                      " Forward(mb=0, chunk=1): missing RecvActivation before this Forward; rank "
                      "1 (virtual stage 1) sends its input"));
}

TEST_CASE("validate: rendezvous sends are stricter than eager ones", "[schedule]") {
  auto const s = hand_1f1b();
  CHECK(validate(s).ok());
  auto const r = validate(s, {SendMode::Rendezvous});
  INFO(r.message());
  CHECK(has_issue(r, 0, 3,
                  "SendActivation(mb=1, chunk=0, peer=1): deadlock (rendezvous sends): waits for "
                  "rank 1 to reach RecvActivation(mb=1, chunk=0, peer=0) (instruction 4), but rank "
                  "1 is blocked at instruction 3 SendGrad(mb=0, chunk=0, peer=0)"));
  CHECK(has_issue(r, 1, 3, "deadlock (rendezvous sends)"));
  CHECK(validate(gpipe(4, 8), {SendMode::Rendezvous}).ok());
}

TEST_CASE("validate: whole-schedule problems and the issue limit", "[schedule]") {
  Schedule s;
  s.stages = 2;
  s.microbatches = 0;
  auto r = validate(s);
  CHECK(has_issue(r, -1, -1, "schedule: microbatches = 0 must be >= 1"));
  s.microbatches = 1;
  r = validate(s);
  CHECK(has_issue(r, -1, -1, "schedule: ranks has 0 lists but stages = 2"));

  s.microbatches = 1 << 25;
  CHECK(has_issue(validate(s), -1, -1, "exceeds the validator's limit of 2^24"));

  // 200 micro-batches without any instruction: one issue per micro-batch, capped.
  s.ranks.assign(2, {});
  s.microbatches = 200;
  r = validate(s, {SendMode::Eager, 10});
  CHECK(r.issues.size() == 10);
  CHECK(r.suppressed == 2 * 200 + 2 - 10);
  CHECK_FALSE(r.ok());
  CHECK_THAT(r.message(), ContainsSubstring("... and 392 more"));
}

TEST_CASE("validate: interleaving in rounds of exactly p deadlocks when p does not divide m",
          "[schedule]") {
  // The alternative interleaved_1f1b avoids (see docs/schedules.md): rounds of p micro-batches
  // with a smaller last one, same warm-up counts. For p = 4, m = 5, v = 3 it deadlocks.
  int const p = 4, m = 5, v = 3;
  std::vector<std::pair<int, int>> order; // (micro-batch, chunk)
  for (int first = 0; first < m; first += p)
    for (int c = 0; c < v; ++c)
      for (int k = first; k < std::min(first + p, m); ++k)
        order.emplace_back(k, c);
  Schedule s;
  s.name = "rounds_of_p";
  s.stages = p;
  s.microbatches = m;
  s.chunks = v;
  int const total = m * v;
  for (int r = 0; r < p; ++r) {
    std::vector<Instruction> l;
    int const warmup = std::min((v - 1) * p + 2 * (p - r - 1), total);
    auto fwd = [&](int i) { l.push_back({Op::Forward, order[i].first, order[i].second}); };
    auto bwd = [&](int i) { l.push_back({Op::Backward, order[i].first, v - 1 - order[i].second}); };
    for (int i = 0; i < warmup; ++i)
      fwd(i);
    for (int i = 0; i < total - warmup; ++i) {
      fwd(warmup + i);
      bwd(i);
    }
    for (int i = total - warmup; i < total; ++i)
      bwd(i);
    s.ranks.push_back(l);
  }
  auto const r = validate(with_communication(s));
  INFO(r.message());
  REQUIRE_FALSE(r.ok());
  for (auto const& is : r.issues)
    CHECK_THAT(is.reason, ContainsSubstring("deadlock"));
  CHECK(validate(interleaved_1f1b(p, m, v)).ok());
}
