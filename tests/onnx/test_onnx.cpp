// ONNX import/export against PyTorch's own exporter (fixtures from
// make_models.py): forward output and SGD training match PyTorch, the export
// reloads in PyTorch (check_export.py), dp2 / pp2 / tp2 equal serial, an
// import under Precision<bf16, float> runs bf16 layers from the file's
// values, and files outside the subset are refused with a message naming
// the problem.
#include "support.hpp"

#include <telar/onnx/export.hpp>
#include <telar/onnx/import.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/parallel/precision.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#ifndef TELAR_ONNX_FIXTURES
#error "TELAR_ONNX_FIXTURES must name the directory make_models.py wrote"
#endif

namespace {

using Imported = telar::onnx::Imported<float>;
using Model = telar::onnx::Model<float>;
using Full =
    telar::Strategy<telar::DataParallel<>, telar::PipelineParallel<>, telar::TensorParallel<>>;
// Parameters sharded and gathered per micro-batch: the imported values must
// reach the shards, and the export must gather them.
using Zero3 = telar::Strategy<telar::DataParallel<telar::RingAllreduce, telar::ZeRO<3>>>;

// The fixture directory: TELAR_ONNX_FIXTURES in the environment (fixtures
// written by another PyTorch, e.g. tests/onnx/torch26_check.sh's), else the
// build's (make_models.py run by TELAR_TORCH_PYTHON at build time).
std::string fixture(std::string const& name) {
  static std::string const dir = [] {
    char const* env = std::getenv("TELAR_ONNX_FIXTURES");
    return std::string(env != nullptr && *env != '\0' ? env : TELAR_ONNX_FIXTURES);
  }();
  return dir + "/" + name;
}

template <class T>
std::vector<T> read_bin(std::string const& name) {
  std::ifstream in(fixture(name), std::ios::binary | std::ios::ate);
  REQUIRE(in);
  std::size_t const bytes = std::size_t(in.tellg());
  std::vector<T> v(bytes / sizeof(T));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), std::streamsize(bytes));
  return v;
}

template <class T>
void write_bin(std::string const& name, std::vector<T> const& v) {
  std::ofstream out(fixture(name), std::ios::binary);
  out.write(reinterpret_cast<char const*>(v.data()), std::streamsize(v.size() * sizeof(T)));
}

template <class T = float>
telar::Matrix<T> to_matrix(std::vector<float> const& v, std::size_t rows) {
  telar::Matrix<T> m("x", rows, v.size() / rows);
  auto h = Kokkos::create_mirror_view(m);
  std::copy(v.begin(), v.end(), h.data());
  Kokkos::deep_copy(m, h);
  return m;
}
telar::Labels<> to_labels(std::vector<int> const& v) {
  telar::Labels<> y("y", v.size());
  auto h = Kokkos::create_mirror_view(y);
  std::copy(v.begin(), v.end(), h.data());
  Kokkos::deep_copy(y, h);
  return y;
}
template <class T>
std::vector<T> to_vector(telar::Matrix<T> const& m) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, m);
  return std::vector<T>(h.data(), h.data() + h.size());
}

// max |a - b| / max |b|: a relative error that tiny entries do not inflate.
template <class T>
double rel_err(std::vector<T> const& a, std::vector<T> const& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - double(b[i])));
    den = std::max(den, std::abs(double(b[i])));
  }
  return num / std::max(den, 1e-30);
}

// Initializers of the file, concatenated in file order (as make_models.py
// writes PyTorch's trained values).
template <class T>
std::vector<T> in_file_order(telar::onnx::Imported<T> const& imp,
                             std::map<std::string, std::vector<T>> const& values) {
  std::vector<T> out;
  for (auto const& t : imp.proto->graph().initializer()) {
    auto const* b = &*std::find_if(imp.bindings.begin(), imp.bindings.end(),
                                   [&](auto const& x) { return x.initializer == t.name(); });
    auto const& v = values.at(t.name());
    for (std::size_t i = 0; i < b->rows * b->cols; ++i) {             // back to the file's layout:
      std::size_t const r = b->transpose ? i % b->rows : i / b->cols; // [cols, rows] if transposed
      std::size_t const c = b->transpose ? i / b->rows : i % b->cols;
      out.push_back(v[r * b->cols + c]);
    }
  }
  return out;
}

struct Manifest {
  std::size_t n = 0, batch = 0;
  int steps = 0;
  double lr = 0;
};
Manifest manifest() {
  std::ifstream in(fixture("manifest.txt"));
  Manifest m;
  in >> m.n >> m.batch >> m.steps >> m.lr;
  REQUIRE(m.n > 0);
  return m;
}

// TELAR_ONNX_REPORT set: each measured figure on a line of its own
// ("onnx-report: <what> <value>", rank 0), for docs/onnx.md's tables
// (tests/onnx/torch26_check.sh collects them).
void report(std::string const& what, double value) {
  static bool const on = std::getenv("TELAR_ONNX_REPORT") != nullptr;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (on && rank == 0)
    std::printf("onnx-report: %s %.3g\n", what.c_str(), value), std::fflush(stdout);
}

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// import_graph's result: the whole file as one graph (a GraphChain).
template <class T = float>
using GraphImported =
    telar::onnx::Imported<T, telar::DefaultMemorySpace, telar::onnx::GraphModel<T>>;
