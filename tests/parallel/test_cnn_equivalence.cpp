// A small residual CNN trains to the serial parameters under data, pipeline
// (stages split between blocks; 1F1B and ZB-H1) and tensor parallelism (the
// Dense pair), and under dp x pp and dp x tp: checked on the L2 norm of every
// parameter tensor and of all of them (relative 1e-5 in float, 1e-11 in
// double) after a few steps, at whatever world size the test runs with.
// A CNN that branches (an Inception-like Concat, a DenseConcat, a
// squeeze-excitation Mul) matches serial training under dp and pp.
// Under telar::Precision<bf16, float> (every convolution and Dense rebound
// to bf16 compute) the CNN matches the bf16 serial run under dp, pp and tp.
#include "equivalence.hpp"

#include <telar/core/branches.hpp>
#include <telar/core/residual.hpp>
#include <telar/data/synthetic.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/parallel/precision.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace {

telar::Shape const image{2, 8, 8};
std::size_t const features = 2 * 8 * 8, classes = 4;

// conv, residual block, max-pool, flatten, a Megatron pair.
template <class T>
using Cnn = telar::Sequential<telar::Conv2D<T>, telar::ReLU<T>,
                              telar::Residual<telar::Conv2D<T>, telar::ReLU<T>, telar::Conv2D<T>>,
                              telar::ReLU<T>, telar::MaxPool2D<T>, telar::Flatten<T>,
                              telar::ColumnParallel<telar::Dense<T>>, telar::ReLU<T>,
                              telar::RowParallel<telar::Dense<T>>>;
template <class T>
Cnn<T> make_cnn() {
  using C = telar::Conv2D<T>;
  return Cnn<T>(C(2, 4, 3, 1, 1), {},
                telar::Residual<C, telar::ReLU<T>, C>(C(4, 4, 3, 1, 1), {}, C(4, 4, 3, 1, 1)), {},
                telar::MaxPool2D<T>(2), {}, telar::ColumnParallel<telar::Dense<T>>(64, 16), {},
                telar::RowParallel<telar::Dense<T>>(16, classes));
}

// conv, Inception-like Concat (1x1 | 1x1 -> 3x3), a DenseConcat (x | 3x3),
// squeeze-excitation, max-pool, flatten, Dense: [2, 8, 8] -> ... -> [6, 8, 8].
template <class T>
using C = telar::Conv2D<T>;
template <class T>
using Inception = telar::Concat<C<T>, telar::Sequential<C<T>, telar::ReLU<T>, C<T>>>;
template <class T>
using Excite = telar::Sequential<telar::GlobalAvgPool<T>, telar::Dense<T>, telar::ReLU<T>,
                                 telar::Dense<T>, telar::Sigmoid<T>>;
template <class T>
using BranchyCnn = telar::Sequential<C<T>, telar::ReLU<T>, Inception<T>, telar::ReLU<T>,
                                     telar::DenseConcat<C<T>, telar::ReLU<T>>,
                                     telar::Mul<telar::Identity<T>, Excite<T>>, telar::MaxPool2D<T>,
                                     telar::Flatten<T>, telar::Dense<T>>;
template <class T>
BranchyCnn<T> make_branchy_cnn() {
  using D = telar::Dense<T>;
  return BranchyCnn<T>(
      C<T>(2, 4, 3, 1, 1), {},
      Inception<T>(C<T>(4, 2, 1), telar::Sequential<C<T>, telar::ReLU<T>, C<T>>(
                                      C<T>(4, 2, 1), {}, C<T>(2, 2, 3, 1, 1))),
      {}, telar::DenseConcat<C<T>, telar::ReLU<T>>(C<T>(4, 2, 3, 1, 1), {}),
      telar::Mul<telar::Identity<T>, Excite<T>>({}, Excite<T>({}, D(6, 3), {}, D(3, 6), {})),
      telar::MaxPool2D<T>(2), {}, D(6 * 4 * 4, classes));
}

using Full =
    telar::Strategy<telar::DataParallel<>, telar::PipelineParallel<>, telar::TensorParallel<>>;

using telar::test::require_same;
using telar::test::world_size;
// The rebind the bf16 policy makes: convolutions (inside Residual too) and
// the tensor-parallel Dense pair take the bf16 policies; the rest stays.
using Bf16 = telar::Precision<telar::bf16, float>;
using FullBf16 = telar::Strategy<telar::DataParallel<>, telar::PipelineParallel<>,
                                 telar::TensorParallel<>, Bf16>;
// Gradients reduced in bf16 too.
using DpBf16Reduce =
    telar::Strategy<telar::DataParallel<>, telar::Precision<telar::bf16, float, telar::bf16>>;
