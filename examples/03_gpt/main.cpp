// Example 03: a byte-level GPT on English text (the fortunes of Debian's
// `fortunes` package; every 20th fortune is validation), serial or under any
// composition of data, pipeline and tensor parallelism:
//
//   token embedding (256 bytes) + positional embedding, dropout
//   layers x pre-norm transformer block (attention split by heads under --tp,
//            MLP hidden -> 4 hidden -> hidden a Megatron pair)
//   LayerNorm, Dense hidden -> 256, position-wise cross-entropy
//
//   gpt [--epochs 1] [--batch 32] [--lr 1e-3] [--optimizer adamw] [--seed 1]
//       [--context 128] [--layers 4] [--hidden 256] [--heads 4] [--dropout 0.1]
//       [--steps N] [--eval-every N] [--eval-limit 256] [--sample 200]
//       [--temperature 0.8] [--prompt TEXT] [--data DIR] [--json]
//       [--dp N] [--pp N] [--tp N] [--schedule 1f1b] [--microbatches M] [--timeline PREFIX]
//       [--memory-budget SIZE] [--layout auto|manual] [--dry-run] [--profile PATH]
//       [--precision fp32|bf16] [--bf16-weight-copy 1|0]
//
// --precision bf16 adds telar::Precision<telar::bf16, float> to the strategy:
// attention, MLP and output GEMMs in bf16 with fp32 accumulation; norms,
// softmax, the loss, weights and AdamW state in fp32 (docs/precision.md).
// One more Trainer type, so it runs the default depth (--layers 4) with
// AdamW, which --layout auto and --dry-run plan.
// --layout auto: the planner's fastest layout that fits; --dry-run: its
// ranking, no training (docs/planner.md).
//   mpirun -np 2 gpt --tp 2
//
// Reports the training loss and the validation loss and perplexity every
// --eval-every steps (0: after each epoch), then prints a sample generated
// from a prompt (temperature 0: greedy; otherwise seeded sampling). The
// sample is generated when the whole model is on every rank (pp = 1): every
// rank runs the same forwards (a tensor-parallel group together), rank 0
// prints; under pipelining it is skipped.
#include <telar/data/text.hpp>
#include <telar/layers/dropout.hpp>
#include <telar/layers/embedding.hpp>
#include <telar/layers/losses.hpp>
#include <telar/layers/normalization.hpp>
#include <telar/parallel/tensor_parallel_attention.hpp>

#include "layout_planning.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

struct Args : example::CommonArgs {
  Args() : CommonArgs(/*epochs*/ 1, /*hidden*/ 256) {
    batch = 32;
    data = telar::default_fortunes_dir();
    takes_precision = true;
  }
  std::size_t context = 128, layers = 4, heads = 4;
  double dropout = 0.1, temperature = 0.8;
  long eval_every = 0, eval_limit = 256, sample = 200;
  std::string prompt = "The ";
};

[[noreturn]] void usage(char const* why) {
  std::fprintf(stderr,
               "gpt: %s\n"
               "usage: gpt [--epochs N] [--batch N] [--lr X] "
               "[--optimizer adamw|sgd] [--seed N] [--context N] [--layers N] "
               "[--hidden N] [--heads N] [--dropout X] [--steps N] [--eval-every N] "
               "[--eval-limit N] [--sample N] [--temperature X] [--prompt TEXT] [--data DIR] "
               "[--json] [--dp N] [--pp N] [--tp N] [--schedule %s] [--microbatches M] "
               "[--timeline PREFIX] [--checkpoint-dir DIR] [--checkpoint-every N] [--resume] "
               "[--memory-budget SIZE] [--layout auto|manual] [--dry-run] [--profile PATH] "
               "[--precision fp32|bf16] [--bf16-weight-copy 1|0]\n",
               why, example::schedule_choices().c_str());
  throw 2;
}