template <class T>
void import_into(telar::onnx::Imported<T>& r, std::string const& path, bool tp) {
  telar::onnx::ImportOptions io;
  io.tensor_parallel = tp;
  r = telar::onnx::import_model<T>(path, io);
}
template <class T>
void import_into(GraphImported<T>& r, std::string const& path, bool) {
  r = telar::onnx::import_graph<T>(path);
}

// Trains `name` for the manifest's steps under the degrees of `opts`, in
// T (the file's float32 values read as T), imported as Imp says
// (import_model or import_graph); the gathered parameters (every rank) and
// the trainer's rank-0 outputs on x (written as float32).
template <class T = float, class Imp = telar::onnx::Imported<T>>
struct Trained {
  std::map<std::string, std::vector<T>> params;
  Imp imported;
  std::vector<std::string> crossing; // a GraphChain's tensors crossing the first stage boundary
};
template <class Strategy = Full, class T = float, class Imp = telar::onnx::Imported<T>>
Trained<T, Imp> train(std::string const& name, MPI_Comm comm, telar::TrainerOptions opts, bool tp,
                      std::string const& export_to = "") {
  Manifest const mf = manifest();
  Trained<T, Imp> r;
  import_into(r.imported, fixture(name + ".onnx"), tp);
  auto const tx = read_bin<float>(name + "_train_x.bin");
  auto const ty = read_bin<int>(name + "_train_y.bin");
  auto const x = to_matrix<T>(tx, ty.size());
  auto const y = to_labels(ty);
  double lr = mf.lr; // or the model's own (make_models.py's MODEL_LR)
  std::ifstream(fixture(name + "_lr.txt")) >> lr;
  opts.lr = telar::constant_lr(lr);
  telar::Trainer<decltype(r.imported.model), Strategy, telar::SGD<T>> trainer(
      comm, r.imported.model, {}, opts, r.imported.input_shape);
  int const dp = trainer.grid_shape().dp, d = trainer.grid_coords().dp;
  std::size_t const local = mf.batch / std::size_t(dp);
  for (int s = 0; s < mf.steps; ++s) {
    std::size_t const b = std::size_t(s) * mf.batch + std::size_t(d) * local;
    trainer.step(telar::rows(x, b, b + local), telar::rows(y, b, b + local));
  }
  r.params = telar::onnx::gather_parameters(trainer, r.imported);
  if constexpr (std::is_same_v<Imp, GraphImported<T>>)
    if (trainer.stage_boundaries().size() > 2)
      r.crossing = trainer.model().live_tensors(trainer.stage_boundaries()[1]);
  if (!export_to.empty()) {
    telar::onnx::export_trained(trainer, r.imported, fixture(export_to + ".onnx"));
    auto const xs = read_bin<float>(name + "_x.bin");
    auto const y = to_vector(telar::onnx::predict(trainer.model(), to_matrix<T>(xs, mf.n)));
    write_bin(export_to + "_y.bin", std::vector<float>(y.begin(), y.end()));
  }
  return r;
}

telar::TrainerOptions serial_options() {
  telar::TrainerOptions o;
  o.grid = {1, 1, 1};
  return o;
}

} // namespace

// The torchvision networks and the U-Net (BatchNorm nodes, skips, joins):
// 1e-4; the rest 1e-5.
bool zoo(std::string const& name) {
  for (char const* z : {"resnet18", "unet", "mobilenetv2", "resnet50", "densenet121", "squeezenet",
                        "encoder", "gpt"})
    if (name == z)
      return true;
  return false;
}

// Every model make_models.py trains: the small ones, the zoo, and one per
// activation, pooling, softmax and upsampling operator (a Conv, the
// operator, Flatten, Linear).
// clang-format off
std::vector<std::string> const models = {
    "mlp", "cnn", "resmlp", "resnet18", "unet", "mobilenetv2",
    "resnet50", "densenet121", "squeezenet", "encoder", "op_relu6", "op_clip",
    "op_leaky", "op_elu", "op_silu", "op_hardswish", "op_hardsigmoid", "op_softmax",
    "op_gmaxpool", "op_pool_ceil", "op_avgpool", "op_pool3d", "op_up_nearest", "op_up_linear",
    "op_up_corners", "gpt", "op_subdiv", "op_muldiv", "op_addbcast", "op_literals",
    "op_mathsplit", "op_layernorm17", "op_conv1d"};
// clang-format on

TEST_CASE("ONNX import: forward output equals PyTorch's", "[onnx]") {
  Manifest const mf = manifest();
  for (std::string const& name : models) {
    INFO(name);
    Imported imp = telar::onnx::import_model<float>(fixture(name + ".onnx"));
    imp.model.build(imp.input_shape);
    imp.model.initialize(0);
    auto const x = to_matrix(read_bin<float>(name + "_x.bin"), mf.n);
    auto const got = to_vector(telar::onnx::predict(imp.model, x));
    double const err = rel_err(got, read_bin<float>(name + "_y.bin"));
    INFO("relative error " << err);
    report(name + " forward", err);
    CHECK(err <= (zoo(name) ? 1e-4 : 1e-5));
  }
}

// ResNet-50's float32 training step is ill-conditioned at 3x32x32: its
// BatchNorms normalise 8 samples of 2x2 and 1x1 maps, and PyTorch's own
// float32 and float64 running variances differ by 0.13 after three steps,
// at any learning rate. It trains in double, against PyTorch in float64.
bool trained_in_double(std::string const& name) {
  return name == "resnet50";
}

