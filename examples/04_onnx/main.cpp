// Example 04: Telar as an HPC back-end for PyTorch models. Imports a model
// exported with torch.onnx.export, trains it on Fashion-MNIST under any
// composition of data, pipeline and tensor parallelism, and writes the
// trained weights back into the same ONNX graph for PyTorch to load.
//
//   onnx_train --model FILE.onnx [--export OUT.onnx] [--epochs 1] [--batch 64]
//              [--lr 1e-3] [--optimizer adamw] [--seed 1] [--data DIR] [--json]
//              [--dp N] [--pp N] [--tp N] [--schedule 1f1b] [--microbatches M]
//              [--timeline PREFIX] [--limit-steps N] [--memory-budget SIZE]
//              [--layout auto|manual] [--dry-run] [--profile PATH] [--classes K]
//              [--predict IN.npy --output OUT.npy] [--precision fp32|bf16] [--bf16-weight-copy 1|0]
//   mpirun -np 2 onnx_train --model mlp.onnx --tp 2 --export mlp_trained.onnx
//
// --layout auto: the planner's fastest layout that fits (tensor parallelism
// included when the graph has Megatron pairs); --dry-run: its ranking, no
// training (docs/planner.md).
//
// The model takes Fashion-MNIST images: an input [batch, 784] or
// [batch, 1, 28, 28] and 10 logits out (see docs/onnx.md for the operators).
// --data synthetic trains any input shape instead, on synthetic samples of it
// in --classes K classes (default: as many as the model has outputs; 8
// batches per epoch): how an imported ResNet-50 is timed against the native
// one of example 06. --predict IN.npy --output OUT.npy runs the file's model
// forward in evaluation mode on a NumPy batch [n, input shape...] and writes
// its outputs [n, output shape...] (no training).
// Under --tp, each Gemm, activation, Gemm run becomes a Megatron pair.
//
// --precision bf16 adds telar::Precision<telar::bf16, float> to the strategy:
// the Trainer rebinds the imported model as it does a compile-time one, so
// every Dense (Gemm, MatMul by a weight, the Megatron pairs) and convolution,
// in the chain and inside its graphs, multiplies through oneDNN's bf16
// kernels (telar::Bf16Gemm, telar::OneDnnConvBf16), starting from the file's
// values. The graphs' joins (Add, Concat, Mul, Sub, Div and the batched
// MatMul of attention), norms, softmax, the loss, the weights and the
// optimizer state stay fp32 (docs/precision.md, docs/onnx.md). With AdamW only
// (one more Trainer type to compile); --predict runs the same bf16 model. The
// JSON summary gains "precision", "gemm", "conv" and "gemm_kernels" (the
// oneDNN implementations that ran, e.g. matmul:brg:avx512_core_bf16).
#include <telar/telar.hpp>

#include <telar/onnx/export.hpp>
#include <telar/onnx/import.hpp>

#include "layout_planning.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace {

struct Args : example::CommonArgs {
  Args() : CommonArgs(/*epochs*/ 1, /*hidden*/ 1) { takes_precision = true; }
  std::string model;       // the .onnx file to import
  std::string export_path; // where to write the trained model (optional)
  std::size_t classes = 0; // --data synthetic: classes (0: the model's outputs)
  std::string predict;     // --predict IN.npy: forward only
  std::string output;      // --output OUT.npy: where --predict writes
  bool synthetic() const { return data == "synthetic"; }
};

[[noreturn]] void usage(char const* why) {
  std::fprintf(stderr,
               "onnx_train: %s\n"
               "usage: onnx_train --model FILE.onnx [--export OUT.onnx] [--epochs N] "
               "[--batch N] [--lr X] [--optimizer sgd|momentum|adam|adamw|lamb] [--seed N] "
               "[--data DIR] [--json] [--dp N] [--pp N] [--tp N] [--schedule %s] "
               "[--microbatches M] [--timeline PREFIX] [--limit-steps N] "
               "[--memory-budget SIZE] [--layout auto|manual] [--dry-run] [--profile PATH] "
               "[--classes K] [--predict IN.npy --output OUT.npy] [--precision fp32|bf16] "
               "[--bf16-weight-copy 1|0]\n",
               why, example::schedule_choices().c_str());
  throw 2;
}

