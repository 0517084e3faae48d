// Tensor-parallel transformer block (head-parallel attention, Column/Row MLP)
// against the serial TransformerBlock at every tp size dividing the world:
// output, input gradient and every rank's parameter-gradient shards, the
// allreduces per sub-block, parameter names and replicas, position-wise
// Column/Row on [seq, hidden], and uneven heads refused. Every check is
// agreed on by all ranks before it is asserted.
#include <telar/comm/communicator.hpp>
#include <telar/comm/process_grid.hpp>
#include <telar/layers/transformer.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/parallel/tensor_parallel_attention.hpp>

#include "comm/mpi_check.hpp"
#include "support.hpp"

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

using telar::test::random_matrix;
using telar::test::to_host;
using Exec = telar::DefaultMemorySpace::execution_space;
using Mat = telar::Matrix<double>;

namespace {

telar::Communicator const& world() {
  static telar::Communicator w(MPI_COMM_WORLD, "world");
  return w;
}

std::vector<int> tp_sizes() {
  std::vector<int> s;
  for (int tp = 1; tp <= world().size(); ++tp)
    if (world().size() % tp == 0)
      s.push_back(tp);
  return s;
}

struct Tensor {
  std::vector<double> v;
  std::size_t rows = 0, cols = 0; // cols = 0: a vector
};

template <class M>
std::map<std::string, Tensor> grads_of(M& model) {
  std::map<std::string, Tensor> out;
  model.parameters([&](char const* name, auto&, auto& g) {
    auto h = to_host(g);
    Tensor t{std::vector<double>(h.data(), h.data() + h.size()), g.extent(0),
             g.rank == 2 ? g.extent(1) : 0};
    out[name] = t;
  });
  return out;
}

// max |local - the matching block of full| / max |full|; blocks are even
// (heads and 4 hidden divide by tp here), so rank r's block starts at r x its size.
// The key bias's gradient is 0 in exact arithmetic (softmax ignores a shift
// of every score of a row), so the scale has a floor.
double shard_err(Tensor const& local, Tensor const& full, int rank) {
  double d = 0, s = 1e-3;
  for (double v : full.v)
    s = std::max(s, std::abs(v));
  std::size_t const r = std::size_t(rank);
  if (local.v.size() == full.v.size()) { // replicated
    for (std::size_t i = 0; i < local.v.size(); ++i)
      d = std::max(d, std::abs(local.v[i] - full.v[i]));
  } else if (local.cols == 0) { // a bias shard
    for (std::size_t i = 0; i < local.rows; ++i)
      d = std::max(d, std::abs(local.v[i] - full.v[local.rows * r + i]));
  } else { // a row block (column-parallel) or a column block (row-parallel)
    bool const by_rows = local.cols == full.cols;
    std::size_t const r0 = by_rows ? local.rows * r : 0, c0 = by_rows ? 0 : local.cols * r;
    for (std::size_t i = 0; i < local.rows; ++i)
      for (std::size_t j = 0; j < local.cols; ++j)
        d = std::max(d,
                     std::abs(local.v[i * local.cols + j] - full.v[(r0 + i) * full.cols + c0 + j]));
  }
  return d / s;
}

double max_rel(Mat a, Mat b) {
  auto ha = to_host(a), hb = to_host(b);
  double d = 0, s = 1e-300;
  for (std::size_t i = 0; i < ha.size(); ++i) {
    d = std::max(d, std::abs(ha.data()[i] - hb.data()[i]));
    s = std::max(s, std::abs(hb.data()[i]));
  }
  return d / s;
}

} // namespace