// ZeRO-3 under bf16: parameters gathered as bf16.
using Zero3Bf16 = telar::Strategy<telar::DataParallel<telar::RingAllreduce, telar::ZeRO<3>>, Bf16>;
// ZeRO with gradients reduce-scattered in bf16 too.
template <int Stage>
using ZeroBf16Reduce =
    telar::Strategy<telar::DataParallel<telar::RingAllreduce, telar::ZeRO<Stage>>,
                    telar::Precision<telar::bf16, float, telar::bf16>>;
static_assert(
    std::is_same_v<telar::WithPrecision<Cnn<float>, telar::Precision<float>>, Cnn<float>>);

template <class T>
struct Data {
  telar::Matrix<T> x;
  telar::Labels<> y;
};
template <class T>
Data<T> make_data(std::size_t n) {
  auto ds = telar::make_synthetic(n, features, classes, 42);
  Data<T> d{telar::Matrix<T>("x", n, features), telar::Labels<>("y", n)};
  auto hx = Kokkos::create_mirror_view(d.x);
  auto hy = Kokkos::create_mirror_view(d.y);
  for (std::size_t i = 0; i < n; ++i) {
    hy(i) = ds.y[i];
    for (std::size_t j = 0; j < features; ++j)
      hx(i, j) = T(ds.x[i * features + j]);
  }
  Kokkos::deep_copy(d.x, hx);
  Kokkos::deep_copy(d.y, hy);
  return d;
}

// The norms, and the bytes sent over the data-parallel group.
struct Result : telar::test::NormResult {
  std::uint64_t dp_bytes = 0;
};

template <class T, class Strategy, class Opt, class Model = Cnn<T>>
Result train(MPI_Comm comm, Opt opt, telar::TrainerOptions opts, Data<T> const& data,
             std::size_t batch, int steps, Model model = make_cnn<T>()) {
  telar::Trainer<Model, Strategy, Opt> trainer(comm, std::move(model), opt, opts, image);
  int const dp = trainer.grid_shape().dp, d = trainer.grid_coords().dp;
  std::size_t const local = batch / std::size_t(dp);
  for (int s = 0; s < steps; ++s) {
    std::size_t const b = std::size_t(s) * batch + std::size_t(d) * local;
    trainer.step(telar::rows(data.x, b, b + local), telar::rows(data.y, b, b + local));
  }
  auto const* grid = trainer.grid();
  return {{trainer.param_l2(), trainer.tensor_norms()}, grid ? grid->dp().bytes_sent() : 0};
}

using telar::test::worst_difference;

struct Layout {
  int dp, pp, tp;
  char const* schedule;
  int microbatches;
};

telar::TrainerOptions with_layout(telar::TrainerOptions opts, Layout const& l) {
  opts.grid = {l.dp, l.pp, l.tp};
  opts.schedule = l.schedule;
  opts.microbatches = l.microbatches;
  return opts;
}

} // namespace

TEMPLATE_TEST_CASE("A residual CNN matches serial training under every strategy",
                   "[equivalence][cnn]", float, double) {
  using T = TestType;
  int const n = world_size();
  double const tol = std::is_same_v<T, float> ? 1e-5 : 1e-11;
  std::size_t const batch = 16;
  int const steps = 3;
  auto const data = make_data<T>(batch * steps);
  telar::SGD<T> sgd;
  sgd.momentum = T(0.9);
  telar::TrainerOptions base;
  base.seed = 11;
  base.lr = telar::constant_lr(0.05);

  std::vector<Layout> layouts{{n, 1, 1, "1f1b", 1}}; // data parallel
  if (n > 1) {
    layouts.push_back({1, n, 1, "1f1b", 4}); // pipeline
    layouts.push_back({1, n, 1, "zb-h1", 4});
    layouts.push_back({1, 1, n, "1f1b", 1}); // tensor parallel
  }
  if (n == 4) {
    layouts.push_back({2, 2, 1, "1f1b", 2}); // dp x pp
    layouts.push_back({2, 2, 1, "zb-h1", 2});
    layouts.push_back({2, 1, 2, "1f1b", 1}); // dp x tp
    layouts.push_back({1, 2, 2, "1f1b", 2}); // pp x tp
    layouts.push_back({1, 2, 2, "interleaved", 4});
  }
  if (n == 8)
    layouts.push_back({2, 2, 2, "zb-h1", 2}); // dp x pp x tp

  telar::TrainerOptions ref = base;
  ref.grid = {1, 1, 1};
  ref.schedule.clear();
  Result const want = train<T, telar::Serial>(MPI_COMM_SELF, sgd, ref, data, batch, steps);
  for (auto const& l : layouts) {
    telar::TrainerOptions const opts = with_layout(base, l);
    std::string const what = "dp=" + std::to_string(l.dp) + " pp=" + std::to_string(l.pp) +
                             " tp=" + std::to_string(l.tp) + " " + l.schedule +
                             " m=" + std::to_string(l.microbatches);
    require_same(train<T, Full>(MPI_COMM_WORLD, sgd, opts, data, batch, steps), want, tol, what);
  }
}