Args parse(int argc, char** argv) {
  Args a;
  example::ArgReader r(argc, argv, usage);
  while (r.next()) {
    std::string const& f = r.flag();
    if (f == "--model")
      a.model = r.value();
    else if (f == "--export")
      a.export_path = r.value();
    else if (f == "--schedule")
      a.schedule = r.value();
    else if (f == "--classes")
      a.classes = std::size_t(r.integer(1));
    else if (f == "--predict")
      a.predict = r.path("a .npy file");
    else if (f == "--output")
      a.output = r.path("a .npy file");
    else if (!example::read_common_flag(r, a))
      usage(("unknown flag " + f).c_str());
  }
  example::check_common(a, usage);
  if (a.predict.empty()) // --predict trains nothing: no optimizer
    example::check_bf16_run(a, usage);
  if (a.model.empty())
    usage("--model FILE.onnx is required");
  if (a.predict.empty() != a.output.empty())
    usage("--predict IN.npy and --output OUT.npy go together");
  if (a.classes > 0 && !a.synthetic())
    usage("--classes is for --data synthetic (Fashion-MNIST has 10)");
  return a;
}

using T = float;
using Model = telar::onnx::Model<T>;
using Strategy = telar::Strategy<telar::DataParallel<telar::RingAllreduce>,
                                 telar::PipelineParallel<telar::OneFOneB>, telar::TensorParallel<>>;

std::string join(std::vector<std::string> const& names) {
  std::string s;
  for (auto const& n : names)
    s += (s.empty() ? "" : " ") + n;
  return s;
}

// The graph as Telar layers; tensor_parallel: Gemm pairs as Megatron pairs.
telar::onnx::Imported<T> import_graph(Args const& a, bool tensor_parallel) {
  telar::onnx::ImportOptions io;
  io.tensor_parallel = tensor_parallel;
  auto imported = telar::onnx::import_model<T>(a.model, io);
  if (!a.synthetic() && a.predict.empty() && imported.input_shape.size() != 784)
    throw telar::Error("onnx_train: '" + a.model + "' takes inputs " + imported.input_shape.str() +
                       "; Fashion-MNIST needs 784 values per sample ([784] or [1, 28, 28]); "
                       "--data synthetic trains on synthetic samples of any shape");
  return imported;
}

std::size_t synthetic_size(Args const& a) {
  return std::max<std::size_t>(8 * a.batch, 64);
}

// Fashion-MNIST, or --data synthetic samples of the model's input shape in
// --classes classes (default: as many as it has outputs).
telar::FashionMnist load_data(Args const& a, telar::Shape const& in, std::size_t outputs) {
  if (!a.synthetic())
    return telar::load_fashion_mnist(a.data);
  if (a.classes > outputs)
    throw telar::Error("onnx_train: --classes " + std::to_string(a.classes) + " but '" + a.model +
                       "' has " + std::to_string(outputs) + " outputs per sample");
  int const classes = int(a.classes > 0 ? a.classes : outputs);
  return example::synthetic_data(synthetic_size(a), in, classes, a.seed);
}

// --predict IN.npy --output OUT.npy: the file's model forward in evaluation
// mode on the batch, as a Trainer under precision P trains it; outputs
// written by rank 0 (every rank computes them).
template <class P>
int predict(MPI_Comm comm, Args const& a) {
  auto const imported = telar::onnx::import_model<T>(a.model);
  auto model = telar::with_precision<P>(imported.model);
  telar::NpyArray const in = telar::read_npy(a.predict);
  telar::Shape const& s = imported.input_shape;
  std::size_t const n = in.shape.empty() ? 0 : in.shape[0];
  if (n == 0 || in.values.size() != n * s.size())
    throw telar::Error("onnx_train: '" + a.predict + "' holds " + std::to_string(in.values.size()) +
                       " values; '" + a.model + "' takes batches [n, " + s.str().substr(1));
  model.build(s);
  model.initialize(0); // the file's weights
  telar::Matrix<T> x("onnx_train::predict", n, s.size());
  auto hx = Kokkos::create_mirror_view(x);
  std::copy(in.values.begin(), in.values.end(), hx.data());
  Kokkos::deep_copy(x, hx);
  auto const y = telar::onnx::predict(model, x);
  auto const hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, y);
  telar::Shape const out = model.output_shape(s);
  std::vector<std::size_t> shape{n};
  for (int d = 0; d < out.rank; ++d)
    shape.push_back(out[d]);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0) {
    telar::write_npy(a.output, shape, std::vector<float>(hy.data(), hy.data() + hy.size()));
    std::fprintf(stderr, "onnx_train: %zu outputs of %s written to %s\n", n, out.str().c_str(),
                 a.output.c_str());
  }
  return 0;
}

