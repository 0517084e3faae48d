// The memory plan against the meter: for every layout of the world and every
// sharding policy, the measured per-category peaks after two steps are
// within 5% of telar::plan_memory (small categories: within an absolute
// slack, see kSlack), for an MLP and for models holding every built-in
// block, nested. Every built-in layer and block alone: its saved state and
// workspace as forward and backward allocate them, to the byte, and a plan
// without warnings. And a layout over the budget is refused before any
// allocation, with the same message on every rank.
#include "support.hpp"
#include "unet.hpp"

#include <telar/core/dynamic_graph.hpp>
#include <telar/core/dynamic_sequential.hpp>
#include <telar/core/graph_chain.hpp>
#include <telar/core/recompute.hpp>
#include <telar/core/residual.hpp>
#include <telar/data/synthetic.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/attention.hpp>
#include <telar/layers/batch_norm.hpp>
#include <telar/layers/bias.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/conv_transpose.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/dropout.hpp>
#include <telar/layers/embedding.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/layers/multiplier.hpp>
#include <telar/layers/normalization.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/layers/softmax.hpp>
#include <telar/layers/transformer.hpp>
#include <telar/layers/upsample.hpp>
#include <telar/optim/adam.hpp>
#include <telar/parallel/memory_plan.hpp>
#include <telar/parallel/run_layout.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/parallel/tensor_parallel_attention.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using T = float;
// Sizes are multiples of 16 floats, so the store's per-tensor padding is 0
// and parameters, gradients and optimizer state are predicted exactly.
using Mlp = telar::Sequential<telar::ColumnParallel<telar::Dense<T>>, telar::ReLU<T>,
                              telar::RowParallel<telar::Dense<T>>, telar::GELU<T>, telar::Dense<T>>;
Mlp make_mlp() {
  return Mlp(telar::ColumnParallel<telar::Dense<T>>(64, 128), {},
             telar::RowParallel<telar::Dense<T>>(128, 64), {}, telar::Dense<T>(64, 16));
}

// The loss's per-row buffers and Kokkos' own reduction scratch are a few
// hundred bytes the plan only estimates; 4 KiB is far below every category
// that matters here (parameters alone are ~45 KiB).
constexpr std::size_t kSlack = 4096;

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

struct Layout {
  int dp, pp, tp;
  std::string schedule;
};

// Every factorisation of n, each pipeline one with every schedule that fits
// 5 layers.
std::vector<Layout> layouts(int n) {
  std::vector<Layout> out;
  for (int pp = 1; pp <= n; ++pp)
    for (int tp = 1; tp <= n / pp; ++tp) {
      if (n % (pp * tp) != 0)
        continue;
      int const dp = n / (pp * tp);
      if (pp == 1) {
        out.push_back({dp, pp, tp, ""});
        continue;
      }
      for (char const* s : {"gpipe", "1f1b", "zb-h1", "interleaved"})
        if (std::string(s) != "interleaved" || pp * 2 <= 5)
          out.push_back({dp, pp, tp, s});
    }
  return out;
}

template <class Sharding, class Precision = telar::Precision<float, float>>
using Strat = telar::Strategy<telar::DataParallel<telar::RingAllreduce, Sharding>,
                              telar::PipelineParallel<>, telar::TensorParallel<>, Precision>;

// Measured vs planned on this rank; returns what is off ("" if all fit).
std::string compare(telar::MemoryBytes const& got, telar::MemoryBytes const& want) {
  std::string off;
  for (int i = 0; i < telar::MemoryBytes::count; ++i) {
    auto const c = telar::MemoryCategory(i);
    double const g = double(got[c]), w = double(want[c]);
    double const tol = std::max(0.05 * w, double(kSlack));
    if (g > w + tol || g < w - tol)
      off += std::string(telar::MemoryBytes::key(c)) + " measured " + std::to_string(got[c]) +
             " planned " + std::to_string(want[c]) + "; ";
  }
  return off;
}

using RecomputedMlp = telar::RecomputeAll<Mlp>;
RecomputedMlp make_recomputed() {
  return telar::recompute_all(make_mlp());
}

// Every convolutional, pooling, normalisation and residual block, nested, a
// two-level U-Net block among them (tests/unet.hpp: DenseConcat skips around
// MaxPool2D, conv-BatchNorm-ReLU and ConvTranspose2D): [4, 4, 4] -> 16 classes.
using Im2col = telar::Conv2D<T, telar::DefaultMemorySpace, telar::AutoGemm, telar::Im2colConv>;
using ConvBlock = telar::Residual<telar::Conv2D<T>, telar::ReLU<T>>;
using ProjectedConv =
    telar::ProjectedResidual<Im2col, Im2col, telar::GroupNorm<T>, telar::Sigmoid<T>>;
using DenseBlock = telar::Residual<telar::Dense<T>, telar::GELU<T>, telar::Dropout<T>>;
using Inner = telar::Residual<telar::LayerNorm<T>, telar::Dense<T>, telar::Tanh<T>>;
using Outer = telar::Residual<Inner, telar::RMSNorm<T>>;
using DynBody = std::variant<telar::Dense<T>, telar::ReLU<T>>;
using DynBlock = telar::DynamicResidual<DynBody>;
using UNetBlock = telar::test::unet::Level1<T, telar::LocalStats>;
using ConvZoo =
    telar::Sequential<ConvBlock, UNetBlock, ProjectedConv, telar::MaxPool2D<T>, telar::Flatten<T>,
                      telar::Recompute<DenseBlock>, Outer, DynBlock, telar::Dense<T>>;

