// A tiny GPT (token and positional embeddings, dropout, two pre-norm
// transformer blocks with head-parallel attention and a Column/Row MLP, a
// final LayerNorm and a vocabulary projection, PositionwiseCrossEntropy)
// trains to the serial parameters under data, pipeline (stages split between
// blocks; GPipe, 1F1B, ZB-H1, ZB-H2, interleaved) and tensor parallelism (heads over tp)
// and their products: checked on the L2 norm of every parameter tensor and
// of all of them (relative 1e-5 in float, 1e-11 in double) after a few
// steps, at whatever world size the test runs with. The Trainer keys the
// dropout masks by step and global sample, so they too are the same in every
// layout.
#include "equivalence.hpp"

#include <telar/layers/dropout.hpp>
#include <telar/layers/embedding.hpp>
#include <telar/layers/losses.hpp>
#include <telar/layers/normalization.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/parallel/tensor_parallel_attention.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <mpi.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

std::size_t const vocab = 11, seq = 6, hidden = 8, heads = 4;

template <class T>
using Block = telar::TensorParallelTransformerBlock<T>;
template <class T>
using Gpt = telar::Sequential<telar::Embedding<T>, telar::PositionalEmbedding<T>, telar::Dropout<T>,
                              Block<T>, Block<T>, telar::LayerNorm<T>, telar::Dense<T>>;
template <class T>
Gpt<T> make_gpt(double dropout = 0.1) {
  return Gpt<T>(telar::Embedding<T>(vocab, hidden), telar::PositionalEmbedding<T>(seq, hidden),
                telar::Dropout<T>(dropout),
                telar::make_tensor_parallel_transformer_block<T>(hidden, heads),
                telar::make_tensor_parallel_transformer_block<T>(hidden, heads),
                telar::LayerNorm<T>(hidden), telar::Dense<T>(hidden, vocab));
}
template <class T>
using Loss = telar::PositionwiseCrossEntropy<T>;

using Full =
    telar::Strategy<telar::DataParallel<>, telar::PipelineParallel<>, telar::TensorParallel<>>;

using telar::test::require_same;
using telar::test::world_size;

// Token sequences and their next tokens (a fixed pseudo-random walk), the
// last position padded (-100).
template <class T>
struct Data {
  telar::Matrix<T> x;
  typename Loss<T>::target_type y;
};
template <class T>
Data<T> make_data(std::size_t n) {
  Data<T> d{telar::Matrix<T>("x", n, seq), typename Loss<T>::target_type("y", n, seq)};
  auto hx = Kokkos::create_mirror_view(d.x);
  auto hy = Kokkos::create_mirror_view(d.y);
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t tok = (i * 5 + 3) % vocab;
    for (std::size_t p = 0; p < seq; ++p) {
      hx(i, p) = T(tok);
      tok = (tok * 3 + i % 4 + 1) % vocab;
      hy(i, p) = p + 1 < seq ? int(tok) : -100;
    }
  }
  Kokkos::deep_copy(d.x, hx);
  Kokkos::deep_copy(d.y, hy);
  return d;
}

using Result = telar::test::NormResult;

template <class T, class Strategy, class Opt>
Result train(MPI_Comm comm, Opt opt, telar::TrainerOptions opts, Data<T> const& data,
             std::size_t batch, int steps) {
  telar::Trainer<Gpt<T>, Strategy, Opt, Loss<T>> trainer(comm, make_gpt<T>(), opt, opts,
                                                         telar::Shape(seq));
  int const dp = trainer.grid_shape().dp, d = trainer.grid_coords().dp;
  std::size_t const local = batch / std::size_t(dp);
  for (int s = 0; s < steps; ++s) {
    std::size_t const b = std::size_t(s) * batch + std::size_t(d) * local;
    // The Trainer keys the dropout masks by (step, global sample) itself.
    trainer.step(telar::rows(data.x, b, b + local), telar::rows(data.y, b, b + local));
  }
  return {trainer.param_l2(), trainer.tensor_norms()};
}

