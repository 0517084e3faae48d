// DistributedSampler: one order per (seed, epoch) on every rank, disjoint and
// covering shares, the LastBatch policies, and the data-parallel equivalence
// "global batch at step s = ranks 0..R-1's local batches concatenated =
// serial batch at step s". Ranks are simulated in one process.
#include <telar/data/sampler.hpp>

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <vector>

using telar::DistributedSampler;
using telar::LastBatch;

namespace {

std::vector<std::size_t> const sizes = {0, 1, 5, 7, 8, 12, 64, 100, 101};
std::vector<int> const replica_counts = {1, 2, 3, 4};
std::vector<std::size_t> const batches = {1, 2, 3, 8};
std::vector<LastBatch> const policies = {LastBatch::drop, LastBatch::pad, LastBatch::keep};

std::size_t ceil_div(std::size_t a, std::size_t b) {
  return (a + b - 1) / b;
}

} // namespace

TEST_CASE("the order is a permutation shared by all ranks for a (seed, epoch)", "[data][sampler]") {
  std::size_t const n = 1000;
  DistributedSampler serial(n, 1, 0, 7);
  std::vector<std::size_t> sorted = serial.order();
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < n; ++i) {
    REQUIRE(sorted[i] == i);
  }
  for (int replicas : {2, 3, 8}) {
    for (int rank = 0; rank < replicas; ++rank) {
      for (auto policy : policies) {
        DistributedSampler s(n, replicas, rank, 7, true, policy);
        REQUIRE(s.order() == serial.order());
        s.set_epoch(5);
        DistributedSampler t(n, 1, 0, 7);
        t.set_epoch(5);
        REQUIRE(s.order() == t.order());
      }
    }
  }
}

