// Checks the allreduce schedule generators without MPI: a serial simulator
// runs the per-rank transfer lists with eager, ordered channels and compares
// every rank's result with the serial sum, for many rank counts and lengths.
#include <telar/comm/detail/schedule.hpp>

#include <catch2/catch_test_macros.hpp>

#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <utility>
#include <vector>

namespace {
using telar::detail::Schedule;
using telar::detail::Xfer;

struct Msg {
  std::size_t cnt;
  std::vector<long> data;
};

// Runs one schedule per rank; channels are keyed by (comm, from, to).
// Returns false on a size mismatch or a deadlock.
bool simulate(std::vector<Schedule> const& sched, std::vector<std::vector<long>>& data,
              std::vector<std::vector<int>> const& to_global) {
  int const p = static_cast<int>(sched.size());
  std::map<std::tuple<int, int, int>, std::deque<Msg>> chan;
  std::vector<std::size_t> pc(static_cast<std::size_t>(p), 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      auto const& ops = sched[static_cast<std::size_t>(r)].ops;
      auto& i = pc[static_cast<std::size_t>(r)];
      while (i < ops.size()) {
        Xfer const& x = ops[i];
        int const peer = to_global[static_cast<std::size_t>(r)][x.comm * 1000 + x.peer];
        auto& d = data[static_cast<std::size_t>(r)];
        if (x.kind == Xfer::send) {
          chan[{x.comm, r, peer}].push_back(Msg{
              x.cnt, std::vector<long>(d.begin() + static_cast<std::ptrdiff_t>(x.off),
                                       d.begin() + static_cast<std::ptrdiff_t>(x.off + x.cnt))});
        } else {
          auto& q = chan[{x.comm, peer, r}];
          if (q.empty())
            break;
          Msg m = std::move(q.front());
          q.pop_front();
          if (m.cnt != x.cnt)
            return false;
          for (std::size_t k = 0; k < x.cnt; ++k) {
            if (x.kind == Xfer::recv_copy)
              d[x.off + k] = m.data[k];
            else
              d[x.off + k] += m.data[k];
          }
        }
        ++i;
        progress = true;
      }
    }
  }
  for (int r = 0; r < p; ++r)
    if (pc[static_cast<std::size_t>(r)] != sched[static_cast<std::size_t>(r)].ops.size())
      return false;
  for (auto const& [key, q] : chan)
    if (!q.empty())
      return false;
  return true;
}

// Builds schedules with `gen(schedule, rank)` and checks the sums. to_global
// maps (comm * 1000 + peer) to the global rank for each rank.
void check(int p, std::size_t n, std::size_t seg, std::function<void(Schedule&, int)> const& gen,
           std::function<int(int, int, int)> const& global_of) {
  std::vector<Schedule> s(static_cast<std::size_t>(p));
  std::vector<std::vector<long>> data(static_cast<std::size_t>(p), std::vector<long>(n));
  std::vector<std::vector<int>> to_global(static_cast<std::size_t>(p), std::vector<int>(2000, -1));
  std::vector<long> expect(n, 0);
  for (int r = 0; r < p; ++r) {
    s[static_cast<std::size_t>(r)].seg = seg;
    gen(s[static_cast<std::size_t>(r)], r);
    for (int c = 0; c < 2; ++c)
      for (int q = 0; q < p; ++q)
        to_global[static_cast<std::size_t>(r)][c * 1000 + q] = global_of(r, c, q);
    for (std::size_t i = 0; i < n; ++i) {
      long const v = (r + 1) * 1000 + static_cast<long>(i % 97);
      data[static_cast<std::size_t>(r)][i] = v;
      expect[i] += v;
    }
  }
  INFO("p=" << p << " n=" << n << " seg=" << seg);
  REQUIRE(simulate(s, data, to_global));
  for (int r = 0; r < p; ++r)
    REQUIRE(data[static_cast<std::size_t>(r)] == expect);
}
} // namespace

TEST_CASE("ring schedule sums for any rank count and length", "[comm][schedule]") {
  for (int p = 1; p <= 9; ++p)
    for (std::size_t n : {0, 1, 2, 3, 5, 8, 17, 64, 101})
      for (std::size_t seg : {1, 3, 1000}) {
        check(
            p, n, seg,
            [&](Schedule& s, int r) {
              telar::detail::ring_reduce_scatter(s, 0, r, p, 0, n);
              telar::detail::ring_allgather(s, 0, r, p, 0, n);
            },
            [](int, int, int q) { return q; });
      }
}

TEST_CASE("recursive halving-doubling schedule sums for any rank count", "[comm][schedule]") {
  for (int p = 1; p <= 17; ++p)
    for (std::size_t n : {0, 1, 2, 3, 7, 16, 33, 100})
      for (std::size_t seg : {2, 1000}) {
        check(
            p, n, seg,
            [&](Schedule& s, int r) { telar::detail::recursive_halving_doubling(s, 0, r, p, n); },
            [](int, int, int q) { return q; });
      }
}

TEST_CASE("hierarchical schedule sums for every group size", "[comm][schedule]") {
  for (int p = 1; p <= 12; ++p)
    for (int g = 1; g <= p; ++g) {
      if (p % g != 0)
        continue;
      int const q = p / g;
      for (std::size_t n : {0, 1, 5, 12, 50})
        for (std::size_t seg : {2, 1000}) {
          check(
              p, n, seg,
              [&](Schedule& s, int r) {
                int const local = r % g, group = r / g;
                int const owned = telar::detail::ring_reduce_scatter(s, 0, local, g, 0, n);
                auto const b0 = telar::detail::block_begin(n, g, owned);
                auto const bn = telar::detail::block_size(n, g, owned);
                telar::detail::ring_reduce_scatter(s, 1, group, q, b0, bn);
                telar::detail::ring_allgather(s, 1, group, q, b0, bn);
                telar::detail::ring_allgather(s, 0, local, g, 0, n);
              },
              [&](int r, int comm, int peer) {
                return comm == 0 ? (r / g) * g + peer : peer * g + r % g;
              });
        }
    }
}

TEST_CASE("blocks cover the range", "[comm][schedule]") {
  for (int p = 1; p <= 9; ++p)
    for (std::size_t n : {0, 1, 4, 10, 11}) {
      std::size_t total = 0;
      for (int c = 0; c < p; ++c) {
        REQUIRE(telar::detail::block_begin(n, p, c) == total);
        total += telar::detail::block_size(n, p, c);
      }
      REQUIRE(total == n);
    }
}