Args parse(int argc, char** argv) {
  Args a;
  example::ArgReader r(argc, argv, usage);
  while (r.next()) {
    std::string const& f = r.flag();
    if (f == "--schedule")
      a.schedule = r.value(); // the trainer checks it
    else if (f == "--context")
      a.context = std::size_t(r.integer(1, 1 << 16));
    else if (f == "--layers")
      a.layers = std::size_t(r.integer(1, 1024));
    else if (f == "--heads")
      a.heads = std::size_t(r.integer(1, 1 << 16));
    else if (f == "--dropout")
      a.dropout = r.fraction(1);
    else if (f == "--temperature")
      a.temperature = r.fraction(1e6);
    else if (f == "--steps")
      a.limit_steps = long(r.integer(1));
    else if (f == "--eval-every")
      a.eval_every = r.number();
    else if (f == "--eval-limit")
      a.eval_limit = long(r.integer(1));
    else if (f == "--sample")
      a.sample = r.number();
    else if (f == "--prompt")
      a.prompt = r.value();
    else if (!example::read_common_flag(r, a))
      usage(("unknown flag " + f).c_str());
  }
  example::check_common(a, usage);
  example::check_bf16_run(a, usage);
  if (a.hidden % a.heads != 0)
    r.fail("--hidden " + std::to_string(a.hidden) + " is not divisible by --heads " +
           std::to_string(a.heads));
  if (a.heads % std::size_t(a.tp) != 0)
    r.fail("--heads " + std::to_string(a.heads) + " cannot be split evenly over --tp " +
           std::to_string(a.tp));
  if (a.prompt.empty())
    r.fail("--prompt must not be empty");
  return a;
}

using T = float;
using Block = telar::TensorParallelTransformerBlock<T>; // the plain block at tp 1
using Loss = telar::PositionwiseCrossEntropy<T>;
// One strategy type for every run: degrees left at 1 cost nothing.
using Strategy = telar::Strategy<telar::DataParallel<telar::RingAllreduce>,
                                 telar::PipelineParallel<telar::OneFOneB>, telar::TensorParallel<>>;

// Blocks are top-level layers (pipeline stages split between them), so their
// number is part of the model's type: --layers picks one of these.
// A struct, not an alias template: nvcc's host pass loses a pack expanded
// through `template <std::size_t, class B> using Same = B`.
template <std::size_t, class B>
struct Same {
  using type = B;
};
template <class Seq>
struct GptOf;
template <std::size_t... I>
struct GptOf<std::index_sequence<I...>> {
  using type =
      telar::Sequential<telar::Embedding<T>, telar::PositionalEmbedding<T>, telar::Dropout<T>,
                        typename Same<I, Block>::type..., telar::LayerNorm<T>, telar::Dense<T>>;
  template <std::size_t>
  static Block block(Args const& a) {
    return telar::make_tensor_parallel_transformer_block<T>(a.hidden, a.heads);
  }
  static type make(Args const& a) {
    return type(telar::Embedding<T>(telar::byte_vocab, a.hidden),
                telar::PositionalEmbedding<T>(a.context, a.hidden), telar::Dropout<T>(a.dropout),
                block<I>(a)..., telar::LayerNorm<T>(a.hidden),
                telar::Dense<T>(a.hidden, telar::byte_vocab));
  }
};
template <std::size_t L>
using Gpt = GptOf<std::make_index_sequence<L>>;

// Device copies of a set of windows: token ids and next-token targets.
struct Windows {
  telar::Matrix<T> x;
  Loss::target_type y;
};
Windows gather(telar::TextWindows const& text, std::vector<std::size_t> const& idx) {
  std::size_t const c = text.context();
  Windows w{telar::Matrix<T>("x", idx.size(), c), Loss::target_type("y", idx.size(), c)};
  auto hx = Kokkos::create_mirror_view(w.x);
  auto hy = Kokkos::create_mirror_view(w.y);
  for (std::size_t i = 0; i < idx.size(); ++i)
    text.window(idx[i], &hx(i, 0), &hy(i, 0));
  Kokkos::deep_copy(w.x, hx);
  Kokkos::deep_copy(w.y, hy);
  return w;
}