TEST_CASE("the order changes with the epoch and the seed, and is reproducible", "[data][sampler]") {
  DistributedSampler s(500, 2, 1, 3);
  auto const e0 = s.order();
  s.set_epoch(1);
  auto const e1 = s.order();
  s.set_epoch(2);
  auto const e2 = s.order();
  CHECK(e0 != e1);
  CHECK(e1 != e2);
  CHECK(e0 != e2);
  s.set_epoch(1);
  CHECK(s.order() == e1);
  s.set_epoch(0);
  CHECK(s.order() == e0);
  CHECK(s.epoch() == 0);
  CHECK(DistributedSampler(500, 2, 1, 4).order() != e0);

  // Pinned: the same on every platform.
  CHECK(DistributedSampler(10, 1, 0, 42).order() ==
        std::vector<std::size_t>{6, 8, 2, 3, 5, 1, 7, 9, 0, 4});

  // Without shuffling: stored order, every epoch.
  DistributedSampler plain(6, 2, 0, 3, false);
  plain.set_epoch(9);
  CHECK(plain.order() == std::vector<std::size_t>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("each epoch's order is uniformly random", "[data][sampler]") {
  // All 24 orders of 4 samples turn up about equally often over epochs.
  DistributedSampler s(4, 1, 0, 99);
  std::map<std::vector<std::size_t>, int> seen;
  int const epochs = 24000;
  for (int e = 0; e < epochs; ++e) {
    s.set_epoch(std::uint64_t(e));
    ++seen[s.order()];
  }
  CHECK(seen.size() == 24);
  for (auto const& [order, count] : seen) {
    CHECK(std::abs(count - 1000) < 150);
  }
}

TEST_CASE("shares are disjoint and cover the data as each LastBatch policy says",
          "[data][sampler]") {
  for (std::size_t n : sizes) {
    for (int replicas : replica_counts) {
      for (std::size_t b : batches) {
        for (auto policy : policies) {
          INFO("n " << n << " replicas " << replicas << " b " << b << " policy "
                    << telar::to_string(policy));
          std::size_t const g = b * std::size_t(replicas);
          std::size_t const steps =
              DistributedSampler(n, replicas, 0, 1, true, policy).num_steps(b);
          std::size_t const expected_steps = policy == LastBatch::drop ? n / g : ceil_div(n, g);
          REQUIRE(steps == expected_steps);
          std::vector<int> times_seen(n, 0);
          std::size_t total = 0;
          for (int rank = 0; rank < replicas; ++rank) {
            DistributedSampler s(n, replicas, rank, 1, true, policy);
            s.set_epoch(3);
            REQUIRE(s.num_steps(b) == steps); // same on every rank: no rank waits alone
            std::size_t mine = 0;
            for (std::size_t step = 0; step < steps; ++step) {
              auto const idx = s.local_indices(step, b);
              auto const slice = s.slice(step, b);
              REQUIRE(idx.size() == slice.local_size);
              bool const last = step + 1 == steps;
              if (policy == LastBatch::keep && last) {
                std::size_t const t = n - step * g;
                REQUIRE(slice.global_size == t);
                REQUIRE(idx.size() >= t / std::size_t(replicas));
                REQUIRE(idx.size() <= ceil_div(t, std::size_t(replicas)));
              } else {
                REQUIRE(idx.size() == b);
                REQUIRE(slice.global_size == g);
              }
              for (auto i : idx) {
                REQUIRE(i < n);
                ++times_seen[i];
              }
              mine += idx.size();
            }
            REQUIRE(s.num_local_samples(b) == mine);
            total += mine;
          }
          std::size_t const unseen =
              std::size_t(std::count(times_seen.begin(), times_seen.end(), 0));
          int const most = n ? *std::max_element(times_seen.begin(), times_seen.end()) : 0;
          switch (policy) {
          case LastBatch::drop:
            REQUIRE(total == steps * g);
            REQUIRE(most <= 1); // disjoint
            REQUIRE(unseen == n % g);
            break;
          case LastBatch::pad:
            REQUIRE(total == steps * g);
            REQUIRE(unseen == 0); // covering
            REQUIRE(std::size_t(most) <= ceil_div(steps * g, std::max<std::size_t>(n, 1)));
            break;
          case LastBatch::keep:
            REQUIRE(total == n);
            REQUIRE(unseen == 0);
            REQUIRE(most <= 1); // exactly once
            break;
          }
        }
      }
    }
  }
}

TEST_CASE("R ranks' local batches, concatenated, are the serial batch of R x b",
          "[data][sampler]") {
  for (std::size_t n : sizes) {
    for (int replicas : replica_counts) {
      for (std::size_t b : batches) {
        for (auto policy : policies) {
          for (bool shuffle : {true, false}) {
            INFO("n " << n << " replicas " << replicas << " b " << b << " policy "
                      << telar::to_string(policy) << " shuffle " << shuffle);
            std::size_t const g = b * std::size_t(replicas);
            DistributedSampler serial(n, 1, 0, 123, shuffle, policy);
            std::vector<DistributedSampler> ranks;
            for (int r = 0; r < replicas; ++r) {
              ranks.emplace_back(n, replicas, r, 123, shuffle, policy);
            }
            for (std::uint64_t epoch : {0u, 1u, 7u}) {
              serial.set_epoch(epoch);
              for (auto& s : ranks) {
                s.set_epoch(epoch);
              }
              REQUIRE(serial.num_steps(g) == ranks[0].num_steps(b));
              for (std::size_t step = 0; step < serial.num_steps(g); ++step) {
                std::vector<std::size_t> concatenated;
                for (int r = 0; r < replicas; ++r) {
                  auto const slice = ranks[std::size_t(r)].slice(step, b);
                  REQUIRE(slice.local_begin == concatenated.size()); // offset in the global batch
                  auto const mine = ranks[std::size_t(r)].local_indices(step, b);
                  concatenated.insert(concatenated.end(), mine.begin(), mine.end());
                }
                auto const reference = serial.local_indices(step, g);
                REQUIRE(concatenated == reference); // in order, hence also as a set
                REQUIRE(ranks[0].global_indices(step, b) == reference);
                REQUIRE(serial.slice(step, g).global_size == concatenated.size());
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("LastBatch policies on a worked example", "[data][sampler]") {
  // 10 samples, 3 ranks, local batch 2: global batch 6, one full step and 4 left.
  auto local = [](LastBatch p, int rank, std::size_t step) {
    return DistributedSampler(10, 3, rank, 0, false, p).local_indices(step, 2);
  };
  using V = std::vector<std::size_t>;
  CHECK(DistributedSampler(10, 3, 0, 0, false, LastBatch::drop).num_steps(2) == 1);
  CHECK(local(LastBatch::drop, 2, 0) == V{4, 5});
  // pad wraps around to the start of the order.
  CHECK(DistributedSampler(10, 3, 0, 0, false, LastBatch::pad).num_steps(2) == 2);
  CHECK(local(LastBatch::pad, 0, 1) == V{6, 7});
  CHECK(local(LastBatch::pad, 1, 1) == V{8, 9});
  CHECK(local(LastBatch::pad, 2, 1) == V{0, 1});
  // keep splits the 4 left as 2, 1, 1.
  CHECK(local(LastBatch::keep, 0, 1) == V{6, 7});
  CHECK(local(LastBatch::keep, 1, 1) == V{8});
  CHECK(local(LastBatch::keep, 2, 1) == V{9});
  // 2 left over 3 ranks: the last rank gets none but still takes the step.
  DistributedSampler tiny(8, 3, 2, 0, false, LastBatch::keep);
  CHECK(tiny.num_steps(2) == 2);
  CHECK(tiny.local_indices(1, 2).empty());
  CHECK(tiny.slice(1, 2).global_size == 2);
  CHECK(std::string(telar::to_string(LastBatch::pad)) == "pad");
}

TEST_CASE("the sampler rejects bad arguments", "[data][sampler]") {
  CHECK_THROWS_AS(DistributedSampler(10, 0, 0, 1), std::invalid_argument);
  CHECK_THROWS_AS(DistributedSampler(10, 2, 2, 1), std::invalid_argument);
  CHECK_THROWS_AS(DistributedSampler(10, 2, -1, 1), std::invalid_argument);
  DistributedSampler s(10, 2, 1, 1);
  CHECK_THROWS_AS(s.num_steps(0), std::invalid_argument);
  CHECK_THROWS_AS(s.local_indices(2, 2), std::out_of_range); // 10 / 4 = 2 steps
  CHECK_THROWS_AS(s.slice(0, 2, 2), std::out_of_range);
  CHECK(s.num_replicas() == 2);
  CHECK(s.rank() == 1);
  CHECK(s.seed() == 1);
  CHECK(s.shuffle());
  CHECK(s.last_batch() == LastBatch::drop);
  CHECK(s.dataset_size() == 10);
}
