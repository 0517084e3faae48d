// Generators: valid for every size, the right shape, messages where the layout needs them.
#include "grid.hpp"

#include <telar/schedule/generators.hpp>
#include <telar/schedule/tags.hpp>
#include <telar/schedule/validate.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

using namespace telar::schedule;
using Catch::Matchers::ContainsSubstring;
using telar_test::ms;
using telar_test::ps;

namespace {

int count(Schedule const& s, int rank, Op op) {
  auto const& l = s.ranks[rank];
  return static_cast<int>(
      std::count_if(l.begin(), l.end(), [&](auto const& in) { return in.op == op; }));
}

// Every generated schedule, over the grid; interleaved with v = 1..4.
std::vector<Schedule> all_schedules() {
  std::vector<Schedule> out;
  for (int p : ps)
    for (int m : ms) {
      out.push_back(gpipe(p, m));
      out.push_back(one_f_one_b(p, m));
      for (int v = 1; v <= 4; ++v)
        out.push_back(interleaved_1f1b(p, m, v));
      out.push_back(zb_h1(p, m));
      out.push_back(zb_h2(p, m));
    }
  return out;
}

} // namespace

TEST_CASE("schedule: every generator passes the validator for all p, m", "[schedule]") {
  for (auto const& s : all_schedules()) {
    INFO(s.name << " p=" << s.stages << " m=" << s.microbatches << " v=" << s.chunks);
    auto const result = validate(s);
    INFO(result.message());
    REQUIRE(result.ok());
    REQUIRE(static_cast<int>(s.ranks.size()) == s.stages);
    bool const split = s.name.rfind("zb-", 0) == 0;
    for (int r = 0; r < s.stages; ++r) {
      REQUIRE(s.ranks[r].back().op == Op::OptimizerStep);
      int const per_rank = s.microbatches * s.chunks;
      CHECK(count(s, r, Op::Forward) == per_rank);
      CHECK(count(s, r, Op::Backward) == (split ? 0 : per_rank));
      CHECK(count(s, r, Op::BackwardInput) == (split ? per_rank : 0));
      CHECK(count(s, r, Op::BackwardWeight) == (split ? per_rank : 0));
    }
  }
}

TEST_CASE("schedule: messages sit right around the op that needs them", "[schedule]") {
  for (auto const& s : all_schedules()) {
    INFO(s.name << " p=" << s.stages << " m=" << s.microbatches << " v=" << s.chunks);
    int const last = s.virtual_stages() - 1;
    for (int r = 0; r < s.stages; ++r) {
      auto const& l = s.ranks[r];
      for (std::size_t i = 0; i < l.size(); ++i) {
        auto const& in = l[i];
        int const vs = s.virtual_stage(r, in.chunk);
        bool const remote = s.stages > 1;
        if (in.op == Op::Forward && vs > 0 && remote) {
          REQUIRE(i > 0);
          CHECK(l[i - 1] ==
                Instruction{Op::RecvActivation, in.microbatch, in.chunk, s.rank_of(vs - 1)});
        }
        if (in.op == Op::Forward && vs < last && remote)
          CHECK(l[i + 1] ==
                Instruction{Op::SendActivation, in.microbatch, in.chunk, s.rank_of(vs + 1)});
        if (is_backward_input(in.op) && vs < last && remote)
          CHECK(l[i - 1] == Instruction{Op::RecvGrad, in.microbatch, in.chunk, s.rank_of(vs + 1)});
        if (is_backward_input(in.op) && vs > 0 && remote)
          CHECK(l[i + 1] == Instruction{Op::SendGrad, in.microbatch, in.chunk, s.rank_of(vs - 1)});
        if (!remote)
          CHECK_FALSE(is_communication(in.op));
      }
    }
    CHECK(with_communication(s).ranks == s.ranks); // generators already are normal form
  }
}

