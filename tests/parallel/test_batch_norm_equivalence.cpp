// BatchNorm under data and pipeline parallelism: with SyncStats a dp run
// trains to the serial parameters and running statistics (one micro-batch per
// rank, the same global batch); with LocalStats every replica ends a step with
// the same running statistics (the Trainer averages them). Under a pipeline
// (pp = 2, and dp x pp = 2 x 2) each micro-batch is normalised on its own, so
// the serial reference runs the same micro-batches; ZeRO-3 and full
// recomputation leave the statistics alone. Double precision, a small CNN:
// Conv2D -> BatchNorm -> ReLU -> Flatten -> Dense; then a two-level U-Net
// (DenseConcat skips, BatchNorm inside them) under the same layouts; then the
// same U-Net as one DynamicGraph trained as a GraphChain, whose pipeline cuts
// between nodes so the skips cross stage boundaries. Last, micro-batches
// that leave a BatchNorm one value per channel are refused before training,
// the same on every rank.
#include "support.hpp"
#include "unet.hpp"

#include <telar/core/graph_chain.hpp>
#include <telar/core/recompute.hpp>
#include <telar/data/synthetic.hpp>
#include <telar/io/checkpoint.hpp>
#include <telar/io/gather.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/batch_norm.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using T = double;
telar::Shape const image{2, 6, 6};
std::size_t const features = 2 * 6 * 6, classes = 3;

template <class Stats>
using Cnn =
    telar::Sequential<telar::Conv2D<T>, telar::BatchNorm<T, telar::DefaultMemorySpace, Stats>,
                      telar::ReLU<T>, telar::Flatten<T>, telar::Dense<T>>;
template <class Stats>
Cnn<Stats> make_cnn() {
  return Cnn<Stats>(telar::Conv2D<T>(2, 4, 3, 1, 1),
                    telar::BatchNorm<T, telar::DefaultMemorySpace, Stats>(4), {}, {},
                    telar::Dense<T>(4 * 6 * 6, classes));
}
// One strategy type for every layout (compile time): the grid picks dp x pp.
using Full =
    telar::Strategy<telar::DataParallel<>, telar::PipelineParallel<>, telar::TensorParallel<>>;
using Zero3 = telar::Strategy<telar::DataParallel<telar::RingAllreduce, telar::ZeRO<3>>,
                              telar::PipelineParallel<>, telar::TensorParallel<>>;

telar::TrainerOptions options(telar::GridShape grid = {}, char const* schedule = "",
                              int microbatches = 1) {
  telar::TrainerOptions opts;
  opts.seed = 3;
  opts.lr = telar::constant_lr(0.1);
  opts.grid = grid;
  opts.schedule = schedule;
  opts.microbatches = microbatches;
  return opts;
}

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

struct Data {
  telar::Matrix<T> x;
  telar::Labels<> y;
};
Data make_data(std::size_t n, std::size_t width = features) {
  auto ds = telar::make_synthetic(n, width, classes, 7);
  Data d{telar::Matrix<T>("x", n, width), telar::Labels<>("y", n)};
  auto hx = Kokkos::create_mirror_view(d.x);
  auto hy = Kokkos::create_mirror_view(d.y);
  for (std::size_t i = 0; i < n; ++i) {
    hy(i) = ds.y[i];
    for (std::size_t j = 0; j < width; ++j)
      hx(i, j) = T(ds.x[i * width + j]);
  }
  Kokkos::deep_copy(d.x, hx);
  Kokkos::deep_copy(d.y, hy);
  return d;
}

struct Result {
  telar::GatheredModel<T> model; // parameters and buffers, on every rank
  double eval_loss = 0;
  std::vector<T> local_buffers; // this rank's own copy of every buffer
};

// Called on the trainer before its first step (e.g. to load a checkpoint) and
// after its last (before the evaluation).
struct Hooks {
  std::function<void(void*)> before, after; // void*: the Trainer (one type per test)
};