// One precision (double: the tighter tolerance) and one strategy type, the
// serial reference included, to keep the Trainer instantiations few.
TEST_CASE("A CNN with Concat, DenseConcat and squeeze-excitation matches serial training",
          "[equivalence][cnn][branches]") {
  using T = double;
  int const n = world_size();
  std::size_t const batch = 16;
  int const steps = 3;
  auto const data = make_data<T>(batch * steps);
  telar::SGD<T> sgd;
  sgd.momentum = T(0.9);
  telar::TrainerOptions base;
  base.seed = 5;
  base.lr = telar::constant_lr(0.05);
  auto const run = [&](telar::TrainerOptions opts, MPI_Comm comm) {
    return train<T, Full>(comm, sgd, opts, data, batch, steps, make_branchy_cnn<T>());
  };
  telar::TrainerOptions ref = base;
  ref.grid = {1, 1, 1};
  Result const want = run(ref, MPI_COMM_SELF);
  CHECK(want.norms.size() == 16); // 5 convolutions, 3 Dense: weight and bias each

  std::vector<Layout> layouts{{n, 1, 1, "1f1b", 1}};
  if (n > 1)
    layouts.push_back({1, n, 1, "1f1b", 4});
  if (n == 4)
    layouts.push_back({2, 2, 1, "zb-h1", 2});
  for (auto const& l : layouts) {
    telar::TrainerOptions const opts = with_layout(base, l);
    std::string const what = "dp=" + std::to_string(l.dp) + " pp=" + std::to_string(l.pp) + " " +
                             l.schedule + " m=" + std::to_string(l.microbatches);
    require_same(run(opts, MPI_COMM_WORLD), want, 1e-11, what);
  }
}