template <class T>
void check_training(std::string const& name) {
  // Every rank trains alone (the export is written once, by rank 0).
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Trained<T> const t = train<Full, T>(name, MPI_COMM_SELF, serial_options(), false,
                                      rank == 0 ? name + "_telar" : "");
  std::vector<T> const got = in_file_order(t.imported, t.params);
  double const err = rel_err(got, read_bin<T>(name + "_trained.bin"));
  INFO("parameters after training: relative error " << err);
  report(name + " trained-parameters", err);
  // In double, the file's float32 epsilon and momentum (1e-5f, 0.9f) differ
  // from PyTorch's (1e-5, 0.1) by 2.5e-9 and 2.4e-7 relative.
  CHECK(err <= (std::is_same_v<T, double> ? 1e-5 : 1e-4));
  if (rank == 0) {
    auto const want = read_bin<float>(name + "_trained_y.bin");
    CHECK(std::any_of(want.begin(), want.end(), [](float v) { return v != 0; })); // not dead
    double const out = rel_err(read_bin<float>(name + "_telar_y.bin"), want);
    INFO("outputs after training: relative error " << out);
    report(name + " trained-outputs", out);
    CHECK(out <= 1e-4);
    // The written file (float32) imports again with the trained values.
    Imported back = telar::onnx::import_model<float>(fixture(name + "_telar.onnx"));
    CHECK(in_file_order(back, *back.start) == std::vector<float>(got.begin(), got.end()));
  }
}

// ResNet-50 and DenseNet-121 train in a case of their own (ctest
// onnx_zoo_deep runs it beside the others): 12 s and 15 s of CPU here.
bool deep(std::string const& name) {
  return name == "resnet50" || name == "densenet121";
}

void check_training(std::string const& name) {
  INFO(name);
  if (trained_in_double(name))
    check_training<double>(name);
  else
    check_training<float>(name);
}

TEST_CASE("ONNX import: SGD training equals PyTorch's; the export reloads", "[onnx]") {
  for (std::string const& name : models)
    if (!deep(name))
      check_training(name);
}

TEST_CASE("ONNX import: ResNet-50 and DenseNet-121 train as PyTorch", "[.zoo_deep]") {
  for (std::string const& name : models)
    if (deep(name))
      check_training(name);
}

template <class Got>
double worst_error(Got const& got, Trained<> const& ref, std::string& worst_name) {
  double worst = 0;
  for (auto const& [init, v] : ref.params)
    if (double const e = rel_err(got.params.at(init), v); e >= worst) {
      worst = e;
      worst_name = init;
    }
  return worst;
}

TEST_CASE("ONNX import: dp2, pp2, tp2 and ZeRO-3 train to the serial parameters", "[onnx][mpi]") {
  if (world_size() != 2)
    return; // the layouts below need two ranks
  // ZeRO-3: the imported values reach the shards, the export gathers them
  // (the GPT decoder: its embedding tables and attention graphs sharded too).
  for (std::string const model : {"mlp", "gpt", "encoder"}) {
    Trained<> const ref = train(model, MPI_COMM_SELF, serial_options(), false);
    telar::TrainerOptions o;
    o.grid = {2, 1, 1};
    std::string name;
    double const worst = worst_error(train<Zero3>(model, MPI_COMM_WORLD, o, false), ref, name);
    INFO(model << " ZeRO-3 dp=2: worst relative error " << worst << " (" << name << ")");
    report(model + " zero3-dp2", worst);
    CHECK(worst <= 1e-5);
  }
  struct Layout {
    int dp, pp, tp;
  };
  // op_muldiv: Multiplier tables (a divisor among them) reduced over dp and
  // split over pp; op_addbcast: a graph of broadcast Add joins; op_literals:
  // fixed tables (buffers) beside one-value trained ones.
  for (std::string const name :
       {"mlp", "cnn", "resmlp", "encoder", "gpt", "op_muldiv", "op_addbcast", "op_literals"}) {
    Trained<> const ref = train(name, MPI_COMM_SELF, serial_options(), false);
    for (Layout const l : {Layout{2, 1, 1}, Layout{1, 2, 1}, Layout{1, 1, 2}}) {
      if (l.tp > 1 && name != "mlp")
        continue; // tp pairs need Dense, act, Dense: the MLP has them
      telar::TrainerOptions o;
      o.grid = {l.dp, l.pp, l.tp};
      o.microbatches = l.pp > 1 ? 2 : 1;
      Trained<> const got = train(name, MPI_COMM_WORLD, o, l.tp > 1);
      std::string worst_name;
      double const worst = worst_error(got, ref, worst_name);
      INFO(name << " dp=" << l.dp << " pp=" << l.pp << " tp=" << l.tp << ": worst relative error "
                << worst << " (" << worst_name << ")");
      report(name + " dp" + std::to_string(l.dp) + "-pp" + std::to_string(l.pp) + "-tp" +
                 std::to_string(l.tp),
             worst);
      CHECK(worst <= 1e-5);
    }
  }
  // BatchNorm imports with SyncStats: dp=2 with one micro-batch per rank
  // normalises the whole batch, as serial does (running statistics included),
  // under ZeRO-3 too. pp=2 with one micro-batch: each stage normalises the
  // whole batch (more micro-batches are normalised one by one, as PyTorch's
  // pipelines do, and differ from serial by design).
  for (std::string const name : {"resnet18", "unet", "mobilenetv2", "squeezenet"}) {
    Trained<> const ref = train(name, MPI_COMM_SELF, serial_options(), false);
    telar::TrainerOptions dp, pp;
    dp.grid = {2, 1, 1};
    pp.grid = {1, 2, 1};
    pp.microbatches = 1;
    auto check = [&](char const* what, Trained<> const& got) {
      std::string worst_name;
      double const worst = worst_error(got, ref, worst_name);
      INFO(name << " " << what << ": worst relative error " << worst << " (" << worst_name << ")");
      report(name + " " + what, worst);
      // MobileNetV2's last BatchNorms see 1x1 maps of 8 samples: their running
      // variances take the order of the reduction to 1.4e-5 (1e-4 there).
      CHECK(worst <= (name == "mobilenetv2" ? 1e-4 : 1e-5));
    };
    check("syncstats-dp2", train(name, MPI_COMM_WORLD, dp, false));
    check("zero3-dp2", train<Zero3>(name, MPI_COMM_WORLD, dp, false));
    check("pp2", train(name, MPI_COMM_WORLD, pp, false));
  }
}