ConvBlock conv_block() {
  return ConvBlock(telar::Conv2D<T>(4, 4, 3, 1, 1), {});
}
ProjectedConv projected_conv() {
  return ProjectedConv(Im2col(8, 8, 1), Im2col(8, 8, 3, 1, 1), telar::GroupNorm<T>(2, 8), {});
}
DenseBlock dense_block(std::size_t width) {
  return DenseBlock(telar::Dense<T>(width, width), {}, telar::Dropout<T>(0.1));
}
// A graph whose nodes keep workspaces (im2col columns): its workspace_bytes
// counts them (it counted only recomputed outputs before).
using Im2colGraph = telar::DynamicGraph<std::variant<Im2col, telar::ReLU<T>>>;
Im2colGraph im2col_graph() {
  Im2colGraph g("x");
  g.add("conv1", Im2col(2, 3, 3, 1, 1), "x", "a");
  g.add("relu", telar::ReLU<T>{}, "a", "b");
  g.add("conv2", Im2col(2, 3, 1), "x", "c");
  g.add_add("sum", {"b", "c"}, "y");
  g.set_output("y");
  return g;
}
Outer nested_block(std::size_t width) {
  return Outer(Inner(telar::LayerNorm<T>(width), telar::Dense<T>(width, width), {}),
               telar::RMSNorm<T>(width));
}
DynBlock dynamic_block(std::size_t width) {
  telar::DynamicSequential<DynBody> body;
  body.push_back(telar::Dense<T>(width, width));
  body.push_back(telar::ReLU<T>{});
  return DynBlock(std::move(body));
}
ConvZoo make_conv_zoo() {
  return ConvZoo(conv_block(), telar::test::unet::make_block<T, telar::LocalStats>(4),
                 projected_conv(), telar::MaxPool2D<T>(2), {},
                 telar::Recompute<DenseBlock>(dense_block(32)), nested_block(32), dynamic_block(32),
                 telar::Dense<T>(32, 16));
}

// Embeddings and both transformer blocks: 16 token ids -> 16 classes.
using NormDrop = telar::Residual<telar::RMSNorm<T>, telar::Dropout<T>>;
using TransformerZoo =
    telar::Sequential<telar::Embedding<T>, telar::PositionalEmbedding<T>,
                      telar::TransformerBlock<T>, telar::TensorParallelTransformerBlock<T>,
                      NormDrop, telar::LayerNorm<T>, telar::Flatten<T>, telar::Dense<T>>;
TransformerZoo make_transformer_zoo() {
  return TransformerZoo(telar::Embedding<T>(8, 16), telar::PositionalEmbedding<T>(16, 16),
                        telar::make_transformer_block<T>(16, 4),
                        telar::make_tensor_parallel_transformer_block<T>(16, 4),
                        NormDrop(telar::RMSNorm<T>(16), telar::Dropout<T>(0.1)),
                        telar::LayerNorm<T>(16), {}, telar::Dense<T>(256, 16));
}

// The batch: synthetic features, or token ids in [0, 8) for an embedding.
void make_batch(telar::Shape const& in, bool ids, telar::Matrix<T>& x, telar::Labels<>& y) {
  std::size_t const batch = x.extent(0), features = in.size();
  auto const ds = telar::make_synthetic(batch, 64, 16, 5);
  x = telar::Matrix<T>("x", batch, features);
  auto hx = Kokkos::create_mirror_view(x);
  auto hy = Kokkos::create_mirror_view(y);
  for (std::size_t i = 0; i < batch; ++i) {
    hy(i) = ds.y[i];
    for (std::size_t j = 0; j < features; ++j)
      hx(i, j) = ids ? T((i + j) % 8) : T(ds.x[i * 64 + j % 64]);
  }
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(y, hy);
}

// `keep`, if given, picks the layouts to check.
template <class Sharding, class Model = Mlp, class Precision = telar::Precision<float, float>>
void check_layouts(bool shared_memory, Model (*make)() = make_mlp,
                   telar::Shape const& in = telar::Shape(64), bool ids = false,
                   bool (*keep)(Layout const&) = nullptr) {
  int const n = world_size();
  std::size_t const batch = 32;
  telar::Matrix<T> x("x", batch, 1);
  telar::Labels<> y("y", batch);
  make_batch(in, ids, x, y);
  for (Layout const& l : layouts(n)) {
    if (keep && !keep(l))
      continue;
    telar::TrainerOptions opts;
    opts.grid = {l.dp, l.pp, l.tp};
    opts.schedule = l.schedule;
    opts.microbatches = 4;
    opts.batch_size = batch;
    opts.shared_memory = shared_memory;
    opts.bucket_bytes = 16 << 10;
    std::string off;
    if (std::getenv("TELAR_TEST_VERBOSE"))
      std::fprintf(stderr, "layout dp=%d pp=%d tp=%d %s\n", l.dp, l.pp, l.tp, l.schedule.c_str());
    {
      telar::Trainer<Model, Strat<Sharding, Precision>, telar::AdamW<T>> trainer(
          MPI_COMM_WORLD, make(), telar::AdamW<T>{}, opts, in);
      std::size_t const local = batch / std::size_t(l.dp), b = trainer.grid_coords().dp * local;
      for (int s = 0; s < 2; ++s)
        trainer.step(telar::rows(x, b, b + local), telar::rows(y, b, b + local));
      CHECK(trainer.memory_plan().warnings.empty());
      off = compare(trainer.memory(), trainer.memory_plan().bytes);
      if (std::getenv("TELAR_TEST_VERBOSE"))
        std::fprintf(stderr, "  rank %d measured %s\n  rank %d planned  %s\n", trainer.rank(),
                     trainer.memory().json().c_str(), trainer.rank(),
                     trainer.memory_plan().bytes.json().c_str());
      INFO("rank " << trainer.rank() << " " << trainer.memory_plan().layout() << " " << l.schedule
                   << ": measured " << trainer.memory().str() << " | planned "
                   << trainer.memory_plan().bytes.str() << " | " << off);
      CHECK(off.empty());
    }
    int bad = off.empty() ? 0 : 1, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    REQUIRE(any == 0); // stop every rank together at the first layout off
  }
}

} // namespace