TEST_CASE("schedule: message keys and tags agree on both sides", "[schedule]") {
  for (auto const& s :
       {one_f_one_b(4, 8), interleaved_1f1b(4, 8, 3), zb_h2(3, 5), interleaved_1f1b(2, 3, 2)}) {
    INFO(s.name << " v=" << s.chunks);
    // (src, dst, tag) -> how many messages use it
    std::map<std::tuple<int, int, int>, int> used;
    std::map<std::tuple<int, int, int>, int> received;
    int const tags = 2 * s.microbatches * s.chunks;
    for (int r = 0; r < s.stages; ++r)
      for (auto const& in : s.ranks[r]) {
        if (!is_communication(in.op))
          continue;
        int const tag = message_tag(s, message_key(s, r, in));
        CHECK(tag >= 0);
        CHECK(tag < tags);
        if (is_send(in.op))
          ++used[{r, in.peer, tag}];
        else
          ++received[{in.peer, r, tag}];
      }
    CHECK(used == received);
    for (auto const& kv : used)
      CHECK(kv.second == 1);
  }
  CHECK_THROWS_AS(message_key(gpipe(2, 2), 0, Instruction{Op::Forward, 0}), std::invalid_argument);
}

TEST_CASE("schedule: 1F1B order and messages, written out", "[schedule]") {
  auto const s = one_f_one_b(3, 4);
  CHECK(to_text(s) == "rank 0: F0 F1 F2 B0 F3 B1 B2 B3 Opt\n"
                      "rank 1: F0 F1 B0 F2 B1 F3 B2 B3 Opt\n"
                      "rank 2: F0 B0 F1 B1 F2 B2 F3 B3 Opt\n");
  CHECK_THAT(to_text(s, true),
             ContainsSubstring("rank 1: RA0<0 F0 SA0>2 RA1<0 F1 SA1>2 RG0<2 B0 SG0>0"));
  CHECK(to_text(zb_h1(2, 3)) == "rank 0: F0 F1 Bi0 W0 F2 Bi1 W1 Bi2 W2 Opt\n"
                                "rank 1: F0 Bi0 F1 Bi1 W0 F2 Bi2 W1 W2 Opt\n");
  CHECK(to_text(interleaved_1f1b(2, 2, 2)) == "rank 0: F0 F1 F0@1 F1@1 B0@1 B1@1 B0 B1 Opt\n"
                                              "rank 1: F0 F1 F0@1 B0@1 F1@1 B1@1 B0 B1 Opt\n");
  CHECK(to_string(Instruction{Op::SendGrad, 3, 1, 2}) == "SendGrad(mb=3, chunk=1, peer=2)");
  CHECK(to_string(Instruction{Op::OptimizerStep}) == "OptimizerStep");
  CHECK(to_string(Op::BackwardWeight) == "BackwardWeight");
}

TEST_CASE("schedule: peak in-flight activations", "[schedule]") {
  for (int p : ps)
    for (int m : ms) {
      INFO("p=" << p << " m=" << m);
      auto const g = peak_activations(gpipe(p, m));
      auto const o = peak_activations(one_f_one_b(p, m));
      auto const h1 = peak_activations(zb_h1(p, m));
      auto const h2 = peak_activations(zb_h2(p, m));
      for (int r = 0; r < p; ++r) {
        CHECK(g[r] == m);
        CHECK(o[r] == std::min(m, p - r));
        CHECK(h1[r] == std::min(m, p)); // 1F1B's peak, on every rank
        CHECK(h2[r] <= std::min(m, 2 * p - 1));
      }
      CHECK(o[0] == std::min(m, p));
      CHECK(h1[0] == std::min(m, p));
      CHECK(h2[0] == std::min(m, 2 * p - 1));
      for (int v = 2; v <= 4; ++v) {
        auto const s = interleaved_1f1b(p, m, v);
        int const first_round = m < p ? m : m / (m / p) + (m % (m / p) ? 1 : 0);
        auto const peak = peak_activations(s);
        for (int r = 0; r < p; ++r)
          CHECK(peak[r] == std::min((v - 1) * first_round + 2 * (p - r - 1) + 1, v * m));
      }
    }
}

TEST_CASE("schedule: send semantics each generator needs", "[schedule]") {
  // Documented in docs/schedules.md: GPipe needs no buffering; the others rely on
  // non-blocking sends as soon as two ranks exchange more than one micro-batch.
  for (int p : ps)
    for (int m : ms) {
      INFO("p=" << p << " m=" << m);
      ValidateOptions const rendezvous{SendMode::Rendezvous};
      CHECK(validate(gpipe(p, m), rendezvous).ok());
      bool const trivial = p == 1 || m == 1;
      CHECK(validate(one_f_one_b(p, m), rendezvous).ok() == trivial);
      CHECK(validate(interleaved_1f1b(p, m, 2), rendezvous).ok() == trivial);
      CHECK(validate(zb_h1(p, m), rendezvous).ok() == trivial);
      CHECK(validate(zb_h2(p, m), rendezvous).ok() == trivial);
    }
}