// import_graph: the U-Net as one graph, whose skips span the whole file
// (import_model makes it a stem, one DynamicGraph and a head: a pipeline
// could cut only around it). Trained as a GraphChain serially it equals
// import_model's model; at pp=2 (one micro-batch: BatchNorm sees the whole
// batch) the stage boundary falls inside the graph with skips crossing it,
// and the parameters equal serial, as under ZeRO-3 at dp=2. The serial
// export re-imports with the trained values and its outputs match
// PyTorch's after training.
TEST_CASE("ONNX import_graph: the U-Net as one graph, cut inside by pp2, trains to serial",
          "[onnx][mpi]") {
  if (world_size() != 2)
    return;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Trained<> const ref = train("unet", MPI_COMM_SELF, serial_options(), false);
  std::string const out = rank == 0 ? "unet_graph_telar" : "";
  auto const serial =
      train<Full, float, GraphImported<>>("unet", MPI_COMM_SELF, serial_options(), false, out);
  telar::TrainerOptions pp;
  pp.grid = {1, 2, 1};
  pp.microbatches = 1;
  auto const piped = train<Full, float, GraphImported<>>("unet", MPI_COMM_WORLD, pp, false);
  telar::TrainerOptions dp;
  dp.grid = {2, 1, 1};
  auto const sharded = train<Zero3, float, GraphImported<>>("unet", MPI_COMM_WORLD, dp, false);
  std::string worst_name;
  double const e_serial = worst_error(serial, ref, worst_name);
  INFO("serial GraphChain vs import_model: " << e_serial << " (" << worst_name << ")");
  report("unet one-graph-serial", e_serial);
  CHECK(e_serial <= 1e-5);
  double const e_piped = worst_error(piped, ref, worst_name);
  INFO("pp2 GraphChain vs import_model serial: " << e_piped << " (" << worst_name << ")");
  report("unet one-graph-pp2", e_piped);
  CHECK(e_piped <= 1e-5);
  // ZeRO-3 over dp=2 (SyncStats BatchNorm: the whole batch, as serial):
  // the graph's nodes sharded and gathered, the export gathered from shards.
  double const e_sharded = worst_error(sharded, ref, worst_name);
  INFO("ZeRO-3 dp2 GraphChain vs import_model serial: " << e_sharded << " (" << worst_name << ")");
  report("unet one-graph-zero3-dp2", e_sharded);
  CHECK(e_sharded <= 1e-5);
  INFO("crossing the boundary: " << piped.crossing.size() << " tensors");
  report("unet one-graph-pp2 tensors-crossing", double(piped.crossing.size()));
  CHECK(piped.crossing.size() > 1); // the skips cross with the activation
  if (rank == 0) {
    auto const back = telar::onnx::import_model<float>(fixture("unet_graph_telar.onnx"));
    CHECK(in_file_order(back, *back.start) == in_file_order(back, serial.params));
    double const y =
        rel_err(read_bin<float>("unet_graph_telar_y.bin"), read_bin<float>("unet_trained_y.bin"));
    INFO("outputs after training against PyTorch's: " << y);
    CHECK(y <= 1e-4);
  }
}

// ResNet-50 (in double, as it trains against PyTorch) under the BatchNorm
// zoo's layouts: run by hand at 2 ranks (`mpiexec -n 2 test_onnx
// "[zoo_deep_mpi]"`, about a minute of both cores), not in CI.
TEST_CASE("ONNX import: ResNet-50 at dp2, ZeRO-3 dp2 and pp2 trains to serial", "[.zoo_deep_mpi]") {
  if (world_size() != 2)
    return;
  Trained<double> const ref =
      train<Full, double>("resnet50", MPI_COMM_SELF, serial_options(), false);
  telar::TrainerOptions dp, pp;
  dp.grid = {2, 1, 1};
  pp.grid = {1, 2, 1};
  pp.microbatches = 1;
  auto check = [&](char const* what, Trained<double> const& got) {
    double worst = 0;
    for (auto const& [init, v] : ref.params)
      worst = std::max(worst, rel_err(got.params.at(init), v));
    INFO("resnet50 " << what << ": worst relative error " << worst);
    report(std::string("resnet50 ") + what, worst);
    // Its BatchNorms normalise 8 samples of 2x2 and 1x1 maps (see
    // trained_in_double): dp2's reduction order, 1e-16 apart, grows to 1e-8
    // in three steps; pp2 with one micro-batch is bit-identical.
    CHECK(worst <= 1e-6);
  };
  check("syncstats-dp2", train<Full, double>("resnet50", MPI_COMM_WORLD, dp, false));
  check("zero3-dp2", train<Zero3, double>("resnet50", MPI_COMM_WORLD, dp, false));
  check("pp2", train<Full, double>("resnet50", MPI_COMM_WORLD, pp, false));
}