TEST_CASE("The memory plan matches the meter: NoSharding", "[memory]") {
  check_layouts<telar::NoSharding>(true);
}
TEST_CASE("The memory plan matches the meter: ZeRO<1> distributed", "[memory]") {
  check_layouts<telar::ZeRO<1>>(false);
}
TEST_CASE("The memory plan matches the meter: ZeRO<1> shared memory", "[memory]") {
  check_layouts<telar::ZeRO<1>>(true);
}
TEST_CASE("The memory plan matches the meter: ZeRO<1> shared per node", "[memory]") {
  // Nodes of 2 consecutive ranks: at 4 ranks, dp=4 keeps a parameter window
  // per node and the chunks it sends across; dp=2 x pp=2 and dp=2 x tp=2
  // (one dp rank per node) use messages.
  struct FakeNodes {
    FakeNodes() { setenv("TELAR_RANKS_PER_NODE", "2", 1); }
    ~FakeNodes() { unsetenv("TELAR_RANKS_PER_NODE"); }
  } const nodes;
  check_layouts<telar::ZeRO<1>>(true);
}
TEST_CASE("The memory plan matches the meter: ZeRO<2>", "[memory]") {
  check_layouts<telar::ZeRO<2>>(true);
}
TEST_CASE("The memory plan matches the meter: ZeRO<3>, gathered per micro-batch", "[memory]") {
  check_layouts<telar::ZeRO<3>>(true);
}
TEST_CASE("The memory plan matches the meter: ZeRO<3>, gathered per step", "[memory]") {
  check_layouts<telar::ZeRO<3, telar::ZeRO3Gather::PerStep>>(true);
}

// Recompute keeps one rebuilt state per layer (more between the split
// backward halves of zero-bubble schedules) instead of saved state per slot.
TEST_CASE("The memory plan matches the meter: recompute_all", "[memory]") {
  check_layouts<telar::NoSharding>(true, make_recomputed);
}

TEST_CASE("The plan allocates nothing", "[memory]") {
  telar::MemoryMeterInstall install;
  auto& meter = telar::MemoryMeter::instance();
  telar::MemoryMeter::Scope scope(telar::MemoryCategory::workspace);
  std::uint64_t const before = meter.allocations();
  telar::TrainerOptions opts;
  opts.batch_size = 64;
  auto plan =
      telar::plan_memory<Mlp, Strat<telar::ZeRO<1>>, telar::AdamW<T>>(make_mlp(), opts, 64, 4, 1);
  CHECK(meter.allocations() == before);
  CHECK(plan.bytes[telar::MemoryCategory::optimizer_state] > 0);
  telar::Vector<T> probe("telar::probe", 8); // the meter does see allocations
  CHECK(meter.allocations() == before + 1);
}

