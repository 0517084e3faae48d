// A rank killed while a checkpoint is written (run_kill.cmake runs the two
// phases): the partial file is never reported as complete, and the previous
// checkpoint loads.
#include "common.hpp"

#include <telar/io/checkpoint.hpp>

#include <catch2/catch_test_macros.hpp>

#include <cstdlib>
#include <filesystem>

using namespace telar::test;

namespace {
std::string kill_dir() {
  char const* d = std::getenv("TELAR_TEST_KILL_DIR");
  return d ? d : "telar_io_kill";
}
} // namespace

TEST_CASE("Writing a checkpoint, a rank dies", "[.kill_write]") {
  auto const data = make_data(batch * 2);
  with_trainer(MPI_COMM_WORLD, {world_size(), 1, 1, 1}, 3, [&](auto& t) {
    train_steps(t, data, 0, 1);
    telar::save_checkpoint(t, kill_dir());
    train_steps(t, data, 1, 2);
    setenv("TELAR_CHECKPOINT_TEST_KILL_AFTER_TENSOR", "3", 1);
    telar::save_checkpoint(t, kill_dir()); // rank 1 (0 alone) dies in here
  });
  FAIL("the test hook did not kill the rank");
}

TEST_CASE("After the death, the previous checkpoint is the latest and loads", "[.kill_check]") {
  std::string const dir = kill_dir();
  auto const latest = telar::latest_checkpoint(dir);
  REQUIRE(latest);
  CHECK(std::filesystem::path(*latest).filename() == "step-000001.h5");
  CHECK(std::filesystem::exists(std::filesystem::path(dir) / ".step-000002.h5.tmp"));
  with_trainer(MPI_COMM_WORLD, {world_size(), 1, 1, 1}, 3, [&](auto& t) {
    telar::load_checkpoint(t, dir);
    CHECK(t.steps() == 1);
  });
}
