// Degrees that do not fit the world or the strategy: the same clear message
// on every rank, no hang.
#include <telar/data/error.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_test_macros.hpp>

#include <mpi.h>

#include <type_traits>

// One base for every Telar exception: a caller catches telar::Error once.
static_assert(std::is_base_of_v<telar::Error, telar::CommError>);
static_assert(std::is_base_of_v<telar::Error, telar::CommTimeout>);
static_assert(std::is_base_of_v<telar::Error, telar::GridError>);
static_assert(std::is_base_of_v<telar::Error, telar::ShapeError>);
static_assert(std::is_base_of_v<telar::Error, telar::DataError>);
static_assert(std::is_base_of_v<telar::Error, telar::schedule::ScheduleError>);

namespace {
using Model = telar::Sequential<telar::Dense<float>, telar::ReLU<float>, telar::Dense<float>>;
Model model() {
  return Model(telar::Dense<float>(4, 8), {}, telar::Dense<float>(8, 2));
}
using DpPp = telar::Strategy<telar::DataParallel<>, telar::PipelineParallel<>>;

template <class S>
std::string error_of(telar::TrainerOptions opts) {
  try {
    telar::Trainer<Model, S, telar::SGD<float>> t(MPI_COMM_WORLD, model(), {}, opts, 4);
  } catch (std::exception const& e) {
    return e.what();
  }
  return "";
}
int world() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
} // namespace

TEST_CASE("A grid that does not fit the world names the sizes", "[strategy]") {
  telar::TrainerOptions opts;
  opts.grid = {3, 1, 1};
  std::string const msg = error_of<DpPp>(opts);
  if (world() != 3)
    CHECK(msg.find("does not fit dp=3 x pp=1 x tp=1") != std::string::npos);
}

TEST_CASE("A degree without its policy says which policy to add", "[strategy]") {
  telar::TrainerOptions opts;
  opts.grid = {0, 1, 2};
  CHECK(error_of<DpPp>(opts) == "telar::Trainer: tp=2 but the strategy (dp+pp) has no "
                                "TensorParallel; add telar::TensorParallel<> to the Strategy or "
                                "set tp=1");
  opts.grid = {0, 2, 1};
  CHECK(error_of<telar::Strategy<telar::DataParallel<>>>(opts) ==
        "telar::Trainer: pp=2 but the strategy (dp) has no PipelineParallel; add "
        "telar::PipelineParallel<> to the Strategy or set pp=1");
}

TEST_CASE("A spatial degree is refused by the Trainer, which takes whole samples", "[strategy]") {
  telar::TrainerOptions opts;
  opts.grid.dp = 1;
  opts.grid.sp = 2;
  CHECK(error_of<DpPp>(opts) ==
        "telar::Trainer: sp=2 but the Trainer's models take whole samples; a telar::SlabGraph "
        "splits them, updated by telar::SlabDataParallel over a telar::ProcessGrid with sp "
        "(docs/spatial.md), or set sp=1");
  opts.grid.sp = 0;
  CHECK(error_of<DpPp>(opts).find("degrees must be positive") != std::string::npos);
}

TEST_CASE("More pipeline stages than layers is refused", "[strategy]") {
  if (world() < 4)
    return;
  telar::TrainerOptions opts;
  opts.grid = {1, 4, 1};
  CHECK(error_of<DpPp>(opts) ==
        "telar::Trainer: cannot split a model of 3 layers into 4 pipeline stages (each stage "
        "needs at least one layer)");
}

TEST_CASE("A schedule name that does not exist is refused on every rank", "[strategy]") {
  telar::TrainerOptions opts;
  opts.schedule = "2f2b";
  CHECK(error_of<DpPp>(opts).find("unknown schedule \"2f2b\"") != std::string::npos);
}

TEST_CASE("A bad batch on one rank stops every rank with a message", "[strategy]") {
  if (world() < 2)
    return;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  telar::TrainerOptions opts;
  telar::Trainer<Model, DpPp, telar::SGD<float>> t(MPI_COMM_WORLD, model(), {}, opts, 4);
  // Rank 1 passes one label too few.
  telar::Matrix<float> x("x", 8, 4);
  telar::Labels<> y("y", rank == 1 ? 7 : 8);
  std::string msg;
  try {
    t.step(x, y);
  } catch (telar::ShapeError const& e) {
    msg = e.what();
  }
  if (rank == 1)
    CHECK(msg == "telar::Trainer::step: rank 1: 8 inputs but 7 targets");
  else
    CHECK(msg == "telar::Trainer::step: rank " + std::to_string(rank) +
                     ": another rank's batch was rejected (see its message)");
}