TEST_CASE("schedule: generators reject invalid sizes, naming function and values", "[schedule]") {
  CHECK_THROWS_WITH(gpipe(0, 4), ContainsSubstring("telar::schedule::gpipe(p=0, m=4)") &&
                                     ContainsSubstring("p (pipeline ranks) must be >= 1"));
  CHECK_THROWS_WITH(one_f_one_b(2, 0), ContainsSubstring("one_f_one_b(p=2, m=0)"));
  CHECK_THROWS_WITH(interleaved_1f1b(4, 8, 0),
                    ContainsSubstring("interleaved_1f1b(p=4, m=8, v=0)") &&
                        ContainsSubstring("v (chunks per rank) must be >= 1"));
  CHECK_THROWS_WITH(zb_h1(-1, 2), ContainsSubstring("zb_h1(p=-1, m=2)"));
  CHECK_THROWS_WITH(zb_h2(2, -3), ContainsSubstring("zb_h2(p=2, m=-3)"));
  CHECK_THROWS_AS(interleaved_1f1b(4, 1 << 30, 4), std::invalid_argument);
  CHECK_THROWS_WITH(generate("pipedream", 2, 2),
                    ContainsSubstring("unknown schedule \"pipedream\"") &&
                        ContainsSubstring("zb_h2"));
  for (auto const& name : schedule_names()) {
    auto const s = generate(name, 3, 5, 2);
    CHECK(s.name == name);
    CHECK(s.stages == 3);
    CHECK(s.microbatches == 5);
  }
  CHECK(generate("interleaved_1f1b", 3, 6, 3).chunks == 3);
}

TEST_CASE("schedule names: one canonical spelling, aliases accepted everywhere", "[schedule]") {
  CHECK(schedule_names() ==
        std::vector<std::string>{"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"});
  for (char const* n : {"zb-h1", "zb_h1", "ZB_H1", "Zb-H1"})
    CHECK(canonical_name(n) == "zb-h1");
  for (char const* n : {"interleaved", "interleaved_1f1b", "Interleaved-1F1B"})
    CHECK(canonical_name(n) == "interleaved");
  CHECK(canonical_name("GPipe") == "gpipe");
  CHECK_THROWS_WITH(canonical_name("zb-h3"),
                    ContainsSubstring("unknown schedule \"zb-h3\"") &&
                        ContainsSubstring("known: gpipe, 1f1b, interleaved, zb-h1, zb-h2") &&
                        ContainsSubstring("interleaved_1f1b"));
  // The tags build what generate() builds, and name it canonically.
  CHECK(telar::ZeroBubbleH1::make(3, 5).name == telar::ZeroBubbleH1::name());
  CHECK(generate("ZB_H2", 3, 5).name == "zb-h2");
  CHECK(telar::Interleaved1F1B<3>::make(2, 4).chunks == 3);
}

TEST_CASE("make_for_run: the strategy's tag, or the named one", "[schedule]") {
  // Empty name: the default tag with its own chunk count.
  CHECK(make_for_run<telar::Interleaved1F1B<3>>("", 2, 4, 2).chunks == 3);
  CHECK(make_for_run<telar::ZeroBubbleH2>("", 2, 4, 2).name == "zb-h2");
  // A name: that schedule, with the run's chunk count.
  CHECK(make_for_run<telar::OneFOneB>("interleaved_1f1b", 2, 4, 2).chunks == 2);
  CHECK(make_for_run<telar::OneFOneB>("ZB_H1", 2, 4, 2).name == "zb-h1");
  // One pipeline rank or one chunk: interleaving is plain 1F1B.
  CHECK(make_for_run<telar::OneFOneB>("interleaved", 1, 4, 2).name == "1f1b");
  CHECK(make_for_run<telar::Interleaved1F1B<1>>("", 2, 4, 2).name == "1f1b");
  CHECK_THROWS_AS(make_for_run<telar::OneFOneB>("pipedream", 2, 4, 2), std::invalid_argument);
}