// bf16 compute by the strategy alone (the model type is Cnn<float>). Layouts
// differ only in how fp32 sums are split; a bf16 rounding that flips with
// them moves a product by at most the documented bound (docs/precision.md:
// 2u + u^2 + (K + 2) 2^-24 = 7.9e-3 of |A||B| for these K), so every tensor
// norm agrees with the bf16 serial run within it, and no worse than bf16
// serial agrees with fp32 serial (which must differ: bf16 ran).
namespace {
// A template on the memory space, so that where bf16 cannot compute
// (neither oneDNN in host memory nor cuBLAS in CUDA memory) nothing of it is
// instantiated. In CUDA memory the same checks hold, the convolutions
// im2col's and the GEMMs cuBLAS's, but ZeRO-3 gathers fp32 there.
template <class M>
void bf16_cnn_case() {
  if constexpr (!telar::bf16_layers_supported<float, M>()) {
    SKIP("no bf16 layers in this memory space (neither oneDNN nor cuBLAS)");
  } else {
    using FullBf16 = telar::test::on_space_t<::FullBf16, M>;
    using DpBf16Reduce = telar::test::on_space_t<::DpBf16Reduce, M>;
    using Zero3Bf16 = telar::test::on_space_t<::Zero3Bf16, M>;
    using CBf16 = telar::Conv2D<float, M, telar::Bf16Gemm, telar::bf16_conv_policy_t<float, M>>;
    using DBf16 = telar::Dense<float, M, telar::Bf16Gemm>;
    static_assert(
        std::is_same_v<
            telar::WithPrecision<Cnn<float>, telar::test::on_space_t<Bf16, M>>,
            telar::Sequential<
                CBf16, telar::ReLU<float>, telar::Residual<CBf16, telar::ReLU<float>, CBf16>,
                telar::ReLU<float>, telar::MaxPool2D<float>, telar::Flatten<float>,
                telar::ColumnParallel<DBf16>, telar::ReLU<float>, telar::RowParallel<DBf16>>>);
    if (!telar::bf16_available<M>())
      SKIP("no bf16 instructions here: bf16 is refused, not emulated");
    int const n = world_size();
    double const bound = 7.9e-3;
    std::size_t const batch = 16;
    int const steps = 3;
    auto const data = make_data<float>(batch * steps);
    telar::SGD<float> sgd;
    sgd.momentum = 0.9f;
    telar::TrainerOptions base;
    base.seed = 11;
    base.lr = telar::constant_lr(0.05);
    telar::TrainerOptions ref = base;
    ref.grid = {1, 1, 1};
    Result const fp32 = train<float, Full>(MPI_COMM_SELF, sgd, ref, data, batch, steps);
    Result const want = train<float, FullBf16>(MPI_COMM_SELF, sgd, ref, data, batch, steps);
    double const from_fp32 = worst_difference(want, fp32);
    INFO("bf16 serial against fp32 serial: worst relative difference " << from_fp32);
    CHECK(from_fp32 > 1e-5); // beyond fp32's reassociation (the fp32 test's tolerance)
    CHECK(from_fp32 <= bound);
    CHECK(telar::bf16_kernels().find("bf16") != std::string::npos);

    std::vector<Layout> layouts{{n, 1, 1, "1f1b", 1}};
    if (n > 1) {
      layouts.push_back({1, n, 1, "1f1b", 4});
      layouts.push_back({1, 1, n, "1f1b", 1});
    }
    if (n == 4)
      layouts.push_back({2, 1, 2, "1f1b", 1});
    for (auto const& l : layouts) {
      telar::TrainerOptions const opts = with_layout(base, l);
      std::string const what = "bf16 dp=" + std::to_string(l.dp) + " pp=" + std::to_string(l.pp) +
                               " tp=" + std::to_string(l.tp);
      require_same(train<float, FullBf16>(MPI_COMM_WORLD, sgd, opts, data, batch, steps), want,
                   std::min(bound, std::max(from_fp32, 1e-5)), what);
    }

    // Gradients reduced in bf16 (each rank's rounded once, the n - 1 partial
    // sums rounded again): within n u of the gradients' magnitude per step,
    // which bounds the norms' relative difference far more loosely than n u;
    // half the bytes of the fp32 reduction on the data-parallel group.
    telar::TrainerOptions dp = base;
    dp.grid = {n, 1, 1};
    Result const fp32_wire = train<float, FullBf16>(MPI_COMM_WORLD, sgd, dp, data, batch, steps);
    Result const bf16_wire =
        train<float, DpBf16Reduce>(MPI_COMM_WORLD, sgd, dp, data, batch, steps);
    require_same(bf16_wire, want, n * std::ldexp(1.0, -8),
                 "bf16 reduction, dp=" + std::to_string(n));
    INFO("data-parallel bytes: " << bf16_wire.dp_bytes << " (bf16) against " << fp32_wire.dp_bytes);
    CHECK(2 * bf16_wire.dp_bytes == fp32_wire.dp_bytes);
    if (n > 1)
      CHECK(worst_difference(bf16_wire, fp32_wire) > 0); // the bf16 wire ran

    // ZeRO-3 gathers the parameters as bf16 (half the gather bytes: asserted
    // in test_zero_memory): the bf16 kernels round the weights to the same
    // values, the biases are rounded too (at most u each), so within the bound.
    Result const zero3 = train<float, Zero3Bf16>(MPI_COMM_WORLD, sgd, dp, data, batch, steps);
    require_same(zero3, want, std::min(bound, std::max(from_fp32, 1e-5)),
                 "bf16 ZeRO-3, dp=" + std::to_string(n));
    if constexpr (telar::detail::bf16_gathers_v<float, M>) // biases rounded (and sums split)
      CHECK(worst_difference(zero3, fp32_wire) > 0);

    // ZeRO's reduce-scatters in bf16 (half their bytes: test_zero_memory),
    // summed by MPI a rounded addition at a time: within n u as the bf16
    // allreduce. ZeRO-1 between ranks (in shared memory nothing travels);
    // ZeRO-3 with its bf16 gathers as well.
    telar::TrainerOptions apart = dp;
    apart.shared_memory = false;
    Result const zero1 =
        train<float, ZeroBf16Reduce<1>>(MPI_COMM_WORLD, sgd, apart, data, batch, steps);
    require_same(zero1, want, n * std::ldexp(1.0, -8),
                 "bf16 ZeRO-1 reduce-scatter, dp=" + std::to_string(n));
    Result const zero3_both =
        train<float, ZeroBf16Reduce<3>>(MPI_COMM_WORLD, sgd, dp, data, batch, steps);
    require_same(zero3_both, want, n * std::ldexp(1.0, -8),
                 "bf16 ZeRO-3 reduce-scatter, dp=" + std::to_string(n));
    if (n > 1) { // the bf16 words travelled
      CHECK(worst_difference(zero1, fp32_wire) > 0);
      CHECK(worst_difference(zero3_both, zero3) > 0);
    }
  }
}
} // namespace

TEST_CASE("Under Precision<bf16, float> the CNN matches bf16 serial training",
          "[equivalence][cnn][bf16]") {
  bf16_cnn_case<telar::DefaultMemorySpace>();
}