// Next byte after `prompt`, one forward over the last context bytes per
// byte (causal attention: the filler after the last real byte is not seen).
template <class Model>
std::string generate(Model& model, Args const& a) {
  telar::set_training(model, false);
  std::mt19937_64 rng(a.seed);
  std::uniform_real_distribution<double> uniform(0, 1);
  std::string text = a.prompt;
  telar::Matrix<T> x("x", 1, a.context), y("y", 1, a.context * telar::byte_vocab);
  auto hx = Kokkos::create_mirror_view(x);
  typename telar::layer_traits<Model>::saved_type saved;
  std::vector<double> p(telar::byte_vocab);
  for (long n = 0; n < a.sample; ++n) {
    std::size_t const first = text.size() > a.context ? text.size() - a.context : 0;
    std::size_t const len = text.size() - first;
    for (std::size_t i = 0; i < a.context; ++i)
      hx(0, i) = i < len ? T(static_cast<unsigned char>(text[first + i])) : T(' ');
    Kokkos::deep_copy(x, hx);
    model.forward(Kokkos::DefaultExecutionSpace{}, x, y, saved);
    auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, y);
    T const* logits = &hy(0, (len - 1) * telar::byte_vocab);
    std::size_t best = std::size_t(std::max_element(logits, logits + telar::byte_vocab) - logits);
    if (a.temperature > 0) { // softmax(logits / temperature), drawn with the seeded generator
      double sum = 0;
      for (std::size_t c = 0; c < p.size(); ++c)
        sum += p[c] = std::exp((double(logits[c]) - double(logits[best])) / a.temperature);
      double u = uniform(rng) * sum;
      for (best = 0; best + 1 < p.size() && u >= p[best]; ++best)
        u -= p[best];
    }
    text += char(best);
  }
  telar::set_training(model, true);
  return text;
}

// Validation loss every --eval-every steps (0: after each epoch).
struct Report {
  double train_loss = 0, val_loss = 0;
  long long steps = 0, tokens = 0;
  double train_seconds = 0, median_ms = 0, param_l2 = 0;
};

// " --steps N": gpt's learning-rate schedule spans --steps, so a resumed
// run must repeat it (example::run_config).
std::string steps_flag(Args const& a) {
  return a.limit_steps > 0 ? " --steps " + std::to_string(a.limit_steps) : "";
}

template <class Trainer>
Report fit(Trainer& trainer, Args const& a, telar::TextWindows const& train, Windows const& val,
           std::size_t local) {
  example::DirLock const lock = example::check_outputs(trainer, a);
  std::string const extra = steps_flag(a);
  bool const root = trainer.rank() == 0;
  telar::DistributedSampler sampler(train.size(), trainer.grid_shape().dp, trainer.grid_coords().dp,
                                    a.seed, true, telar::LastBatch::drop);
  telar::BatchLoader loader(sampler, local);
  std::vector<double> step_ms;
  Report r;
  double sum = 0;
  long long n = 0;
  auto evaluate = [&](char const* when) {
    r.train_loss = sum / double(std::max<long long>(1, n));
    r.val_loss = trainer.evaluate(val.x, val.y, 64).loss;
    if (root)
      std::fprintf(stderr, "%s %lld: train loss %.4f, val loss %.4f, perplexity %.2f\n", when,
                   r.steps, r.train_loss, r.val_loss, std::exp(r.val_loss));
    sum = 0;
    n = 0;
  };
  auto const pos = example::resume(trainer, a, extra); // --resume: where the newest one stopped
  bool go_on = a.limit_steps <= 0 || trainer.steps() < a.limit_steps;
  int epoch = int(pos.epoch);
  std::size_t s = 0;
  for (; epoch < a.epochs && go_on; ++epoch) {
    loader.set_epoch(std::uint64_t(epoch));
    telar::LocalBatch batch;
    for (s = epoch == pos.epoch ? std::size_t(pos.batch) : 0; s < loader.size() && go_on; ++s) {
      loader.batch(s, batch);
      Windows const w = gather(train, batch.indices);
      auto const step = trainer.step(w.x, w.y);
      step_ms.push_back(step.seconds * 1e3);
      r.train_seconds += step.seconds;
      r.tokens += step.samples * (long long)train.context();
      if (!step.skipped) { // NaN or infinite: the mean is of the others
        sum += step.loss;
        ++n;
      }
      ++r.steps;
      go_on = a.limit_steps <= 0 || trainer.steps() < a.limit_steps; // resumed steps count
      if (a.checkpoint_every > 0 && trainer.steps() % a.checkpoint_every == 0 && go_on)
        example::save(trainer, a, epoch, (long long)s + 1, extra);
      if (a.eval_every > 0 && r.steps % a.eval_every == 0)
        evaluate("step");
      else if (root && r.steps % 20 == 0)
        std::fprintf(stderr, "step %lld: loss %.4f, lr %.2e, %.0f ms\n", r.steps, step.loss,
                     step.lr, step.seconds * 1e3);
    }
    if (n > 0)
      evaluate(go_on ? "epoch" : "step");
  }
  if (r.steps > 0 && go_on) // every epoch done
    example::save(trainer, a, epoch, 0, extra);
  else if (r.steps > 0)
    example::save(trainer, a, epoch - 1, (long long)s, extra);
  r.param_l2 = trainer.param_l2(); // collective: every rank
  r.median_ms = example::median(step_ms);
  return r;
}