// At 4 ranks (ctest onnx_mpi4_np_4 runs this hidden case): the GPT decoder
// at dp4 (2 samples per rank), dp2 x pp2 and ZeRO-3 dp4. (ResNet-18 at dp4
// passes too, 5.9e-7, but costs a minute of CI on two cores.)
TEST_CASE("ONNX import: the GPT decoder at 4 ranks trains to the serial parameters", "[.mpi4]") {
  if (world_size() != 4)
    return;
  struct Layout {
    int dp, pp;
    bool zero3;
  };
  Trained<> const ref = train("gpt", MPI_COMM_SELF, serial_options(), false);
  for (Layout const l : {Layout{4, 1, false}, Layout{2, 2, false}, Layout{4, 1, true}}) {
    telar::TrainerOptions o;
    o.grid = {l.dp, l.pp, 1};
    o.microbatches = l.pp > 1 ? 2 : 1;
    Trained<> const got = l.zero3 ? train<Zero3>("gpt", MPI_COMM_WORLD, o, false)
                                  : train("gpt", MPI_COMM_WORLD, o, false);
    std::string worst_name;
    double const worst = worst_error(got, ref, worst_name);
    INFO("gpt dp=" << l.dp << " pp=" << l.pp << (l.zero3 ? " ZeRO-3" : "")
                   << ": worst relative error " << worst << " (" << worst_name << ")");
    report("gpt dp" + std::to_string(l.dp) + "-pp" + std::to_string(l.pp) +
               (l.zero3 ? "-zero3" : ""),
           worst);
    CHECK(worst <= 1e-5);
  }
}