template <class Model, class Strategy = Full>
Result train(MPI_Comm comm, Model model, telar::TrainerOptions const& opts, Data const& data,
             std::size_t batch, int steps, telar::Shape const& in = image,
             Hooks const& hooks = {}) {
  telar::SGD<T> sgd;
  sgd.momentum = T(0.9);
  telar::Trainer<Model, Strategy, telar::SGD<T>> trainer(comm, std::move(model), sgd, opts, in);
  int const dp = trainer.grid_shape().dp, d = trainer.grid_coords().dp;
  std::size_t const local = batch / std::size_t(dp);
  if (hooks.before)
    hooks.before(&trainer);
  for (int s = 0; s < steps; ++s) {
    std::size_t const b = std::size_t(s) * batch + std::size_t(d) * local;
    trainer.step(telar::rows(data.x, b, b + local), telar::rows(data.y, b, b + local));
  }
  if (hooks.after)
    hooks.after(&trainer);
  Result r;
  r.eval_loss = trainer.evaluate(telar::rows(data.x, 0, batch), telar::rows(data.y, 0, batch)).loss;
  r.model = telar::gather_model(trainer, -1);
  trainer.model().buffers([&](char const*, auto& v) {
    auto h = telar::test::to_host(v);
    r.local_buffers.insert(r.local_buffers.end(), h.data(), h.data() + h.extent(0));
  });
  return r;
}

// The rows of `data` in the order a serial run needs to see the micro-batches
// of a dp run: per step, micro-batch m of every dp rank in turn, then m + 1
// (rank d's share of a step is rows [d local, (d + 1) local), cut into
// `microbatches` equal micro-batches).
Data interleave(Data const& data, std::size_t batch, int dp, int microbatches) {
  std::size_t const n = data.x.extent(0), width = data.x.extent(1), local = batch / std::size_t(dp),
                    mb = local / std::size_t(microbatches);
  auto hx = telar::test::to_host(data.x);
  auto hy = telar::test::to_host(data.y);
  Data out{telar::Matrix<T>("x", n, width), telar::Labels<>("y", n)};
  auto ox = Kokkos::create_mirror_view(out.x);
  auto oy = Kokkos::create_mirror_view(out.y);
  std::size_t to = 0;
  for (std::size_t s = 0; s < n / batch; ++s)
    for (int m = 0; m < microbatches; ++m)
      for (int d = 0; d < dp; ++d)
        for (std::size_t j = 0; j < mb; ++j, ++to) {
          std::size_t const from = s * batch + std::size_t(d) * local + std::size_t(m) * mb + j;
          oy(to) = hy(from);
          for (std::size_t f = 0; f < width; ++f)
            ox(to, f) = hx(from, f);
        }
  Kokkos::deep_copy(out.x, ox);
  Kokkos::deep_copy(out.y, oy);
  return out;
}

// Largest relative difference over every gathered tensor (the buffers left
// out unless `buffers`), agreed over ranks.
double worst_difference(telar::GatheredModel<T> const& got, telar::GatheredModel<T> const& want,
                        bool buffers = true) {
  double worst = got.tensors.size() == want.tensors.size() ? 0.0 : 1.0;
  for (auto const& [name, v] : want.tensors) {
    if (!buffers && name.rfind("buffers/", 0) == 0)
      continue;
    auto it = got.tensors.find(name);
    if (it == got.tensors.end() || it->second.size() != v.size()) {
      worst = 1.0;
      continue;
    }
    for (std::size_t i = 0; i < v.size(); ++i)
      worst = std::max(worst, telar::test::rel_diff(it->second[i], v[i], 1e-8));
  }
  double all = worst;
  MPI_Allreduce(&worst, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return all;
}

} // namespace

TEST_CASE("BatchNorm with SyncStats: data parallel equals serial", "[batch_norm][equivalence]") {
  std::size_t const batch = 8;
  int const steps = 3;
  auto const data = make_data(batch * steps);
  Result const want =
      train(MPI_COMM_SELF, make_cnn<telar::SyncStats>(), options(), data, batch, steps);
  Result const got =
      train(MPI_COMM_WORLD, make_cnn<telar::SyncStats>(), options(), data, batch, steps);
  // The running statistics were updated and gathered with the parameters.
  REQUIRE(want.model.tensors.count("buffers/layer1.running_mean") == 1);
  REQUIRE(want.model.tensors.count("buffers/layer1.running_var") == 1);
  CHECK(want.model.tensors.at("buffers/layer1.running_var")[0] != 1.0);
  double const worst = worst_difference(got.model, want.model);
  INFO("dp=" << world_size() << ": worst relative difference " << worst);
  CHECK(worst <= 1e-11);
  CHECK(std::abs(got.eval_loss - want.eval_loss) <= 1e-11 * std::abs(want.eval_loss));
}