// Rank 0's end of a run: losses, speed, the prediction, the sample and,
// with --json, the one-line summary the tests parse.
template <std::size_t L, class Trainer>
void print_summary(Trainer const& trainer, Args const& a, Report const& r, double predicted,
                   std::string const& sample) {
  double const tokens_per_s = double(r.tokens) / r.train_seconds;
  std::fprintf(stderr,
               "final: val loss %.4f, perplexity %.2f, median step %.1f ms, %.0f tokens/s\n",
               r.val_loss, std::exp(r.val_loss), r.median_ms, tokens_per_s);
  example::print_prediction(predicted, r.median_ms);
  if (a.sample > 0)
    std::fprintf(stderr,
                 trainer.grid_shape().pp == 1
                     ? "sample (temperature %.2f, seed %llu):\n%s\n"
                     : "sample skipped under pipelining (temperature %.2f, seed %llu)%s\n",
                 a.temperature, (unsigned long long)a.seed, sample.c_str());
  example::print_memory(trainer);
  if (!a.json)
    return;
  telar::JsonObject config = example::common_config(trainer, a);
  config.add("context", (long long)a.context)
      .add("layers", (long long)L)
      .add("heads", (long long)a.heads)
      .add("dropout", a.dropout);
  telar::JsonObject j;
  j.add("final_loss", r.train_loss)
      .add("val_loss", r.val_loss)
      .add("perplexity", std::exp(r.val_loss))
      .add("tokens_per_s", tokens_per_s)
      .add("step_ms_median", r.median_ms);
  example::add_prediction(j, a, predicted)
      .add("param_l2", r.param_l2)
      .add("steps", r.steps)
      .add("skipped_steps", trainer.skipped_steps())
      .add("strategy", trainer.strategy_name())
      .add("layout", trainer.layout());
  example::add_memory(j, trainer).add("config", config);
  std::printf("%s\n", j.str().c_str());
  std::fflush(stdout);
}