TEST_CASE("ONNX import refuses what it does not support, naming it", "[onnx]") {
  using Catch::Matchers::ContainsSubstring;
  auto refuse = [](std::string const& file) {
    try {
      telar::onnx::import_model<float>(fixture(file));
    } catch (telar::onnx::OnnxError const& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string const op = refuse("bad_op.onnx");
  CHECK_THAT(op, ContainsSubstring("(Softplus)") &&
                     ContainsSubstring("operator Softplus is not supported (its input '") &&
                     ContainsSubstring("' is [4] per sample)") &&
                     ContainsSubstring("supported: Gemm") && ContainsSubstring("bad_op.onnx"));
  // import_graph refuses the same, naming itself.
  try {
    telar::onnx::import_graph<float>(fixture("bad_op.onnx"));
    FAIL("import_graph took bad_op.onnx");
  } catch (telar::onnx::OnnxError const& e) {
    CHECK_THAT(e.what(), ContainsSubstring("telar::onnx::import_graph: '") &&
                             ContainsSubstring("operator Softplus is not supported"));
  }
  // A Reshape [N, 6] -> [-1, 3] mixes the batch into the rows: named with
  // its logical shape where a layer would need the batch alone.
  CHECK_THAT(refuse("fold_batch.onnx"),
             ContainsSubstring("node 'b1' (Add): shape arithmetic: batch Add 1 is not a multiple "
                               "of a power of the batch size"));
  std::string const rows = refuse("reshape_batch.onnx");
  INFO(rows);
  CHECK_THAT(rows,
             ContainsSubstring("reshape_batch.onnx': node 'y' (Reshape)") &&
                 ContainsSubstring("the logical shape [2*batch, 3] with the batch not alone"));
  CHECK_THAT(refuse("bad_opset.onnx"),
             ContainsSubstring("opset 99") && ContainsSubstring("7 to 21"));
  CHECK_THAT(refuse("float64.onnx"),
             ContainsSubstring("DOUBLE") && ContainsSubstring("float32 (FLOAT)"));
  CHECK_THAT(refuse("missing.onnx"), ContainsSubstring("cannot open"));
  CHECK_THAT(refuse("identity.onnx"),
             ContainsSubstring("identity.onnx") && ContainsSubstring("maps to no layer"));
  CHECK_THAT(refuse("logsoftmax_axis1.onnx"),
             ContainsSubstring("(LogSoftmax)") &&
                 ContainsSubstring("LogSoftmax is supported only as the graph's last node") &&
                 ContainsSubstring("axis 1 of rank 3"));
  struct Case {
    char const* file;
    char const* op;
    char const* says;
  };
  for (Case const c :
       {Case{"asym_pads", "(Conv)", "attribute pads: asymmetric padding"},
        Case{"same_odd", "(Conv)", "attribute auto_pad = SAME_UPPER pads"},
        Case{"convtranspose1d", "(ConvTranspose)", "1-D transposed convolutions"},
        Case{"gemm_alpha", "(Gemm)", "attribute alpha = 2"},
        Case{"gemm_transa", "(Gemm)", "attribute transA = 1"},
        Case{"const_div", "(Div)", "a constant divided by a tensor: no layer"},
        Case{"mul_batch_const", "(Mul)", "the constant 'c' [3, 2, 6, 6] spans the batch"},
        Case{"div_zero", "(Div)", "the constant divisor 'c' holds a zero"},
        Case{"add_batch_const", "(Add)", "the constant 'c' [3, 2, 6, 6] spans the batch"},
        Case{"pool_dilations", "(MaxPool)", "attribute dilations"},
        Case{"pool_rect", "(AveragePool)", "equal along every axis"},
        Case{"pool1d", "(MaxPool)", "attribute kernel_shape has 1 entries"},
        Case{"ceil_pad", "(MaxPool)", "attribute ceil_mode = 1 with a last window"},
        Case{"resize_cubic", "(Resize)", "attribute mode = 'cubic'"},
        Case{"resize_frac", "(Resize)", "integer upsampling factors only"},
        Case{"resize_asym", "(Resize)", "attribute coordinate_transformation_mode = 'asymmetric'"},
        Case{"concat_axis", "(Concat)", "Concat joins along the channels"},
        Case{"where_mask", "(Where)", "its condition 'causal' [3, 3] does not match the last axes"},
        Case{"where_tensors", "(Where)", "a constant float32 scalar and a tensor"},
        Case{"gather_data", "(Gather)", "a constant table by the graph's integer input"},
        Case{"gather_batch", "(Gather)",
             "gathers along axis 0 of the logical shape [batch, 6], "
             "which holds the batch"},
        Case{"squeeze_wide", "(Squeeze)",
             "squeezes axis 1 of the logical shape [batch, 6], whose "
             "extent is not 1"},
        Case{"tied", "(Gemm)", "shared (tied) parameters"},
        Case{"dead", "(Tanh)", "does not reach the graph output"},
        Case{"pow_tensor", "(Pow)", "its exponent 'c' must be a constant with one value"},
        Case{"avgpool_dilations", "(AveragePool)", "attribute dilations is not supported"},
        Case{"split_batch", "(Split)", "splits axis 0 of the logical shape [batch, 2, 6, 6]"},
        Case{"equal_tensor", "(Equal)", "Equal is supported only of two constants"},
        Case{"layernorm_batch", "(LayerNormalization)", "normalises over the batch"},
        Case{"layernorm_mean", "(LayerNormalization)", "its output Mean 'mean' is read"}}) {
    std::string const file = std::string(c.file) + ".onnx";
    INFO(file);
    CHECK_THAT(refuse(file),
               ContainsSubstring(file) && ContainsSubstring(c.op) && ContainsSubstring(c.says));
  }
}

TEST_CASE("ONNX import: graphs become DynamicGraph layers between chain layers", "[onnx]") {
  auto graphs = [](Imported& imp) {
    std::size_t n = 0;
    imp.model.for_each_layer([&](auto, auto& l) {
      n += std::is_same_v<std::decay_t<decltype(l)>,
                          telar::DynamicGraph<telar::onnx::NodeLayer<float>>>;
    });
    return n;
  };
  // ResNet-18: conv1, bn1, relu, maxpool; 8 blocks (a graph each, joined by
  // an Add) with a Relu after each; GlobalAveragePool, Flatten, Gemm.
  Imported resnet = telar::onnx::import_model<float>(fixture("resnet18.onnx"));
  CHECK(graphs(resnet) == 8);
  CHECK(resnet.model.layer_count() == 4 + 8 * 2 + 3);
  // MobileNetV2: 10 of its 17 inverted residual blocks have a skip; the
  // skip blocks of one stage follow each other, so each stage with skips
  // (5 of 7) is one graph.
  Imported mobile = telar::onnx::import_model<float>(fixture("mobilenetv2.onnx"));
  CHECK(graphs(mobile) == 5);
  // The encoder: Dense; attention with its residual Add (one graph: Q K^T
  // and weights x V are MatMul joins); LayerNorm; the feed-forward and its
  // Add; LayerNorm; the mean over the tokens (Rearrange, GlobalAvgPool); Dense.
  Imported enc = telar::onnx::import_model<float>(fixture("encoder.onnx"));
  CHECK(graphs(enc) == 2);
  CHECK(enc.model.layer_count() == 8);
  // One tensor into two Gemms, concatenated; a residual inside a residual;
  // a BatchNorm1d (its initializers shared through Identity nodes).
  for (char const* file : {"branch.onnx", "nested.onnx", "batchnorm.onnx"}) {
    INFO(file);
    Imported imp = telar::onnx::import_model<float>(fixture(file));
    CHECK(graphs(imp) == (std::string(file) == "batchnorm.onnx" ? 0 : 1));
    imp.model.build(imp.input_shape);
    imp.model.initialize(0);
  }
}

namespace {

// An imported model's parameters by name (after initialize: the file's).
template <class M>
std::map<std::string, std::vector<float>> parameter_values(M& model) {
  std::map<std::string, std::vector<float>> out;
  model.parameters([&](char const* name, auto& value, auto&) {
    auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, value);
    out[name] = std::vector<float>(h.data(), h.data() + h.size());
  });
  return out;
}

template <class L>
struct is_graph : std::false_type {};
template <class V>
struct is_graph<telar::DynamicGraph<V>> : std::true_type {};

// Layers of an imported model that multiply, in the chain and in its graphs:
// {fp32, bf16} (Dense, Megatron pairs, convolutions).
template <class M>
std::pair<int, int> multiplying_layers(M const& model) {
  std::pair<int, int> n{0, 0};
  auto count = [&](auto const& self, auto const& l) -> void {
    using L = std::decay_t<decltype(l)>;
    if constexpr (is_graph<L>::value)
      l.for_each_layer([&](auto, auto const& inner) { self(self, inner); });
    else if constexpr (telar::detail::computes_bf16_v<L>)
      ++n.second;
    else if constexpr (telar::detail::computes_bf16_v<telar::detail::bf16_rebind_t<L>>)
      ++n.first;
  };
  model.for_each_layer([&](auto, auto const& l) { count(count, l); });
  return n;
}

} // namespace

// Under Precision<bf16, float> an imported model is rebound as a
// compile-time one (what onnx_train --precision bf16 trains): every Dense,
// Megatron pair and convolution, in the chain and inside its graphs, runs
// Bf16Gemm / telar::bf16_conv_policy_t; the import's initializer hook survives the
// rebind, so it starts from the file's values, bit for bit; its outputs are
// PyTorch's within bf16's rounding, and not fp32's (bf16 ran).
TEST_CASE("ONNX import under Precision<bf16, float>: bf16 layers from the file's values",
          "[onnx][bf16]") {
  using P = telar::Precision<telar::bf16, float>;
  if constexpr (!telar::bf16_layers_supported<float, telar::DefaultMemorySpace>()) {
    SKIP("no bf16 layers in this memory space (neither oneDNN nor cuBLAS)");
  } else {
    if (!telar::bf16_available<telar::DefaultMemorySpace>())
      SKIP("no bf16 instructions here: bf16 is refused, not emulated");
    Manifest const mf = manifest();
    // cnn: convolutions and Dense; resmlp: a residual graph; encoder:
    // attention's projections in a graph (its MatMul joins stay fp32).
    for (std::string const& name : {"cnn", "resmlp", "encoder"})
      for (bool tp : {false, true}) {
        INFO(name << (tp ? " with Megatron pairs" : ""));
        telar::onnx::ImportOptions io;
        io.tensor_parallel = tp;
        Imported imp = telar::onnx::import_model<float>(fixture(name + ".onnx"), io);
        auto bf = telar::with_precision<P>(imp.model);
        auto const [fp32_layers, bf16_layers] = multiplying_layers(bf);
        CHECK(fp32_layers == 0);
        CHECK(bf16_layers == multiplying_layers(imp.model).first);
        CHECK(bf16_layers >= 2);
        imp.model.build(imp.input_shape);
        imp.model.initialize(0);
        bf.build(imp.input_shape);
        bf.initialize(0);
        CHECK(parameter_values(bf) == parameter_values(imp.model));
        auto const x = to_matrix(read_bin<float>(name + "_x.bin"), mf.n);
        auto const want = read_bin<float>(name + "_y.bin");
        double const err = rel_err(to_vector(telar::onnx::predict(bf, x)), want);
        double const fp32 = rel_err(to_vector(telar::onnx::predict(imp.model, x)), want);
        INFO("relative error: bf16 " << err << ", fp32 " << fp32);
        report(name + " bf16 forward", err);
        CHECK(err <= 3e-2);
        CHECK(err > 10 * fp32);
      }
  }
}

namespace {

// Fixture <name>.onnx imported, built and initialised, its forward output on
// <name>_x.bin and PyTorch's (or numpy's) on it, <name>_y.bin.
struct Forward {
  Imported imported;
  std::vector<float> got, want;
};
Forward forward_of(std::string const& name, std::size_t n) {
  Forward f{telar::onnx::import_model<float>(fixture(name + ".onnx")), {}, {}};
  f.imported.model.build(f.imported.input_shape);
  f.imported.model.initialize(0);
  f.got = to_vector(
      telar::onnx::predict(f.imported.model, to_matrix(read_bin<float>(name + "_x.bin"), n)));
  f.want = read_bin<float>(name + "_y.bin");
  return f;
}

} // namespace

TEST_CASE("ONNX import: negative axes count from the end; an active Dropout trains", "[onnx]") {
  Manifest const mf = manifest();
  Forward const flat = forward_of("flatten_neg", mf.n);
  CHECK(rel_err(flat.got, flat.want) <= 1e-6);

  // A Softmax over axis 1 of [N, 4, 5], the graph's last node: a telar::Softmax layer.
  Forward const soft = forward_of("softmax_axis1", mf.n);
  CHECK(soft.imported.output_activation.empty());
  CHECK(rel_err(soft.got, soft.want) <= 1e-6);

  // Opset 7's Upsample (scales an attribute), opset 20's Gelu node.
  Forward const up = forward_of("upsample7", mf.n);
  CHECK(rel_err(up.got, up.want) == 0);
  Forward const gelu = forward_of("gelu20", mf.n);
  CHECK(rel_err(gelu.got, gelu.want) <= 1e-6);

  // A Where whose mask is an Equal of two literals, folded at import.
  Forward const mask = forward_of("equal_mask", mf.n);
  CHECK(mask.imported.model.layer_count() == 2);
  CHECK(rel_err(mask.got, mask.want) == 0);

  // A Slice of axes 1 and -1 of [N, 4, 5]: two Rearrange::slice layers.
  Forward const cut = forward_of("slice2", mf.n);
  CHECK(cut.imported.model.layer_count() == 2);
  CHECK(rel_err(cut.got, cut.want) == 0);

  // PyTorch 2's packed q/k/v split (Reshape folded through Mod, Unsqueeze,
  // Transpose, Squeeze, Gather of one index) and its attention scale
  // (float32 arithmetic on a Shape): a Dense, a Rearrange::slice, a Scale.
  Forward const split = forward_of("sdpa_split", mf.n);
  CHECK(rel_err(split.got, split.want) <= 1e-6);
  // The extent-1 axis a Gather leaves, regrouped beside the batch: dropped
  // when the output is stored [batch, 6, 4] (else refused as a moved batch).
  Forward const unit = forward_of("batch_unit", mf.n);
  CHECK(rel_err(unit.got, unit.want) == 0);

  Imported drop = telar::onnx::import_model<float>(fixture("dropout_active.onnx"));
  REQUIRE(drop.model.layer_count() == 3);
  double p = -1;
  drop.model.for_each_layer([&](auto, auto& l) {
    if constexpr (std::is_same_v<std::decay_t<decltype(l)>, telar::Dropout<float>>)
      p = l.probability();
  });
  CHECK(p == 0.25);
}

// ONNX's node conformance tests for the supported operators, as
// node_tests.py converts them (ctest onnx_node_conformance runs this hidden
// case with TELAR_ONNX_NODE_TESTS set): each passes within 1e-5 relative,
// or is refused with an OnnxError; a wrong result or another exception fails.
TEST_CASE("ONNX node conformance tests", "[.conformance]") {
  char const* dir = std::getenv("TELAR_ONNX_NODE_TESTS");
  REQUIRE(dir != nullptr);
  std::ifstream list(std::string(dir) + "/cases.txt");
  REQUIRE(list);
  struct Count {
    int passed = 0, refused = 0, wrong = 0, error = 0, skipped = 0;
  };
  std::map<std::string, Count> counts;
  std::vector<std::string> notes;
  auto read = [&](std::string const& file) {
    std::ifstream in(file, std::ios::binary | std::ios::ate);
    std::vector<float> v(std::size_t(in.tellg()) / sizeof(float));
    in.seekg(0);
    in.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
    return v;
  };
  std::string line;
  while (std::getline(list, line)) {
    std::istringstream ls(line);
    std::string name, op, rows_s;
    std::size_t last = 1;
    ls >> name >> op >> rows_s;
    Count& c = counts[op];
    if (rows_s == "skip") {
      std::string why;
      std::getline(ls, why);
      ++c.skipped;
      notes.push_back(name + ": skipped:" + why);
      continue;
    }
    ls >> last;
    std::string const d = std::string(dir) + "/" + name;
    try {
      Imported imp = telar::onnx::import_model<float>(d + "/model.onnx");
      imp.model.build(imp.input_shape);
      imp.model.initialize(0);
      auto const x = read(d + "/x.bin");
      auto const want = read(d + "/y.bin");
      std::size_t const rows = std::stoul(rows_s);
      auto got = to_vector(telar::onnx::predict(imp.model, to_matrix(x, rows)));
      if (!imp.output_activation.empty() && got.size() % last == 0) // the loss's softmax
        for (std::size_t r = 0; r < got.size() / last; ++r) {
          float* v = got.data() + r * last;
          float const m = *std::max_element(v, v + last);
          double sum = 0;
          for (std::size_t j = 0; j < last; ++j)
            sum += std::exp(double(v[j] - m));
          for (std::size_t j = 0; j < last; ++j)
            v[j] = imp.output_activation == "Softmax" ? float(std::exp(double(v[j] - m)) / sum)
                                                      : float(double(v[j] - m) - std::log(sum));
        }
      double const err = got.size() == want.size() ? rel_err(got, want) : 1e30;
      if (err <= 1e-5) {
        ++c.passed;
      } else {
        ++c.wrong;
        notes.push_back(name + ": WRONG, relative error " + std::to_string(err) + " (" +
                        std::to_string(got.size()) + " values, expected " +
                        std::to_string(want.size()) + ")");
      }
    } catch (telar::onnx::OnnxError const& e) {
      ++c.refused;
      std::string why = e.what();
      if (auto const p = why.find(".onnx': "); p != std::string::npos)
        why = why.substr(p + 8);
      notes.push_back(name + ": refused: " + why.substr(0, 300));
    } catch (std::exception const& e) {
      ++c.error;
      notes.push_back(name + ": ERROR (not an OnnxError): " + std::string(e.what()).substr(0, 300));
    }
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Count total;
  if (rank == 0) {
    std::printf(
        "| operator | passed | refused | skipped | wrong | error |\n|---|---|---|---|---|---|\n");
    for (auto const& [op, c] : counts)
      std::printf("| %s | %d | %d | %d | %d | %d |\n", op.c_str(), c.passed, c.refused, c.skipped,
                  c.wrong, c.error);
    for (auto const& n : notes)
      std::printf("%s\n", n.c_str());
  }
  for (auto const& [op, c] : counts) {
    total.passed += c.passed, total.refused += c.refused, total.wrong += c.wrong;
    total.error += c.error, total.skipped += c.skipped;
  }
  if (rank == 0)
    std::printf("total: %d passed, %d refused, %d skipped, %d wrong, %d errors\n", total.passed,
                total.refused, total.skipped, total.wrong, total.error);
  CHECK(total.passed > 0);
  CHECK(total.wrong == 0);
  CHECK(total.error == 0);
}
