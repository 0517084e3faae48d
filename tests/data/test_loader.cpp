// BatchLoader and BatchGather: a rank's batches per epoch, gathered into
// Kokkos views; simulated ranks together feed exactly the serial batches.
#include <telar/data/loader.hpp>
#include <telar/data/synthetic.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <Kokkos_Core.hpp>

#include <type_traits>
#include <utility>
#include <vector>

using telar::BatchGather;
using telar::BatchLoader;
using telar::DistributedSampler;
using telar::LastBatch;

TEST_CASE("BatchLoader yields the sampler's batches in step order", "[data][loader]") {
  DistributedSampler sampler(103, 2, 1, 5, true, LastBatch::keep);
  BatchLoader loader(sampler, 8);
  REQUIRE(loader.size() == 7); // ceil(103 / 16)
  for (std::uint64_t epoch : {0u, 1u}) {
    loader.set_epoch(epoch);
    sampler.set_epoch(epoch);
    std::size_t step = 0;
    for (telar::LocalBatch const& batch : loader) {
      REQUIRE(batch.step == step);
      REQUIRE(batch.indices == sampler.local_indices(step, 8));
      auto const slice = sampler.slice(step, 8);
      REQUIRE(batch.global_size == slice.global_size);
      REQUIRE(batch.global_offset == slice.local_begin);
      ++step;
    }
    REQUIRE(step == loader.size());
  }
  CHECK(loader.batch(6).global_size == 103 - 6 * 16);
  CHECK(loader.batch(6).indices.size() == 3); // 7 left: 4 on rank 0, 3 on rank 1
  CHECK(loader.local_batch() == 8);
  CHECK(loader.sampler().epoch() == 1);
  CHECK_THROWS_AS(BatchLoader(sampler, 0), std::invalid_argument);
}

using MemorySpaces = std::tuple<Kokkos::HostSpace, Kokkos::DefaultExecutionSpace::memory_space>;

TEMPLATE_LIST_TEST_CASE("BatchGather copies rows and labels into Kokkos views", "[data][loader]",
                        MemorySpaces) {
  using Gather = BatchGather<TestType>;
  telar::Dataset const data = telar::make_synthetic(50, 6, 3, 8);
  Gather gather(4, data.features);
  CHECK(gather.capacity() == 4);

  auto check = [&](std::vector<std::size_t> const& idx) {
    auto const hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gather.x());
    auto const hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gather.y());
    REQUIRE(gather.size() == idx.size());
    REQUIRE(hx.extent(0) == idx.size());
    REQUIRE(hx.extent(1) == data.features);
    REQUIRE(hy.extent(0) == idx.size());
    for (std::size_t k = 0; k < idx.size(); ++k) {
      for (std::size_t j = 0; j < data.features; ++j) {
        REQUIRE(hx(k, j) == data.x[idx[k] * data.features + j]);
      }
      REQUIRE(hy(k) == data.y[idx[k]]);
    }
  };

  std::vector<std::size_t> const a = {3, 1, 49, 0};
  gather.gather(data, a);
  check(a);
  float const* buffer = gather.x().data();

  // A smaller batch reuses the buffers.
  std::vector<std::size_t> const b = {7, 7};
  gather.gather(data, b.data(), b.size());
  check(b);
  CHECK(gather.x().data() == buffer);
  CHECK(gather.capacity() == 4);

  // A larger one grows them.
  std::vector<std::size_t> const c = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  gather.gather(data, c);
  check(c);
  CHECK(gather.capacity() == 9);

  // On an execution space instance: ordered with later work on that instance.
  typename Gather::execution_space space;
  gather.gather(space, data, a.data(), a.size());
  space.fence();
  check(a);

  // An empty batch (a rank with nothing in LastBatch::keep's last step).
  gather.gather(data, std::vector<std::size_t>{});
  CHECK(gather.size() == 0);
  CHECK(gather.x().extent(0) == 0);

  CHECK_THROWS_AS(gather.gather(data, std::vector<std::size_t>{50}), std::out_of_range);
  telar::Dataset broken = data;
  broken.y.pop_back();
  CHECK_THROWS_AS(gather.gather(broken, a), std::invalid_argument);

  // Movable, not copyable (copies would share buffers).
  static_assert(!std::is_copy_constructible_v<Gather>);
  Gather moved(std::move(gather));
  moved.gather(space, data, b.data(), b.size());
  Gather assigned;
  assigned = std::move(moved);
  space.fence();
  CHECK(assigned.size() == 2);
  CHECK(assigned.capacity() == 9);

  // Default-constructed: allocates on first use.
  Gather lazy;
  CHECK(lazy.capacity() == 0);
  lazy.gather(data, a);
  auto const lazy_x = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), lazy.x());
  CHECK(lazy_x(2, 5) == data.x[49 * 6 + 5]);
}

TEST_CASE("simulated ranks gather exactly the serial global batches", "[data][loader]") {
  // The data-parallel contract end to end: at every step, rank 0..R-1's
  // gathered rows, stacked, are the serial loader's rows for batch R x b.
  telar::Dataset const data = telar::make_synthetic(90, 5, 4, 21);
  int const replicas = 3;
  std::size_t const b = 4;
  for (auto policy : {LastBatch::drop, LastBatch::pad, LastBatch::keep}) {
    BatchLoader serial({data.size, 1, 0, 77, true, policy}, b * replicas);
    std::vector<BatchLoader> ranks;
    for (int r = 0; r < replicas; ++r) {
      ranks.emplace_back(DistributedSampler(data.size, replicas, r, 77, true, policy), b);
    }
    BatchGather<> serial_gather;
    std::vector<BatchGather<>> rank_gather(replicas);
    for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
      serial.set_epoch(epoch);
      for (auto& l : ranks) {
        l.set_epoch(epoch);
      }
      REQUIRE(serial.size() == ranks[0].size());
      for (std::size_t step = 0; step < serial.size(); ++step) {
        serial_gather(data, serial.batch(step));
        std::size_t row = 0;
        for (int r = 0; r < replicas; ++r) {
          auto& g = rank_gather[std::size_t(r)];
          g(data, ranks[std::size_t(r)].batch(step));
          for (std::size_t k = 0; k < g.size(); ++k, ++row) {
            REQUIRE(g.y()(k) == serial_gather.y()(row));
            for (std::size_t j = 0; j < data.features; ++j) {
              REQUIRE(g.x()(k, j) == serial_gather.x()(row, j));
            }
          }
        }
        REQUIRE(row == serial_gather.size());
      }
    }
  }
}