// --layout auto / --dry-run / --memory-budget: the layouts of the strategy
// type this example runs (S: it, or it with bf16 compute, whose model is
// planned as the Trainer rebinds it).
template <std::size_t L, class S, class Optimizer>
int train(MPI_Comm comm, Args const& given, Optimizer opt) {
  using Model = typename Gpt<L>::type;
  telar::Shape const in(given.context);
  Args a = given;
  std::optional<telar::LayoutPlan> plan;
  if (!example::plan_run(comm, a, plan, "gpt", [&] {
        return example::plan_of<Model, S, Optimizer, Loss>(comm, a, Gpt<L>::make(a), in);
      }))
    return 0;
  telar::TextSplit const text = telar::load_fortunes(a.data);
  telar::TextWindows const train_set(text.train, a.context), val_set(text.validation, a.context);
  telar::TrainerOptions opts = example::trainer_options(a, train_set.size(), comm);
  if (a.limit_steps > 0) { // warm-up and cosine over the steps that run
    long long const total =
        std::min<long long>(a.limit_steps, (long long)(train_set.size() / a.batch) * a.epochs);
    opts.lr = telar::warmup_cosine(a.lr, std::min<long long>(100, total / 10), total, a.lr * 0.05);
  }
  auto trainer = example::with_fastest_fitting(plan, [&] {
    return telar::Trainer<Model, S, Optimizer, Loss>(comm, Gpt<L>::make(a), opt, opts, in);
  });
  std::size_t const local = example::local_batch(a, trainer.grid_shape().dp, "gpt");
  bool const root = trainer.rank() == 0;
  std::size_t const nval = std::min<std::size_t>(val_set.size(), std::size_t(a.eval_limit));
  std::vector<std::size_t> vi(nval);
  for (std::size_t i = 0; i < nval; ++i)
    vi[i] = i * (val_set.size() / nval); // spread over the validation text
  Windows const val = gather(val_set, vi);
  if (root)
    std::fprintf(stderr,
                 "gpt: %zu fortunes from %zu files in %s: %zu train / %zu validation bytes, "
                 "%zu train windows, %zu validation windows evaluated; GPT %zu x [hidden %zu, "
                 "%zu heads], context %zu, %s, layout %s, schedule %s, %d micro-batches, global "
                 "batch %zu, precision %s\n",
                 text.fortunes, text.files, a.data.c_str(), text.train.size(),
                 text.validation.size(), train_set.size(), nval, L, a.hidden, a.heads, a.context,
                 Optimizer::name(), trainer.layout().c_str(),
                 trainer.pipeline_schedule().name.c_str(), opts.microbatches, a.batch,
                 a.precision.c_str());

  Report const r = fit(trainer, a, train_set, val, local);
  double const predicted = example::predicted_step_ms(comm, a, Gpt<L>::make(a), trainer, in);
  example::write_timeline(trainer, a.timeline, "gpt");
  std::string sample;
  if (a.sample > 0 && trainer.grid_shape().pp == 1)
    sample = telar::escape_for_terminal(generate(trainer.model(), a));
  if (root)
    print_summary<L>(trainer, a, r, predicted, sample);
  example::check_divergence(trainer.skipped_steps(), trainer.steps(), r.val_loss, "val loss", root);
  return 0;
}

// AdamW (default) or SGD: each optimizer and depth is a Trainer instantiation.
template <std::size_t L>
int with_optimizer(MPI_Comm comm, Args const& a) {
  if (a.precision == "bf16") {
    // bf16 layers are oneDNN's in host memory and cuBLAS's in CUDA memory:
    // a build with neither has no bf16 Trainer to instantiate.
    if constexpr (!telar::bf16_layers_supported<T, telar::DefaultMemorySpace>())
      usage("--precision bf16 needs oneDNN (host memory) or cuBLAS (CUDA memory)");
    else if constexpr (L == 4)
      return train<L, example::Bf16<Strategy>>(comm, a, telar::AdamW<T>{});
    usage("--precision bf16 runs the default depth, --layers 4");
  }
  if (a.optimizer == "adamw")
    return train<L, Strategy>(comm, a, telar::AdamW<T>{});
  if (a.optimizer == "sgd")
    return train<L, Strategy>(comm, a, telar::SGD<T>{});
  usage(("gpt supports --optimizer adamw or sgd, got '" + a.optimizer + "'").c_str());
}

int run(MPI_Comm comm, int argc, char** argv) {
  Args const a = parse(argc, argv);
  switch (a.layers) {
  case 1:
    return with_optimizer<1>(comm, a);
  case 2:
    return with_optimizer<2>(comm, a);
  case 4:
    return with_optimizer<4>(comm, a);
  case 6:
    return with_optimizer<6>(comm, a);
  case 8:
    return with_optimizer<8>(comm, a);
  default:
    usage(("--layers must be 1, 2, 4, 6 or 8, got " + std::to_string(a.layers)).c_str());
  }
}

} // namespace

int main(int argc, char** argv) {
  return example::run_main(argc, argv, "gpt", run);
}