TEST_CASE("A layout over the budget is refused before any allocation", "[memory]") {
  auto& meter = telar::MemoryMeter::instance();
  std::uint64_t const before = meter.allocations();
  telar::TrainerOptions opts;
  opts.grid = {0, 1, 1};
  opts.batch_size = 32;
  opts.memory_budget = 1024; // far too small for anything
  std::string what;
  try {
    telar::Trainer<Mlp, Strat<telar::NoSharding>, telar::AdamW<T>> trainer(
        MPI_COMM_WORLD, make_mlp(), telar::AdamW<T>{}, opts, 64);
  } catch (telar::MemoryError const& e) {
    what = e.what();
  }
  INFO(what);
  CHECK(meter.allocations() == before);
  CHECK(what.find("over the budget of 1 KiB") != std::string::npos);
  CHECK(what.find("no layout of " + std::to_string(world_size()) + " ranks fits") !=
        std::string::npos);
  unsigned long long const h = std::hash<std::string>{}(what), lo = h, hi = h;
  unsigned long long mn = 0, mx = 0;
  MPI_Allreduce(&lo, &mn, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&hi, &mx, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  CHECK(mn == mx); // the same message on every rank
}

namespace {

// telar::make_run_layout is the layout the Trainer runs: on every rank of
// every layout of this world, the same degrees, coordinates, schedule, stage
// bounds, owned layers and optimizer shard as the Trainer reports.
template <class Sharding>
void check_run_layouts() {
  int const n = world_size();
  for (Layout const& l : layouts(n)) {
    telar::TrainerOptions opts;
    opts.grid = {l.dp, l.pp, l.tp};
    opts.schedule = l.schedule;
    opts.microbatches = 4;
    opts.bucket_bytes = 16 << 10;
    telar::Trainer<Mlp, Strat<Sharding>, telar::AdamW<T>> trainer(MPI_COMM_WORLD, make_mlp(),
                                                                  telar::AdamW<T>{}, opts, 64);
    telar::RunLayout const got = telar::make_run_layout<Strat<Sharding>>(
        make_mlp(), opts, telar::Shape(64), n, trainer.rank());
    INFO("rank " << trainer.rank() << " " << trainer.layout() << " " << l.schedule);
    CHECK(got.grid.dp == trainer.grid_shape().dp);
    CHECK(got.grid.pp == trainer.grid_shape().pp);
    CHECK(got.grid.tp == trainer.grid_shape().tp);
    CHECK(got.coords.dp == trainer.grid_coords().dp);
    CHECK(got.coords.pp == trainer.grid_coords().pp);
    CHECK(got.coords.tp == trainer.grid_coords().tp);
    CHECK(got.schedule.name == trainer.pipeline_schedule().name);
    CHECK(got.schedule.ranks == trainer.pipeline_schedule().ranks);
    CHECK(got.stage_bounds == trainer.stage_boundaries());
    CHECK(got.owned == trainer.run_layout().owned);
    CHECK(got.shard_range() == trainer.optimizer_shard());
    CHECK(got.padded_elements == trainer.parameter_store().size());
    if (std::is_same_v<Sharding, telar::NoSharding> && l.dp > 1)
      CHECK(got.bucket_groups.size() == trainer.bucket_count());
    // Every layer this rank runs holds its parameters here, and no other.
    std::vector<std::size_t> held;
    for (auto const& e : trainer.parameter_store().entries())
      if (held.empty() || held.back() != e.layer)
        held.push_back(e.layer);
    for (std::size_t k : held)
      CHECK(got.owned[k]);
  }
}

} // namespace

TEST_CASE("make_run_layout is the layout the Trainer runs", "[memory][layout]") {
  check_run_layouts<telar::NoSharding>();
  check_run_layouts<telar::ZeRO<1>>();
  check_run_layouts<telar::ZeRO<3>>();
}

// Pure (no communicator): dp2 x pp2 and pp2 x tp2 of four ranks, and an
// interleaved pp2; the invariants every layout keeps.
TEST_CASE("make_run_layout: owned layers partition the model over the pipeline", "[layout]") {
  using S = Strat<telar::ZeRO<1>>;
  struct Case {
    telar::GridShape grid;
    std::string schedule;
  };
  for (Case const& c : {Case{{2, 2, 1}, "1f1b"}, Case{{1, 2, 2}, "gpipe"},
                        Case{{2, 2, 1}, "interleaved"}, Case{{4, 1, 1}, ""}}) {
    telar::LayoutOptions opts;
    opts.grid = c.grid;
    opts.schedule = c.schedule;
    opts.microbatches = 4;
    opts.bucket_bytes = 16 << 10;
    std::vector<telar::RunLayout> all;
    for (int r = 0; r < 4; ++r)
      all.push_back(telar::make_run_layout<S>(make_mlp(), opts, telar::Shape(64), 4, r));
    INFO(telar::ProcessGrid::describe(c.grid) << " " << c.schedule);
    std::vector<int> seen(4, 0);
    for (telar::RunLayout const& l : all) {
      CHECK(l.world_size() == 4);
      CHECK(l.stage_bounds == all[0].stage_bounds);
      CHECK(l.stage_bounds.size() == std::size_t(l.schedule.virtual_stages()) + 1);
      ++seen[std::size_t((l.coords.pp * c.grid.dp + l.coords.dp) * c.grid.tp + l.coords.tp)];
      // Each layer on exactly one rank of this rank's pipeline.
      std::vector<int> runs(5, 0);
      for (telar::RunLayout const& o : all)
        if (o.coords.dp == l.coords.dp && o.coords.tp == l.coords.tp)
          for (std::size_t k : o.owned_layers())
            ++runs[k];
      CHECK(runs == std::vector<int>(5, 1));
      std::size_t sum = 0;
      for (std::size_t g : l.bucket_groups)
        sum += g;
      CHECK(sum == l.parameter_elements);
      // ZeRO<1>: the data-parallel ranks' shards tile the padded store.
      auto const [b, e] = l.shard_range();
      CHECK(e - b == l.padded_elements / std::size_t(c.grid.dp));
      CHECK(b == std::size_t(l.coords.dp) * (e - b));
      CHECK(l.zero_stage == (c.grid.dp > 1 ? 1 : 0));
      CHECK(l.warnings.empty());
    }
    CHECK(seen == std::vector<int>(4, 1)); // coordinates: every grid point once
  }
}

// A layout the strategy cannot run is refused by make_run_layout as by the
// Trainer, naming the caller.
TEST_CASE("make_run_layout refuses what the Trainer refuses", "[layout]") {
  using S = telar::Strategy<telar::DataParallel<>>;
  telar::LayoutOptions opts;
  opts.grid = {1, 2, 1};
  std::string what;
  try {
    (void)telar::make_run_layout<S>(make_mlp(), opts, telar::Shape(64), 2, 0);
  } catch (telar::Error const& e) {
    what = e.what();
  }
  CHECK(what.find("telar::make_run_layout: pp=2 but the strategy") != std::string::npos);
  opts.grid = {3, 1, 1};
  CHECK_THROWS_AS(telar::make_run_layout<S>(make_mlp(), opts, telar::Shape(64), 2, 0),
                  telar::GridError);
  opts.grid = {2, 1, 1};
  CHECK_THROWS_AS(telar::make_run_layout<S>(make_mlp(), opts, telar::Shape(64), 2, 2),
                  telar::Error);
}

TEST_CASE("The memory plan matches the meter: every built-in block nested", "[memory]") {
  check_layouts<telar::NoSharding>(true, make_conv_zoo, telar::Shape{4, 4, 4});
  check_layouts<telar::NoSharding>(true, make_transformer_zoo, telar::Shape(16), true);
}
// The same in bf16: compact copies inside the blocks (the U-Net's
// transposed convolutions' inputs among them), bf16 weights.
TEST_CASE("The memory plan matches the meter: every built-in block nested, bf16",
          "[memory][bf16]") {
  if (!telar::bf16_available())
    SKIP("no bf16 instructions here");
  using Bf16 = telar::Precision<telar::bf16, float>;
  check_layouts<telar::NoSharding, ConvZoo, Bf16>(true, make_conv_zoo, telar::Shape{4, 4, 4});
}

namespace {
// The U-Net as one DynamicGraph trained as a GraphChain (tests/unet.hpp): its
// pipeline boundaries send live sets holding skips, and its units keep
// unpacked copies; both planned. Its layouts without tensor parallelism (no
// layer of it is tensor-parallel).
using GraphUNet = telar::GraphChain<telar::test::unet::GraphLayer<T, telar::LocalStats>>;
GraphUNet make_graph_unet() {
  return GraphUNet(telar::test::unet::make_graph<T, telar::LocalStats>(2, 8, 2, 16));
}
} // namespace

TEST_CASE("The memory plan matches the meter: a U-Net graph pipelined between its nodes",
          "[memory][graph_pipeline]") {
  check_layouts<telar::NoSharding>(true, make_graph_unet, telar::Shape{2, 8, 8}, false,
                                   [](Layout const& l) { return l.tp == 1; });
}

namespace {

template <class L>
using rebuilt_t = telar::detail::rebuilt_bytes_t<L>;

// The whole backward of one layer: split, or fused.
template <class L, class Exec, class Saved>
void backward_of(L& layer, Exec const& exec, telar::Matrix<T> dy, telar::Matrix<T> dx,
                 Saved const& saved) {
  if constexpr (telar::layer_traits<L>::has_split_backward) {
    layer.backward_input(exec, dy, dx, saved);
    if constexpr (telar::layer_traits<L>::has_backward_weight)
      layer.backward_weight(exec, dy, saved);
  } else {
    layer.backward(exec, dy, dx, saved);
  }
}

// What one forward and backward of `layer` allocate, per category, as the
// meter counts them: its saved state (activations) and its own workspace.
template <class L>
telar::MemoryBytes measure_alone(L& layer, telar::Shape const& in, std::size_t n) {
  using Traits = telar::layer_traits<L>;
  if constexpr (Traits::has_build)
    layer.build(in);
  if constexpr (Traits::has_initialize)
    layer.initialize(7);
  std::size_t const out = layer.output_shape(in).size();
  telar::Matrix<T> x("x", n, in.size()), y("y", n, out), dy("dy", n, out), dx("dx", n, in.size());
  Kokkos::deep_copy(x, T(1)); // a valid token id too
  Kokkos::deep_copy(dy, T(1));
  telar::MemoryMeterInstall install;
  auto& meter = telar::MemoryMeter::instance();
  telar::MemoryBytes const before = meter.current();
  typename Traits::saved_type saved;
  Kokkos::DefaultExecutionSpace exec;
  {
    telar::MemoryMeter::Scope scope(telar::MemoryCategory::activations);
    layer.forward(exec, x, y, saved);
    backward_of(layer, exec, dy, dx, saved);
  }
  exec.fence();
  telar::MemoryBytes got = meter.current();
  for (int c = 0; c < telar::MemoryBytes::count; ++c)
    got.bytes[std::size_t(c)] -= before.bytes[std::size_t(c)];
  return got;
}

// Whether backward reads only what layer_traits::backward_reads says: after
// one forward, backward runs on the intact tensors, then again with the ones
// it does not read overwritten by NaN (as the stage runner's shared buffers
// are by the next forward); the input gradient and the parameter gradients
// must be the same, bit for bit.
template <class L>
void check_backward_reads(L& layer, telar::Shape const& in, std::size_t n) {
  using Traits = telar::layer_traits<L>;
  constexpr telar::BackwardReads reads = Traits::backward_reads;
  if constexpr (reads != telar::BackwardReads::both) {
    std::size_t const out = layer.output_shape(in).size();
    telar::Matrix<T> x("x", n, in.size()), y("y", n, out), dy("dy", n, out);
    auto hx = Kokkos::create_mirror_view(x);
    auto hdy = Kokkos::create_mirror_view(dy);
    for (std::size_t i = 0; i < n; ++i) { // small integers: token ids too
      for (std::size_t j = 0; j < in.size(); ++j)
        hx(i, j) = T((i * 5 + j * 3) % 7);
      for (std::size_t j = 0; j < out; ++j)
        hdy(i, j) = T(0.25) * T(int((i * 3 + j) % 5) - 2);
    }
    Kokkos::deep_copy(x, hx);
    Kokkos::deep_copy(dy, hdy);
    typename Traits::saved_type saved;
    Kokkos::DefaultExecutionSpace exec;
    layer.forward(exec, x, y, saved);
    auto gradients = [&] { // dx, then every parameter gradient, on the host
      std::vector<T> all;
      if constexpr (Traits::has_parameters)
        layer.parameters([&](char const*, auto&, auto& g) { Kokkos::deep_copy(g, T(0)); });
      telar::Matrix<T> dx("dx", n, in.size());
      backward_of(layer, exec, dy, dx, saved);
      exec.fence();
      auto const hdx = telar::test::to_host(dx);
      all.assign(hdx.data(), hdx.data() + hdx.size());
      if constexpr (Traits::has_parameters)
        layer.parameters([&](char const*, auto&, auto& g) {
          auto const hg = telar::test::to_host(g);
          all.insert(all.end(), hg.data(), hg.data() + hg.size());
        });
      return all;
    };
    std::vector<T> const intact = gradients();
    T const nan = std::numeric_limits<T>::quiet_NaN();
    if constexpr (!telar::reads_input(reads))
      Kokkos::deep_copy(x, nan);
    if constexpr (!telar::reads_output(reads))
      Kokkos::deep_copy(y, nan);
    std::vector<T> const overwritten = gradients();
    REQUIRE(overwritten.size() == intact.size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < intact.size(); ++i)
      differ += std::memcmp(&intact[i], &overwritten[i], sizeof(T)) != 0;
    CHECK(differ == 0);
  }
}

// One built-in alone: its parameter count, saved state and workspace equal
// what it allocates, and its plan counts them without a warning (the slot
// of a one-layer model: the saved state, the output and its gradient).
template <class L>
void check_alone(L layer, telar::Shape const& in) {
  std::size_t const n = 3;
  INFO(telar::layer_name(layer) << " on " << in.str());
  using Model = telar::Sequential<L>;
  telar::TrainerOptions opts;
  opts.batch_size = n;
  opts.microbatches = 1;
  auto const plan = telar::plan_memory<Model, Strat<telar::NoSharding>, telar::AdamW<T>>(
      Model(layer), opts, in, 1, 0);
  CHECK(plan.warnings.empty());
  telar::MemoryBytes const got = measure_alone(layer, in, n);
  std::size_t values = 0;
  if constexpr (telar::layer_traits<L>::has_parameters)
    layer.parameters([&](char const*, auto& v, auto&) { values += v.size(); });
  CHECK(telar::detail::parameter_count_of(layer) == values);
  std::size_t saved = telar::detail::saved_bytes_of(layer, n, in);
  if constexpr (telar::detail::is_detected_v<rebuilt_t, L>)
    saved += layer.rebuilt_bytes(n, in); // telar::Recompute keeps its rebuilt state
  CHECK(got[telar::MemoryCategory::activations] == saved);
  CHECK(got[telar::MemoryCategory::workspace] == telar::detail::workspace_bytes_of(layer, n, in));
  std::size_t const out = telar::detail::view_bytes<T>(n * layer.output_shape(in).size());
  if constexpr (telar::detail::takes_shared_pool_v<L>) {
    // A block in the stage's pool (the model's first layer: backward split).
    telar::detail::PoolExtents most;
    layer.pool_extents(in, true, most, 0);
    saved = layer.pooled_saved_bytes(n, in, true) + telar::detail::pool_bytes<T>(most, n);
  }
  CHECK(plan.bytes[telar::MemoryCategory::activations] == saved + 2 * out);
  check_backward_reads(layer, in, n);
}

} // namespace

TEST_CASE("Every built-in layer plans what it allocates", "[memory]") {
  check_alone(telar::Dense<T>(8, 6), telar::Shape(8));
  check_alone(telar::StaticDense<T, 8, 6>(), telar::Shape(8));
  check_alone(telar::ReLU<T>{}, telar::Shape(6));
  check_alone(telar::GELU<T>{}, telar::Shape(6));
  check_alone(telar::GELUTanh<T>{}, telar::Shape(6));
  check_alone(telar::Sigmoid<T>{}, telar::Shape(6));
  check_alone(telar::Tanh<T>{}, telar::Shape(6));
  check_alone(telar::Dropout<T>(0.5), telar::Shape(6));
  check_alone(telar::Flatten<T>{}, telar::Shape{2, 3});
  check_alone(telar::Conv2D<T>(2, 3, 3, 1, 1), telar::Shape{2, 5, 5});
  check_alone(Im2col(2, 3, 3), telar::Shape{2, 5, 5});
  check_alone(telar::Conv3D<T>(2, 2, 3, 1, 1), telar::Shape{2, 3, 3, 3});
  check_alone(telar::Conv2D<T>(4, 6, 3, 1, 1, true, 1, 2), telar::Shape{4, 5, 5}); // grouped
  check_alone(Im2col(4, 4, 3, 1, 1, true, 1, 4), telar::Shape{4, 5, 5});           // depthwise
  check_alone(telar::ConvTranspose2D<T>(3, 2, 2, 2), telar::Shape{3, 4, 4});
  check_alone(
      telar::ConvTranspose2D<T, telar::DefaultMemorySpace, telar::AutoGemm, telar::Im2colConv>(
          3, 2, 3, 2, 1, 1),
      telar::Shape{3, 4, 4});
  check_alone(telar::ConvTranspose3D<T>(2, 2, 2, 2), telar::Shape{2, 2, 2, 2});
  check_alone(telar::ReLU6<T>{}, telar::Shape(6));
  check_alone(telar::Clip<T>(-1, 2), telar::Shape(6));
  check_alone(telar::LeakyReLU<T>(0.1), telar::Shape(6));
  check_alone(telar::ELU<T>{}, telar::Shape(6));
  check_alone(telar::SiLU<T>{}, telar::Shape(6));
  check_alone(telar::HardSwish<T>{}, telar::Shape(6));
  check_alone(telar::HardSigmoid<T>{}, telar::Shape(6));
  check_alone(telar::MathFunction<T>(telar::MathFn::pow, 3), telar::Shape(6));
  check_alone(telar::Softmax<T>(0), telar::Shape{3, 4});
  check_alone(telar::MaxPool3D<T>(2), telar::Shape{2, 4, 4, 4});
  check_alone(telar::AvgPool3D<T>(3, 2, 1, true, false), telar::Shape{2, 5, 5, 5});
  check_alone(telar::MaxPool2D<T>(3, 2, 0, true), telar::Shape{2, 6, 6});
  check_alone(telar::GlobalMaxPool<T>{}, telar::Shape{2, 4, 4});
  check_alone(telar::Upsample<T>({2, 2}), telar::Shape{2, 3, 3});
  check_alone(telar::Upsample<T>({2, 2, 2}, telar::UpsampleMode::linear, true),
              telar::Shape{2, 2, 3, 3});
  check_alone(telar::BatchNorm<T>(2), telar::Shape{2, 4, 4});
  check_alone(telar::BatchNorm<T>(3), telar::Shape(3)); // 12-byte statistics, rounded
  check_alone(telar::MaxPool2D<T>(2), telar::Shape{2, 4, 4});
  check_alone(telar::AvgPool2D<T>(2), telar::Shape{2, 4, 4});
  check_alone(telar::GlobalAvgPool<T>{}, telar::Shape{2, 4, 4});
  check_alone(telar::LayerNorm<T>(6), telar::Shape{2, 6});
  check_alone(telar::RMSNorm<T>(6), telar::Shape{2, 6});
  check_alone(telar::GroupNorm<T>(2, 4), telar::Shape{4, 3, 3});
  check_alone(telar::Embedding<T>(8, 6), telar::Shape(5));
  check_alone(telar::PositionalEmbedding<T>(5, 6), telar::Shape{5, 6});
  check_alone(telar::CausalSelfAttention<T>(8, 2), telar::Shape{5, 8});
  // The tables of an imported Add/Sub and Mul/Div of a constant.
  check_alone(telar::Bias<T>(telar::Shape{3, 4, 4}, telar::Shape{3, 1, 1}), telar::Shape{3, 4, 4});
  check_alone(telar::Multiplier<T>(telar::Shape{3, 4, 4}, telar::Shape{4}), telar::Shape{3, 4, 4});
  check_alone(telar::Multiplier<T>(telar::Shape{3, 4, 4}, telar::Shape{3, 1, 1}, true),
              telar::Shape{3, 4, 4});
  // Fixed tables (an imported literal): a buffer, no parameter.
  check_alone(telar::Bias<T>(telar::Shape{3, 4, 4}, telar::Shape{4}, T(1), T(1), false),
              telar::Shape{3, 4, 4});
  check_alone(telar::Multiplier<T>(telar::Shape{3, 4, 4}, telar::Shape{3, 1, 1}, false, false),
              telar::Shape{3, 4, 4});
}

TEST_CASE("Every built-in block plans what it allocates when nested", "[memory]") {
  check_alone(conv_block(), telar::Shape{4, 4, 4});
  check_alone(projected_conv(), telar::Shape{8, 4, 4});
  check_alone(telar::test::unet::make_block<T, telar::LocalStats>(2), telar::Shape{2, 8, 8});
  check_alone(dense_block(6), telar::Shape(6));
  check_alone(nested_block(6), telar::Shape(6));
  check_alone(dynamic_block(6), telar::Shape(6));
  check_alone(im2col_graph(), telar::Shape{2, 5, 5});
  check_alone(telar::Recompute<DenseBlock>(dense_block(6)), telar::Shape(6));
  check_alone(telar::Recompute<ProjectedConv>(projected_conv()), telar::Shape{8, 4, 4});
  check_alone(telar::Sequential<telar::Dense<T>, telar::ReLU<T>>(telar::Dense<T>(8, 6), {}),
              telar::Shape(8));
  check_alone(telar::make_transformer_block<T>(8, 2), telar::Shape{5, 8});
}

namespace {
constexpr std::size_t kSlotBatch = 32, kRow = kSlotBatch * sizeof(T); // bytes of one feature

// Two steps of `chain` (inputs `in` of 32 values, batch kSlotBatch) on this
// rank alone: its planned activation bytes and the measured ones.
template <class Chain>
std::pair<std::size_t, std::size_t> slot_activations(Chain chain,
                                                     telar::Shape const& in = telar::Shape(32)) {
  telar::Matrix<T> x("x", kSlotBatch, 1);
  telar::Labels<> y("y", kSlotBatch);
  make_batch(in, false, x, y);
  telar::TrainerOptions opts;
  opts.batch_size = kSlotBatch;
  // What earlier cases left on the meter's books (a layer's buffers freed
  // after its meter was uninstalled) is in every peak.
  std::size_t const before =
      telar::MemoryMeter::instance().current()[telar::MemoryCategory::activations];
  telar::Trainer<Chain, Strat<telar::NoSharding>, telar::AdamW<T>> trainer(
      MPI_COMM_SELF, std::move(chain), telar::AdamW<T>{}, opts, in);
  for (int s = 0; s < 2; ++s)
    trainer.step(x, y);
  return {trainer.memory_plan().bytes[telar::MemoryCategory::activations],
          trainer.memory()[telar::MemoryCategory::activations] - before};
}
} // namespace

// Liveness (core/detail/activation_liveness.hpp): a micro-batch keeps
// the inputs of the Dense layers (read by their weight gradient), the
// ReLUs' outputs (their slope) and the stage output; the Dense outputs and
// the gradients between layers live in two buffers shared by the slots.
TEST_CASE("A slot keeps only the activations a backward reads", "[memory]") {
  using Chain = telar::Sequential<telar::Dense<T>, telar::ReLU<T>, telar::Dense<T>, telar::ReLU<T>,
                                  telar::Dense<T>>;
  auto const [planned, measured] = slot_activations(
      Chain(telar::Dense<T>(32, 64), {}, telar::Dense<T>(64, 64), {}, telar::Dense<T>(64, 16)));
  std::size_t const kept = (64 + 64 + 16) * kRow; // two ReLU outputs, the output
  std::size_t const output_grad = 16 * kRow;
  std::size_t const shared = 2 * 64 * kRow; // the widest tensor of each parity
  CHECK(planned == kept + output_grad + shared);
  CHECK(measured == planned);
  // Every activation and gradient kept per slot, as before: 69632 bytes.
  CHECK(planned * 100 < 2 * (4 * 64 + 16) * kRow * 55);
}

// A BatchNorm keeps its scratch (per-plane partial sums, two per-channel
// sums) between calls: the plan counts it as workspace, the meter agrees to
// the byte, and a steady-state step allocates nothing (it used to allocate
// and free the scratch in every call: 66 KB above the ResNet example's plan).
TEST_CASE("A BatchNorm's scratch is planned workspace, not allocated per call", "[memory]") {
  using Chain = telar::Sequential<telar::Conv2D<T>, telar::BatchNorm<T>, telar::ReLU<T>,
                                  telar::Flatten<T>, telar::Dense<T>>;
  telar::Matrix<T> x("x", kSlotBatch, 1);
  telar::Labels<> y("y", kSlotBatch);
  make_batch(telar::Shape{2, 4, 4}, false, x, y);
  telar::TrainerOptions opts;
  opts.batch_size = kSlotBatch;
  auto& meter = telar::MemoryMeter::instance();
  auto const before = meter.current();
  telar::Trainer<Chain, Strat<telar::NoSharding>, telar::AdamW<T>> trainer(
      MPI_COMM_SELF,
      Chain(telar::Conv2D<T>(2, 4, 3, 1, 1), telar::BatchNorm<T>(4), {}, {},
            telar::Dense<T>(64, 16)),
      telar::AdamW<T>{}, opts, telar::Shape{2, 4, 4});
  for (int s = 0; s < 2; ++s)
    trainer.step(x, y);
  std::uint64_t const allocations = meter.allocations();
  trainer.step(x, y);
  CHECK(meter.allocations() == allocations);
  auto const plan = trainer.memory_plan().bytes;
  std::size_t const scratch =
      telar::detail::view_bytes<T>(2 * kSlotBatch * 4) + 2 * telar::detail::view_bytes<T>(4);
  CHECK(plan[telar::MemoryCategory::workspace] >= scratch);
  for (auto const c : {telar::MemoryCategory::activations, telar::MemoryCategory::workspace}) {
    INFO(telar::MemoryBytes::key(c));
    CHECK(trainer.memory()[c] - before[c] == plan[c]);
  }
}

#if TELAR_HAVE_ONEDNN
// The same chain in bf16 (with the tensor-parallel pair, as the examples'
// MLP): no backward reads the ReLUs' outputs through a view any more. Each
// ReLU keeps their signs (a bit a value) and each bf16 Dense after it its
// input rounded to bf16 (2 bytes a value), so the two 64-wide tensors move
// to the shared buffers; the plan says so, the meter agrees. (The first
// Dense reads the stage input, which the caller keeps.)
TEST_CASE("A bf16 slot keeps compact copies instead of activations", "[memory][bf16]") {
  using D = telar::Dense<T, telar::DefaultMemorySpace, telar::Bf16Gemm>;
  using Chain = telar::Sequential<telar::ColumnParallel<D>, telar::ReLU<T>, telar::RowParallel<D>,
                                  telar::ReLU<T>, D>;
  if (!telar::bf16_available())
    SKIP("no bf16 instructions here");
  auto const [planned, measured] = slot_activations(
      Chain(telar::ColumnParallel<D>(32, 64), {}, telar::RowParallel<D>(64, 64), {}, D(64, 16)));
  std::size_t const signs = 2 * (kSlotBatch * 64 / 32) * 4; // two ReLUs, 32 values a word
  std::size_t const rounded = 2 * kSlotBatch * 64 * 2;      // two Dense inputs in bf16
  std::size_t const output = 2 * 16 * kRow;                 // the output and its gradient
  std::size_t const shared = 2 * 64 * kRow;
  CHECK(planned == signs + rounded + output + shared);
  CHECK(measured == planned);
  // The two 64-wide tensors a micro-batch keeps: 8704 bytes against 16384
  // in fp32 (2.125 bytes a value against 4).
  CHECK(signs + rounded == 8704);
}

// The same with a bf16 convolution in the first Dense pair's place: it
// keeps its input (the first ReLU's output, [4, 4, 4]) rounded to bf16 too.
// The first convolution reads the stage input, which the caller keeps.
TEST_CASE("A bf16 convolution keeps its input in bf16, not in the slot", "[memory][bf16]") {
  using C = telar::Conv2D<T, telar::DefaultMemorySpace, telar::Bf16Gemm, telar::OneDnnConvBf16>;
  using D = telar::Dense<T, telar::DefaultMemorySpace, telar::Bf16Gemm>;
  using Chain = telar::Sequential<C, telar::ReLU<T>, C, telar::ReLU<T>, telar::Flatten<T>, D>;
  static_assert(telar::layer_traits<C>::has_compact_copy);
  if (!telar::bf16_available())
    SKIP("no bf16 instructions here");
  auto const [planned, measured] = slot_activations(
      Chain(C(2, 4, 3, 1, 1), {}, C(4, 4, 3, 1, 1), {}, {}, D(64, 16)), telar::Shape{2, 4, 4});
  std::size_t const signs = 2 * (kSlotBatch * 64 / 32) * 4; // two ReLUs, 32 values a word
  std::size_t const rounded = 2 * kSlotBatch * 64 * 2;      // the second conv's, Dense's inputs
  std::size_t const output = 2 * 16 * kRow;
  std::size_t const shared = 2 * 64 * kRow;
  CHECK(planned == signs + rounded + output + shared);
  CHECK(measured == planned);
}

// The same with a bf16 transposed convolution (a U-Net's upsampling, here
// at stride 1) in the second convolution's place: its input is the
// adjoint's output gradient, which its backward-data primitive converts in
// forward and keeps in bf16 for the weight gradient.
TEST_CASE("A bf16 transposed convolution keeps its input in bf16, not in the slot",
          "[memory][bf16]") {
  using C = telar::Conv2D<T, telar::DefaultMemorySpace, telar::Bf16Gemm, telar::OneDnnConvBf16>;
  using CT =
      telar::ConvTranspose2D<T, telar::DefaultMemorySpace, telar::Bf16Gemm, telar::OneDnnConvBf16>;
  using D = telar::Dense<T, telar::DefaultMemorySpace, telar::Bf16Gemm>;
  using Chain = telar::Sequential<C, telar::ReLU<T>, CT, telar::ReLU<T>, telar::Flatten<T>, D>;
  static_assert(telar::layer_traits<CT>::has_compact_copy);
  if (!telar::bf16_available())
    SKIP("no bf16 instructions here");
  auto const [planned, measured] = slot_activations(
      Chain(C(2, 4, 3, 1, 1), {}, CT(4, 4, 3, 1, 1), {}, {}, D(64, 16)), telar::Shape{2, 4, 4});
  std::size_t const signs = 2 * (kSlotBatch * 64 / 32) * 4; // two ReLUs, 32 values a word
  std::size_t const rounded = 2 * kSlotBatch * 64 * 2;      // the transposed's, Dense's inputs
  std::size_t const output = 2 * 16 * kRow;
  std::size_t const shared = 2 * 64 * kRow;
  CHECK(planned == signs + rounded + output + shared);
  CHECK(measured == planned);
}

// A transformer's MLP as telar::Precision<bf16, float> rebinds it: the
// GELU keeps its input rounded to bf16 (telar::KeptInBf16), the Dense after
// it the GELU's output, so both 64-wide tensors move to the shared buffers
// and a micro-batch keeps 2 bytes a value of each (4 + 4 in fp32, 4 + 2
// before the GELU kept its copy).
TEST_CASE("A bf16 GELU keeps its input in bf16, not in the slot", "[memory][bf16]") {
  using D = telar::Dense<T, telar::DefaultMemorySpace, telar::Bf16Gemm>;
  using Gelu = telar::KeptInBf16<telar::GELU<T>>;
  static_assert(std::is_same_v<telar::detail::bf16_rebind_t<telar::GELU<T>>, Gelu>);
  using Chain = telar::Sequential<telar::ColumnParallel<D>, Gelu, telar::RowParallel<D>>;
  if (!telar::bf16_available())
    SKIP("no bf16 instructions here");
  auto const [planned, measured] =
      slot_activations(Chain(telar::ColumnParallel<D>(32, 64), {}, telar::RowParallel<D>(64, 16)));
  std::size_t const rounded = 2 * kSlotBatch * 64 * 2; // the GELU's and the Dense's inputs
  std::size_t const output = 2 * 16 * kRow;            // the output and its gradient
  std::size_t const shared = 2 * 64 * kRow;
  CHECK(planned == rounded + output + shared);
  CHECK(measured == planned);
}
#endif