// --layout auto / --dry-run / --memory-budget: the layouts of the strategy
// type this run trains (S: Strategy, or it with bf16 compute, whose model is
// planned as the Trainer rebinds it), tensor parallelism included (the graph
// imported with its Megatron pairs, which run plainly at tp 1).
template <class S, class Optimizer>
int train(MPI_Comm comm, Args const& given, Optimizer opt) {
  Args a = given;
  std::optional<telar::LayoutPlan> plan;
  if (!example::plan_run(comm, a, plan, "onnx_train", [&] {
        auto const planned = import_graph(a, true);
        return example::plan_of<Model, S, Optimizer>(comm, a, planned.model, planned.input_shape);
      }))
    return 0;
  auto const imported = import_graph(a, a.tp > 1);
  telar::TrainerOptions const opts = example::trainer_options(
      a, a.synthetic() ? synthetic_size(a) : telar::fashion_mnist_train_size(a.data), comm);
  auto trainer = example::with_fastest_fitting(plan, [&] {
    return telar::Trainer<Model, S, Optimizer>(comm, imported.model, opt, opts,
                                               imported.input_shape);
  });
  std::size_t const outputs = trainer.shapes().back().size();
  if (!a.synthetic() && outputs != 10)
    throw telar::Error("onnx_train: '" + a.model + "' has " + std::to_string(outputs) +
                       " outputs per sample; Fashion-MNIST has 10 classes");
  example::Preflight const checked = example::preflight(trainer, a, "onnx_train");
  telar::FashionMnist const data = load_data(a, imported.input_shape, outputs);
  if (trainer.rank() == 0)
    std::fprintf(stderr, "onnx_train: %s, %zu layers (%s), input %s, %s, layout %s\n",
                 a.model.c_str(), imported.model.layer_count(),
                 join(imported.model.layer_names()).c_str(), imported.input_shape.str().c_str(),
                 Optimizer::name(), trainer.layout().c_str());
  auto test_set = example::test_set(data.test, data.test.size);
  example::Result r = example::fit(trainer, a, checked, data, test_set);
  r.predicted_ms =
      example::predicted_step_ms(comm, a, imported.model, trainer, imported.input_shape);
  example::write_timeline(trainer, a.timeline, "onnx_train");
  if (!a.export_path.empty()) {
    telar::onnx::export_trained(trainer, imported, a.export_path); // collective
    if (trainer.rank() == 0)
      std::fprintf(stderr, "onnx_train: trained model written to %s\n", a.export_path.c_str());
  }
  telar::JsonObject config = example::common_config(trainer, a);
  config.add("model", a.model)
      .add("export", a.export_path)
      .add("data", a.data)
      .add("gemm", example::gemm_name(a.precision))
      .add("conv", example::conv_name(a.precision));
  example::report(trainer, a, r, config);
  return 0;
}

// --precision bf16: the model under Strategy with telar::Precision<telar::bf16,
// float> (a build with neither oneDNN in host memory nor cuBLAS in CUDA
// memory has no bf16 Trainer to instantiate).
int run_bf16(MPI_Comm comm, Args const& a) {
  if constexpr (telar::bf16_layers_supported<T, telar::DefaultMemorySpace>()) {
    telar::require_bf16<telar::DefaultMemorySpace>(
        "--precision bf16"); // before the import and the data
    using P = telar::Precision<telar::bf16, float>;
    return a.predict.empty() ? train<example::Bf16<Strategy>>(comm, a, telar::AdamW<T>{})
                             : predict<P>(comm, a);
  } else {
    usage("--precision bf16 needs oneDNN (host memory) or cuBLAS (CUDA memory)");
  }
}

int run(MPI_Comm comm, int argc, char** argv) {
  Args const a = parse(argc, argv);
  if (a.precision == "bf16")
    return run_bf16(comm, a);
  if (!a.predict.empty())
    return predict<telar::Precision<float, float>>(comm, a);
  return example::with_optimizer<T>(a.optimizer, usage,
                                    [&](auto opt) { return train<Strategy>(comm, a, opt); });
}

} // namespace

int main(int argc, char** argv) {
  return example::run_main(argc, argv, "onnx_train", run);
}