TEST_CASE("BatchNorm with LocalStats: running statistics equal on every replica",
          "[batch_norm][equivalence]") {
  std::size_t const batch = 8;
  auto const data = make_data(batch * 2);
  Result const r = train(MPI_COMM_WORLD, make_cnn<telar::LocalStats>(), options(), data, batch, 2);
  REQUIRE(r.local_buffers.size() == 8);
  // Rank 0's copy against every rank's.
  std::vector<T> root = r.local_buffers;
  MPI_Bcast(root.data(), int(root.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD);
  double worst = 0;
  for (std::size_t i = 0; i < root.size(); ++i)
    worst = std::max(worst, std::abs(root[i] - r.local_buffers[i]));
  double all = worst;
  MPI_Allreduce(&worst, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  CHECK(all == 0.0);
  CHECK(r.model.tensors.at("buffers/layer1.running_mean") ==
        std::vector<T>(r.local_buffers.begin(), r.local_buffers.begin() + 4));
}

// pp = 2 over every rank (dp x pp = 2 x 2 at 4 ranks) against one rank that
// sees the same micro-batches: SyncStats normalises micro-batch m over the dp
// group, i.e. the serial micro-batch made of every rank's m-th; LocalStats
// normalises each rank's micro-batches alone, i.e. serial with dp times as many.
TEMPLATE_TEST_CASE("BatchNorm under pipeline parallelism equals serial with the same micro-batches",
                   "[batch_norm][equivalence][pipeline]", telar::LocalStats, telar::SyncStats) {
  int const n = world_size();
  if (n < 2)
    return;
  int const dp = n / 2;
  bool const sync = std::is_same_v<TestType, telar::SyncStats>;
  std::size_t const batch = 16;
  int const steps = 3;
  auto const data = make_data(batch * steps);
  struct Case {
    char const* schedule;
    int microbatches;
  };
  for (Case const c : {Case{"1f1b", 2}, Case{"zb-h1", 4}}) {
    INFO(c.schedule << " m=" << c.microbatches << " dp=" << dp << " " << TestType::name());
    Data const serial_data = interleave(data, batch, dp, c.microbatches);
    Result const want = train(MPI_COMM_SELF, make_cnn<TestType>(),
                              options({1, 1, 1}, "", sync ? c.microbatches : dp * c.microbatches),
                              serial_data, batch, steps);
    Result const got = train(MPI_COMM_WORLD, make_cnn<TestType>(),
                             options({dp, 2, 1}, c.schedule, c.microbatches), data, batch, steps);
    REQUIRE(got.model.tensors.count("buffers/layer1.running_var") == 1);
    // LocalStats with dp > 1: each replica's running statistics follow its own
    // micro-batches and are averaged after the step, which no serial run does
    // (the LocalStats test above checks the replicas agree).
    bool const buffers = sync || dp == 1;
    double const worst = worst_difference(got.model, want.model, buffers);
    INFO("worst relative difference " << worst << (buffers ? "" : " (buffers not compared)"));
    CHECK(worst <= 1e-11);
    if (buffers)
      CHECK(std::abs(got.eval_loss - want.eval_loss) <= 1e-11 * std::abs(want.eval_loss));
  }
}

TEST_CASE("BatchNorm with SyncStats under ZeRO-3 equals serial",
          "[batch_norm][equivalence][zero]") {
  std::size_t const batch = 8;
  int const steps = 3;
  auto const data = make_data(batch * steps);
  Result const want =
      train(MPI_COMM_SELF, make_cnn<telar::SyncStats>(), options(), data, batch, steps);
  // Parameters are gathered for each layer's forward and freed after: the
  // running statistics, never sharded, must come out as the serial ones.
  Result const got = train<Cnn<telar::SyncStats>, Zero3>(
      MPI_COMM_WORLD, make_cnn<telar::SyncStats>(), options(), data, batch, steps);
  double const worst = worst_difference(got.model, want.model);
  INFO("dp=" << world_size() << " ZeRO-3: worst relative difference " << worst);
  CHECK(worst <= 1e-11);
  CHECK(std::abs(got.eval_loss - want.eval_loss) <= 1e-11 * std::abs(want.eval_loss));
}

TEST_CASE("BatchNorm under full recomputation equals the plain model",
          "[batch_norm][equivalence][recompute]") {
  std::size_t const batch = 8;
  int const steps = 3;
  auto const data = make_data(batch * steps);
  // Two micro-batches: both forwards run before the first replay, so a replay
  // must neither update the running statistics nor lose its place.
  auto const opts = options({}, "", 2);
  Result const want = train(MPI_COMM_WORLD, make_cnn<telar::SyncStats>(), opts, data, batch, steps);
  Result const got = train(MPI_COMM_WORLD, telar::recompute_all(make_cnn<telar::SyncStats>()), opts,
                           data, batch, steps);
  REQUIRE(got.model.tensors.count("buffers/layer1.running_mean") == 1);
  double const worst = worst_difference(got.model, want.model);
  INFO("dp=" << world_size() << ": worst relative difference " << worst);
  CHECK(worst == 0.0); // the replay repeats the same arithmetic
  CHECK(got.eval_loss == want.eval_loss);
}

// A two-level U-Net (tests/unet.hpp: DenseConcat skips around MaxPool2D,
// conv-BN-ReLU and a stride-2 ConvTranspose2D, a 1x1 per-pixel head) with
// SyncStats, on [2, 8, 8] inputs: dp over every rank, then the pipelines.
// The pipeline cuts between the model's ten top-level units (stem, the U-Net
// block, reduction, head), so every skip, inside its DenseConcat, stays on
// one stage; the GraphChain tests below cut inside the skips. The serial
// reference sees the same micro-batches as the pipeline.
namespace {
telar::Shape const unet_image{2, 8, 8};
using UNet = telar::test::unet::Net<T, telar::SyncStats>;
UNet make_unet() {
  return telar::test::unet::make_net<T, telar::SyncStats>(2, 8, 2, classes);
}
std::size_t count_buffers(telar::GatheredModel<T> const& m, std::string const& suffix) {
  std::size_t k = 0;
  for (auto const& [name, v] : m.tensors)
    k += name.rfind("buffers/", 0) == 0 && name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  return k;
}
} // namespace

TEST_CASE("A U-Net with SyncStats equals serial under dp, pp, dp x pp and ZeRO-3",
          "[batch_norm][equivalence][unet]") {
  int const n = world_size();
  std::size_t const batch = 16;
  int const steps = 3;
  auto const data = make_data(batch * steps, unet_image.size());
  SECTION("data parallel over every rank") {
    Result const want =
        train(MPI_COMM_SELF, make_unet(), options(), data, batch, steps, unet_image);
    Result const got =
        train(MPI_COMM_WORLD, make_unet(), options(), data, batch, steps, unet_image);
    // Five BatchNorms, the three inside the U-Net block among them.
    REQUIRE(count_buffers(want.model, ".running_var") == 5);
    double const worst = worst_difference(got.model, want.model);
    INFO("U-Net dp=" << n << ": worst relative difference " << worst);
    CHECK(worst <= 1e-11);
    CHECK(std::abs(got.eval_loss - want.eval_loss) <= 1e-11 * std::abs(want.eval_loss));
  }
  SECTION("ZeRO-3 over every rank") {
    Result const want =
        train(MPI_COMM_SELF, make_unet(), options(), data, batch, steps, unet_image);
    Result const got =
        train<UNet, Zero3>(MPI_COMM_WORLD, make_unet(), options(), data, batch, steps, unet_image);
    double const worst = worst_difference(got.model, want.model);
    INFO("U-Net ZeRO-3 dp=" << n << ": worst relative difference " << worst);
    CHECK(worst <= 1e-11);
    CHECK(std::abs(got.eval_loss - want.eval_loss) <= 1e-11 * std::abs(want.eval_loss));
  }
  SECTION("pipelines: pp = 2 (dp x pp = 2 x 2 at 4 ranks), and pp = 4") {
    if (n < 2)
      return;
    struct Case {
      int pp;
      char const* schedule;
      int microbatches;
    };
    std::vector<Case> cases{{2, "1f1b", 2}, {2, "zb-h1", 4}};
    if (n == 4)
      cases.push_back({4, "1f1b", 4});
    for (Case const c : cases) {
      int const dp = n / c.pp;
      INFO("U-Net " << c.schedule << " m=" << c.microbatches << " dp=" << dp << " pp=" << c.pp);
      Result const want =
          train(MPI_COMM_SELF, make_unet(), options({1, 1, 1}, "", c.microbatches),
                interleave(data, batch, dp, c.microbatches), batch, steps, unet_image);
      Result const got =
          train(MPI_COMM_WORLD, make_unet(), options({dp, c.pp, 1}, c.schedule, c.microbatches),
                data, batch, steps, unet_image);
      REQUIRE(count_buffers(got.model, ".running_var") == 5);
      double const worst = worst_difference(got.model, want.model);
      INFO("worst relative difference " << worst);
      CHECK(worst <= 1e-11);
      CHECK(std::abs(got.eval_loss - want.eval_loss) <= 1e-11 * std::abs(want.eval_loss));
    }
  }
}

// The same U-Net as one DynamicGraph (tests/unet.hpp, make_graph), trained as
// a GraphChain: one unit per node, so pipeline boundaries fall between nodes
// and every boundary inside the U-Net sends skips with the activation (the
// live set). The reference is the graph as the one layer of a Sequential,
// serial: the same parameter names and starting values.
namespace {
using GLayer = telar::test::unet::GraphLayer<T, telar::SyncStats>;
using GraphNet = telar::Sequential<telar::DynamicGraph<GLayer>>;
using Chain = telar::GraphChain<GLayer>;
using ChainTrainer = telar::Trainer<Chain, Full, telar::SGD<T>>;
telar::DynamicGraph<GLayer> make_unet_graph() {
  return telar::test::unet::make_graph<T, telar::SyncStats>(2, 8, 2, classes);
}
GraphNet make_graph_net() {
  return GraphNet(make_unet_graph());
}
Chain make_chain() {
  return Chain(make_unet_graph());
}

// Rows [lo, hi) of `d`, copied.
Data slice(Data const& d, std::size_t lo, std::size_t hi) {
  Data out{telar::Matrix<T>("x", hi - lo, d.x.extent(1)), telar::Labels<>("y", hi - lo)};
  Kokkos::deep_copy(out.x, telar::rows(d.x, lo, hi));
  Kokkos::deep_copy(out.y, telar::rows(d.y, lo, hi));
  return out;
}

// Tensors crossing each interior stage boundary of `t`.
std::vector<std::vector<std::string>> crossing(ChainTrainer& t) {
  std::vector<std::vector<std::string>> out;
  auto const& b = t.stage_boundaries();
  for (std::size_t s = 1; s + 1 < b.size(); ++s)
    out.push_back(t.model().live_tensors(b[s]));
  return out;
}
} // namespace

TEST_CASE("A U-Net as one DynamicGraph equals serial under dp, ZeRO-3 and pipelines cut "
          "inside the graph",
          "[batch_norm][equivalence][unet][graph_pipeline]") {
  int const n = world_size();
  std::size_t const batch = 16;
  int const steps = 2;
  auto const data = make_data(batch * steps, unet_image.size());
  auto const check = [&](Result const& got, Result const& want) {
    REQUIRE(count_buffers(got.model, ".running_var") == 5);
    REQUIRE(got.model.tensors.count("layer0.stem_conv.weight") == 1);
    double const worst = worst_difference(got.model, want.model);
    INFO("worst relative difference " << worst);
    CHECK(worst <= 1e-11);
    CHECK(std::abs(got.eval_loss - want.eval_loss) <= 1e-11 * std::abs(want.eval_loss));
  };
  SECTION("data parallel over every rank") {
    INFO("GraphChain dp=" << n);
    check(train(MPI_COMM_WORLD, make_chain(), options(), data, batch, steps, unet_image),
          train(MPI_COMM_SELF, make_graph_net(), options(), data, batch, steps, unet_image));
  }
  SECTION("ZeRO-3 over every rank") {
    INFO("GraphChain ZeRO-3 dp=" << n);
    check(train<Chain, Zero3>(MPI_COMM_WORLD, make_chain(), options(), data, batch, steps,
                              unet_image),
          train(MPI_COMM_SELF, make_graph_net(), options(), data, batch, steps, unet_image));
  }
  SECTION("pipelines: pp = 2 (dp x pp = 2 x 2 at 4 ranks), 1f1b and zb-h1; pp = 4") {
    if (n < 2)
      return;
    struct Case {
      int pp;
      char const* schedule;
      int microbatches;
    };
    std::vector<Case> cases{{2, "1f1b", 2}, {2, "zb-h1", 4}};
    if (n == 4)
      cases.push_back({4, "1f1b", 4});
    for (Case const c : cases) {
      int const dp = n / c.pp;
      INFO("GraphChain " << c.schedule << " m=" << c.microbatches << " dp=" << dp
                         << " pp=" << c.pp);
      std::vector<std::vector<std::string>> cut;
      Hooks hooks;
      hooks.before = [&](void* t) { cut = crossing(*static_cast<ChainTrainer*>(t)); };
      Result const got =
          train(MPI_COMM_WORLD, make_chain(), options({dp, c.pp, 1}, c.schedule, c.microbatches),
                data, batch, steps, unet_image, hooks);
      // The boundaries the cost estimate chose cut through the U-Net: a skip
      // crosses the first with the activation.
      REQUIRE(cut.size() == std::size_t(c.pp - 1));
      std::string names;
      for (auto const& boundary : cut) {
        for (auto const& name : boundary)
          names += name + " ";
        names += "| ";
      }
      INFO("crossing the boundaries: " << names);
      CHECK(cut[0].size() > 1);
      check(got, train(MPI_COMM_SELF, make_graph_net(), options({1, 1, 1}, "", c.microbatches),
                       interleave(data, batch, dp, c.microbatches), batch, steps, unet_image));
    }
  }
}

// A checkpoint written by a GraphChain at pp = 2 loads at pp = 1 (and the
// other way): the names do not depend on the split. Trained on: one step
// before the checkpoint, one after, against two uninterrupted steps.
TEST_CASE("A GraphChain checkpoint moves between pipeline degrees",
          "[graph_pipeline][checkpoint]") {
  int const n = world_size();
  if (n < 2)
    return;
  std::size_t const batch = 8;
  auto const data = make_data(batch * 2, unet_image.size());
  std::string const dir = "graph_chain_ckpt_" + std::to_string(n);
  struct Way {
    int save_pp, load_pp;
  };
  for (Way const w : {Way{2, 1}, Way{1, 2}}) {
    INFO("saved at pp=" << w.save_pp << ", loaded at pp=" << w.load_pp);
    auto const grid = [&](int pp) { return telar::GridShape{n / pp, pp, 1}; };
    // One micro-batch: SyncStats then normalises over the whole batch at
    // either degree, so the steps agree.
    Result const want =
        train(MPI_COMM_WORLD, make_chain(), options(grid(w.load_pp)), data, batch, 2, unet_image);
    std::string path;
    Hooks save;
    save.after = [&](void* t) {
      path = telar::save_checkpoint(*static_cast<ChainTrainer*>(t), dir);
    };
    train(MPI_COMM_WORLD, make_chain(), options(grid(w.save_pp)), slice(data, 0, batch), batch, 1,
          unet_image, save);
    Hooks load;
    load.before = [&](void* t) { telar::load_checkpoint(*static_cast<ChainTrainer*>(t), path); };
    Result const got = train(MPI_COMM_WORLD, make_chain(), options(grid(w.load_pp)),
                             slice(data, batch, 2 * batch), batch, 1, unet_image, load);
    double const worst = worst_difference(got.model, want.model);
    INFO("worst relative difference " << worst);
    CHECK(worst <= 1e-11);
    MPI_Barrier(MPI_COMM_WORLD);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0)
      std::remove(path.c_str());
  }
}

// BatchNorm on one value per channel (PyTorch refuses it too) is refused
// before training: by the constructor when TrainerOptions::batch_size gives
// the micro-batches, else by the step before any communication; the same
// message on every rank (but for its rank), naming the node and the sizes.
// SyncStats counts the values of every data-parallel rank.
namespace {
// The refusal's text, or "" if make() does not throw.
template <class F>
std::string refusal(F&& make) {
  try {
    make();
  } catch (telar::ShapeError const& e) {
    return e.what();
  }
  return {};
}
// True when every rank's message is the same once its own "rank R: " is cut.
bool same_on_every_rank(std::string msg) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string const mine = "rank " + std::to_string(rank) + ": ";
  for (auto at = msg.find(mine); at != std::string::npos; at = msg.find(mine))
    msg.erase(at, mine.size());
  long long const h = (long long)(std::hash<std::string>{}(msg) >> 2), in[2] = {h, -h};
  long long out[2] = {0, 0};
  MPI_Allreduce(in, out, 2, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return out[0] == -out[1];
}
telar::Shape const tiny{2, 4, 4}; // the U-Net's bottom level is 1 x 1
} // namespace

TEST_CASE("BatchNorm on one value per channel is refused before training on every rank",
          "[batch_norm][refusal]") {
  int const n = world_size();
  auto const tiny_unet = [] {
    return Chain(telar::test::unet::make_graph<T, telar::SyncStats>(2, 4, 2, classes));
  };
  // A pipeline over every rank (dp = 1): micro-batches of 1 sample leave the
  // bottom BatchNorm one value per channel, on a stage only one rank runs.
  auto opts = options({1, n, 1}, "1f1b", 2);
  opts.batch_size = 2;
  std::string const built =
      refusal([&] { ChainTrainer(MPI_COMM_WORLD, tiny_unet(), telar::SGD<T>{}, opts, tiny); });
  INFO(built);
  CHECK_THAT(built,
             Catch::Matchers::StartsWith(n > 1 ? "telar::Trainer: rank " : "telar::Trainer: "));
  CHECK_THAT(built, Catch::Matchers::ContainsSubstring(
                        "micro-batches of 1 sample(s): telar::DynamicGraph: node 'l2_down_bn' "
                        "(BatchNorm) cannot take input 'l2_down_c' [4, 1, 1]: telar::BatchNorm(4): "
                        "expected more than 1 value per channel when training, got 1 "
                        "(micro-batches of 1 sample(s) per rank x spatial size 1 x 1 "
                        "data-parallel rank(s), input [4, 1, 1], SyncStats)"));
  CHECK(same_on_every_rank(built));
  // Without batch_size the step refuses the same, before any collective.
  opts.batch_size = 0;
  auto const data = make_data(2, tiny.size());
  std::string const stepped = refusal([&] {
    ChainTrainer t(MPI_COMM_WORLD, tiny_unet(), telar::SGD<T>{}, opts, tiny);
    t.step(data.x, data.y);
  });
  INFO(stepped);
  CHECK_THAT(stepped, Catch::Matchers::StartsWith("telar::Trainer::step: ") &&
                          Catch::Matchers::ContainsSubstring("node 'l2_down_bn' (BatchNorm)"));
  CHECK(same_on_every_rank(stepped));
  // One sample per rank under dp = n: SyncStats normalises over n values
  // (accepted, and a step trains, when n > 1); LocalStats over 1 (refused).
  auto dp = options({n, 1, 1});
  dp.batch_size = std::size_t(n);
  std::string const sync = refusal([&] {
    ChainTrainer t(MPI_COMM_WORLD, tiny_unet(), telar::SGD<T>{}, dp, tiny);
    t.step(telar::rows(data.x, 0, 1), telar::rows(data.y, 0, 1));
  });
  INFO(sync);
  CHECK(sync.empty() == (n > 1));
  auto const local_cnn = [] {
    return Cnn<telar::LocalStats>(
        telar::Conv2D<T>(2, 4, 3, 1, 1),
        telar::BatchNorm<T, telar::DefaultMemorySpace, telar::LocalStats>(4), {}, {},
        telar::Dense<T>(4, classes));
  };
  using LocalTrainer = telar::Trainer<Cnn<telar::LocalStats>, Full, telar::SGD<T>>;
  std::string const local = refusal([&] {
    LocalTrainer(MPI_COMM_WORLD, local_cnn(), telar::SGD<T>{}, dp, telar::Shape{2, 1, 1});
  });
  INFO(local);
  CHECK_THAT(local, Catch::Matchers::ContainsSubstring(
                        "telar::Sequential: layer 1 (BatchNorm) cannot take input [4, 1, 1] from "
                        "layer 0 (Conv2D): telar::BatchNorm(4): expected more than 1 value per "
                        "channel when training, got 1"));
  CHECK(same_on_every_rank(local));
  // Spatial values count: 1 sample of [4, 6, 6] gives 36 per channel.
  CHECK(refusal([&] {
          LocalTrainer(MPI_COMM_WORLD, make_cnn<telar::LocalStats>(), telar::SGD<T>{}, dp, image);
        }).empty());
}