TEST_CASE("Tensor-parallel transformer block equals the serial block", "[tp][transformer]") {
  std::size_t const seq = 5, hidden = 8, heads = 4, n = 3;
  telar::Shape const in{seq, hidden};
  for (int tpn : tp_sizes()) {
    telar::ProcessGrid grid(world(), telar::GridShape{0, 1, tpn});
    telar::TensorParallelTraffic traffic;
    telar::TensorParallelContext ctx(grid.tp(), telar::RingAllreduce{}, &traffic);
    int const me = grid.tp().rank();

    auto serial = telar::make_transformer_block<double>(hidden, heads);
    auto tp = telar::make_tensor_parallel_transformer_block<double>(hidden, heads);
    telar::set_tensor_parallel(tp, ctx);
    TELAR_REQUIRE_ALL(tp.output_shape(in) == in);
    serial.build(in);
    tp.build(in);
    serial.initialize(7);
    tp.initialize(7);

    Mat x = random_matrix<double>(n, seq * hidden, 21, 1.5);
    Mat dy = random_matrix<double>(n, seq * hidden, 22);
    Mat ys("ys", n, seq * hidden), yt("yt", n, seq * hidden);
    Mat dxs("dxs", n, seq * hidden), dxt("dxt", n, seq * hidden);
    auto run = [&](auto& model, Mat y, Mat dx) {
      model.parameters([](char const*, auto&, auto& g) { Kokkos::deep_copy(g, 0.0); });
      typename telar::layer_traits<std::decay_t<decltype(model)>>::saved_type saved;
      model.forward(Exec{}, x, y, saved);
      model.backward_input(Exec{}, dy, dx, saved);
      model.backward_weight(Exec{}, dy, saved);
      Exec{}.fence();
    };
    run(serial, ys, dxs);
    traffic.reset();
    run(tp, yt, dxt);
    INFO("tp " << tpn);
    // One allreduce per sub-block in forward (attention, MLP) and one in backward.
    TELAR_REQUIRE_ALL(traffic.allreduces == (tpn > 1 ? 4u : 0u));
    TELAR_REQUIRE_ALL(max_rel(yt, ys) < 1e-12);
    TELAR_REQUIRE_ALL(max_rel(dxt, dxs) < 1e-12);

    auto const gs = grads_of(serial), gt = grads_of(tp);
    bool same_names = gs.size() == gt.size();
    double worst = 0;
    std::string worst_name;
    for (auto const& [name, t] : gt) {
      auto it = gs.find(name);
      same_names = same_names && it != gs.end();
      if (it == gs.end())
        continue;
      double const e = shard_err(t, it->second, me);
      if (e > worst) {
        worst = e;
        worst_name = name;
      }
    }
    INFO("worst gradient " << worst_name << ": " << worst);
    TELAR_REQUIRE_ALL(same_names);
    TELAR_REQUIRE_ALL(worst < 1e-12);
    // Shards really are shards: this rank holds heads / tp heads' rows.
    TELAR_REQUIRE_ALL(gt.at("0.1.query.weight").rows == hidden / std::size_t(tpn));
    TELAR_REQUIRE_ALL(gt.at("1.1.weight").rows == 4 * hidden / std::size_t(tpn));
    TELAR_REQUIRE_ALL(telar::parameter_replicas(tp, "0.1.proj.bias", tpn) == tpn);
    TELAR_REQUIRE_ALL(telar::parameter_replicas(tp, "0.1.proj.weight", tpn) == 1);
  }
}

TEST_CASE("Head-parallel attention refuses heads that do not split over tp", "[tp][transformer]") {
  int const p = world().size();
  telar::HeadParallel<telar::CausalSelfAttention<double>> attn(6, 3);
  std::string msg;
  try {
    attn.set_tensor_parallel(telar::TensorParallelContext(world()));
  } catch (telar::Error const& e) {
    msg = e.what();
  }
  INFO(msg);
  if (3 % p == 0)
    TELAR_REQUIRE_ALL(msg.empty());
  else
    TELAR_REQUIRE_ALL(msg.find("3 heads cannot be split evenly over tp = " + std::to_string(p)) !=
                      std::string::npos);
}

TEST_CASE("ColumnParallel / RowParallel are position-wise over [seq, hidden]",
          "[tp][transformer]") {
  telar::TensorParallelContext ctx(world());
  telar::ColumnParallel<telar::Dense<double>> col(6, 8);
  telar::RowParallel<telar::Dense<double>> row(8, 6);
  col.set_tensor_parallel(ctx);
  row.set_tensor_parallel(ctx);
  telar::Shape const mid = col.output_shape(telar::Shape{4, 6});
  TELAR_REQUIRE_ALL(mid.rank == 2 && mid[0] == 4 && mid[1] == col.shard_size());
  TELAR_REQUIRE_ALL(row.output_shape(mid) == (telar::Shape{4, 6}));
  bool threw = false;
  try {
    (void)col.output_shape(telar::Shape{4, 5});
  } catch (telar::ShapeError const&) {
    threw = true;
  }
  TELAR_REQUIRE_ALL(threw);
}
