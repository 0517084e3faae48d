// gather_model assembles whole tensors from pipeline stages, tensor-parallel
// blocks and ZeRO shards: the same values as serial training.
#include "common.hpp"

#include <catch2/catch_test_macros.hpp>

using namespace telar::test;

namespace {
telar::GatheredModel<double> gathered(MPI_Comm comm, Layout const& l, int steps, int root) {
  auto const data = make_data(batch * 2);
  telar::GatheredModel<double> g;
  with_trainer(comm, l, 11, [&](auto& t) {
    train_steps(t, data, 0, steps);
    g = telar::gather_model(t, root, true);
  });
  return g;
}
} // namespace

TEST_CASE("gather_model gives the serial tensors under every layout", "[gather]") {
  int const n = world_size();
  std::vector<Layout> layouts = {{1, 1, 1}};
  if (n >= 2)
    layouts.insert(layouts.end(), {{1, 2, 1}, {1, 1, 2}, {2, 1, 1, 3}, {2, 1, 1, 1}});
  if (n >= 4)
    layouts.insert(layouts.end(), {{2, 1, 2, 3}, {1, 2, 2}, {2, 2, 1, 2}, {4, 1, 1, 3}});
  telar::GatheredModel<double> ref0, ref2;
  if (world_rank() == 0) {
    ref0 = gathered(MPI_COMM_SELF, {1, 1, 1}, 0, 0);
    ref2 = gathered(MPI_COMM_SELF, {1, 1, 1}, 2, 0);
    CHECK(ref0.shapes.at("layer0.weight") == std::vector<std::size_t>{16, 12});
    CHECK(ref0.shapes.at("optim/slot1/layer2.weight") == std::vector<std::size_t>{9, 16});
  }
  for (auto const& l : layouts) {
    SubComm c(l.size());
    for (int root : {0, -1}) {
      telar::GatheredModel<double> at0, at2;
      if (c.comm != MPI_COMM_NULL) {
        at0 = gathered(c.comm, l, 0, root);
        at2 = gathered(c.comm, l, 2, root);
        if (root == 0 && world_rank() != 0)
          CHECK(at0.tensors.empty());
      }
      if (world_rank() == 0 || (root == -1 && c.comm != MPI_COMM_NULL)) {
        INFO(l.str() << " root " << root);
        if (world_rank() == 0) {
          CHECK(at0.tensors == ref0.tensors); // initial values drawn by global index
          CHECK(at0.shapes == ref0.shapes);
          REQUIRE(at2.tensors.size() == ref2.tensors.size());
          for (auto const& [name, v] : ref2.tensors) {
            INFO(name);
            auto const& w = at2.tensors.at(name);
            REQUIRE(w.size() == v.size());
            double worst = 0;
            for (std::size_t i = 0; i < v.size(); ++i)
              worst = std::max(worst, std::abs(w[i] - v[i]));
            CHECK(worst <= 1e-11);
          }
        } else {
          CHECK(at0.tensors.size() == 18); // 6 tensors, Adam's m and v
        }
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("Pieces that do not cover a tensor exactly once are refused", "[gather]") {
  telar::detail::ModelPieces m;
  m.names = {"layer0.scale"};
  m.shapes = {{8}};
  telar::detail::TensorPiece p;
  p.tensor = 0;
  p.size = 4;
  p.local_cols = 4;
  p.owner = true;
  m.pieces = {p}; // half of it: a sharded layer that does not say where its half lies
  try {
    telar::detail::check_cover(nullptr, m);
    FAIL("no error");
  } catch (telar::CheckpointError const& e) {
    CHECK(std::string(e.what()).find(
              "tensor layer0.scale [8] has 8 elements but the ranks hold 4") != std::string::npos);
  }
  m.pieces[0].size = 8;
  m.pieces[0].local_cols = 8;
  CHECK_NOTHROW(telar::detail::check_cover(nullptr, m));
}
