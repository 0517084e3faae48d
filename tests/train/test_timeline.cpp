// The measured pipeline timeline (Trainer::pipeline_timeline): for every
// schedule, each rank's compute events are its schedule's compute
// instructions in order (ending with the OptimizerStep) and do not overlap;
// every Send has its posting event, every Recv its posting and its wait.
// Times are only compared with each other, never with a bound.
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/schedule/timeline.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_test_macros.hpp>

#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

namespace {

using D = telar::Dense<float>;
using R = telar::ReLU<float>;
using Model = telar::Sequential<D, R, D, R, D, R, D, R, D>;
namespace ts = telar::schedule;

Model make_model() {
  return Model(D(6, 8), {}, D(8, 8), {}, D(8, 8), {}, D(8, 8), {}, D(8, 3));
}

} // namespace

TEST_CASE("The measured timeline follows the schedule, optimizer step included", "[timeline]") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world > 4)
    SKIP("needs at most 4 ranks (the model has 9 layers)");
  int const m = 4;
  std::size_t const batch = 8;
  telar::Matrix<float> x("x", batch, 6);
  telar::Labels<> y("y", batch);
  auto hx = Kokkos::create_mirror_view(x);
  auto hy = Kokkos::create_mirror_view(y);
  for (std::size_t i = 0; i < batch; ++i) {
    hy(i) = int(i % 3);
    for (std::size_t j = 0; j < 6; ++j)
      hx(i, j) = float((i * 7 + j * 3) % 11) / 11.f;
  }
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(y, hy);

  for (std::string const name : {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"}) {
    if (name == "interleaved" && 2 * world > 9)
      continue;
    CAPTURE(name, world);
    telar::TrainerOptions opts;
    opts.grid = {1, world, 1};
    opts.microbatches = m;
    opts.schedule = name;
    opts.trace = true;
    telar::Trainer<Model, telar::Strategy<telar::PipelineParallel<>>, telar::SGD<float>> tr(
        MPI_COMM_WORLD, make_model(), {}, opts, 6);
    tr.step(x, y);
    tr.clear_trace();
    tr.step(x, y);
    ts::Timeline const tl = tr.pipeline_timeline();
    ts::Schedule const& s = tr.pipeline_schedule();
    REQUIRE(tl.ranks == s.stages);

    for (int r = 0; r < s.stages; ++r) {
      CAPTURE(r);
      std::vector<ts::Event> compute, comm;
      for (auto const& e : tl.events)
        if (e.rank == r)
          (ts::is_compute(e.op) ? compute : comm).push_back(e);
      std::vector<ts::Instruction> expected, messages;
      for (auto const& in : s.ranks[r])
        (ts::is_compute(in.op) ? expected : messages).push_back(in);
      // One event per compute instruction, in list order, the optimizer step last.
      REQUIRE(compute.size() == expected.size());
      for (std::size_t i = 0; i < compute.size(); ++i) {
        CAPTURE(i);
        CHECK(compute[i].op == expected[i].op);
        CHECK(compute[i].microbatch == expected[i].microbatch);
        CHECK(compute[i].chunk == expected[i].chunk);
        CHECK(compute[i].end >= compute[i].start);
        if (i > 0)
          CHECK(compute[i].start >= compute[i - 1].end);
      }
      CHECK(compute.back().op == ts::Op::OptimizerStep);
      // Every Send and Recv is posted once (one event); a Recv also has its wait for the data,
      // after the posting: two events. Both precede the optimizer step.
      for (auto const& in : messages) {
        CAPTURE(ts::to_string(in));
        std::vector<ts::Event> mine;
        for (auto const& e : comm)
          if (e.op == in.op && e.microbatch == in.microbatch && e.chunk == in.chunk)
            mine.push_back(e);
        REQUIRE(mine.size() == (ts::is_send(in.op) ? 1u : 2u));
        for (auto const& e : mine) {
          CHECK(e.end >= e.start);
          CHECK(e.end <= compute.back().start);
        }
        if (mine.size() == 2)
          CHECK(mine[1].start >= mine[0].end);
      }
      std::size_t listed = 0;
      for (auto const& in : messages)
        listed += ts::is_send(in.op) ? 1 : 2;
      CHECK(comm.size() == listed);
    }
    auto const st = ts::analyze(tl);
    CHECK(st.bubble_fraction >= 0.0);
    CHECK(st.bubble_fraction < 1.0);
    for (double b : st.busy)
      CHECK(b > 0.0);
  }
}