struct Layout {
  int dp, pp, tp;
  char const* schedule;
  int microbatches;
};

} // namespace

TEMPLATE_TEST_CASE("A tiny GPT matches serial training under every strategy",
                   "[equivalence][transformer]", float, double) {
  using T = TestType;
  int const n = world_size();
  double const tol = std::is_same_v<T, float> ? 1e-5 : 1e-11;
  std::size_t const batch = n == 8 ? 16 : 8; // two samples per micro-batch at dp 8
  int const steps = 3;
  auto const data = make_data<T>(batch * steps);
  telar::SGD<T> sgd;
  sgd.momentum = T(0.9);
  telar::TrainerOptions base;
  base.seed = 5;
  base.lr = telar::constant_lr(0.1);

  std::vector<Layout> layouts{{n, 1, 1, "1f1b", 1}, {n, 1, 1, "1f1b", 2}}; // data parallel
  if (n > 1 && n <= 4) { // 7 top-level layers and 4 heads: at most 4 stages, tp <= 4
    layouts.push_back({1, n, 1, "1f1b", 4}); // pipeline
    layouts.push_back({1, n, 1, "zb-h1", 4});
    layouts.push_back({1, n, 1, "gpipe", 4});
    layouts.push_back({1, n, 1, "zb-h2", 4});
    layouts.push_back({1, 1, n, "1f1b", 1}); // tensor parallel (heads over tp)
  }
  if (n == 4) {
    layouts.push_back({2, 2, 1, "1f1b", 2}); // dp x pp
    layouts.push_back({2, 1, 2, "1f1b", 1}); // dp x tp
    layouts.push_back({1, 2, 2, "1f1b", 2}); // pp x tp
    layouts.push_back({1, 2, 2, "interleaved", 4});
  }
  if (n == 8) { // dp x pp x tp
    layouts.push_back({2, 2, 2, "zb-h1", 2});
    layouts.push_back({2, 2, 2, "1f1b", 4});
    layouts.push_back({1, 2, 4, "interleaved", 4});
  }

  telar::TrainerOptions ref = base;
  ref.grid = {1, 1, 1};
  ref.schedule.clear();
  Result const want = train<T, telar::Serial>(MPI_COMM_SELF, sgd, ref, data, batch, steps);
  CHECK(want.norms.size() == 1 + 1 + 2 * 16 + 2 + 2);
  for (auto const& l : layouts) {
    telar::TrainerOptions opts = base;
    opts.grid = {l.dp, l.pp, l.tp};
    opts.schedule = l.schedule;
    opts.microbatches = l.microbatches;
    std::string const what = "dp=" + std::to_string(l.dp) + " pp=" + std::to_string(l.pp) +
                             " tp=" + std::to_string(l.tp) + " " + l.schedule +
                             " m=" + std::to_string(l.microbatches);
    require_same(train<T, Full>(MPI_COMM_WORLD, sgd, opts, data, batch, steps), want, tol, what);
  }
}

TEST_CASE("The Trainer evaluates without dropout and trains with it", "[transformer][dropout]") {
  auto const data = make_data<double>(8);
  telar::TrainerOptions opts;
  opts.seed = 5;
  opts.grid = {1, 1, 1};
  opts.schedule.clear();
  auto trainer = [&](double p) {
    return std::make_unique<
        telar::Trainer<Gpt<double>, telar::Serial, telar::SGD<double>, Loss<double>>>(
        MPI_COMM_SELF, make_gpt<double>(p), telar::SGD<double>{}, opts, telar::Shape(seq));
  };
  auto with = trainer(0.5), without = trainer(0.0); // the same parameters: dropout has none
  double const e = with->evaluate(data.x, data.y).loss;
  CHECK(e == without->evaluate(data.x, data.y).loss); // evaluation: dropout is the identity
  CHECK(e == with->evaluate(data.x, data.y).loss);
  // Training after evaluate(): dropout is on again, so the losses differ.
  CHECK(with->step(data.x, data.y).loss != without->step(data.x, data.y).loss);
}
