// Example 05: a hyper-parameter search on Fashion-MNIST by successive
// halving, the configurations trained side by side on groups of ranks.
//
//   hpsearch [--groups G] [--lr 1e-3,1e-2] [--optimizer sgd,adamw] [--hidden 64]
//            [--tp 1,2] [--steps 100] [--eta 2] [--rounds 0] [--batch 64]
//            [--val 5000] [--seed 1] [--data DIR] [--json FILE] [--assign dynamic]
//            [--precision fp32|bf16]
//   mpirun -np 4 hpsearch --groups 2 --lr 1e-3,1e-2 --optimizer sgd,adamw --json search.json
//
// The grid is the product of the lists (--lr, --optimizer, --hidden and, if
// given, --tp).
// The world is split into --groups groups of equal size; each trains one
// configuration at a time with dp = group size / tp (--tp > 1: the MLP's
// first two layers are a Megatron pair). Round r trains each surviving
// configuration for steps * eta^r steps from scratch and keeps the best
// 1/eta by validation loss (the last --val training images, not trained on);
// --rounds 0 goes on until one is left. --assign dynamic: a group done with a
// configuration takes the next one nobody has started; static: round-robin. A configuration that
// diverges or fails (a --tp that does not fit the group, ...) is recorded with its reason and ranks
// last. Rank 0 prints the leaderboard and, with --json, writes it. The same --seed gives the same
// leaderboard, whatever --groups (to rounding across group sizes).
//
// --precision bf16 trains every configuration under
// telar::Precision<telar::bf16, float>: the MLP's Dense layers (the Megatron
// pair included) multiply through oneDNN's bf16 matmul (telar::Bf16Gemm);
// weights, gradients, AdamW's state, the loss and the validation loss stay
// fp32 (docs/precision.md). With AdamW only: each optimizer is one more
// Trainer type to compile, so a bf16 grid lists --optimizer adamw. The JSON
// leaderboard gains "precision" and "gemm_kernels" (the oneDNN
// implementations that ran, e.g. matmul:brg:avx512_core_bf16).
#include <telar/telar.hpp> // one include for all of Telar, the search included

#include "example_support.hpp"

#include <cstdio>
#include <string>
#include <vector>

namespace {

struct Args {
  int groups = 1;
  std::vector<std::string> lr{"1e-3", "1e-2"}, optimizer{"sgd", "adamw"}, hidden{"64"}, tp;
  long long steps = 100;
  int eta = 2, rounds = 0;
  std::size_t batch = 64, val = 5000;
  std::uint64_t seed = 1;
  std::string data = telar::default_fashion_mnist_dir();
  std::string json;
  bool dynamic = true;            // --assign dynamic|static
  std::string precision = "fp32"; // --precision fp32|bf16
};

[[noreturn]] void usage(char const* why) {
  std::fprintf(stderr,
               "hpsearch: %s\n"
               "usage: hpsearch [--groups G] [--lr X,Y,...] "
               "[--optimizer sgd|momentum|adam|adamw|lamb,...] [--hidden N,...] [--tp N,...] "
               "[--steps N] [--eta N] [--rounds N] [--batch N] [--val N] [--seed N] "
               "[--data DIR] [--json FILE] [--assign dynamic|static] [--precision fp32|bf16]\n",
               why);
  throw 2;
}

// "a,b,c" -> {a, b, c}; each item checked by `ok`.
template <class Check>
std::vector<std::string> list(example::ArgReader& r, Check ok) {
  std::string const flag = r.flag(), v = r.value();
  std::vector<std::string> out;
  std::size_t at = 0;
  for (std::size_t comma; (comma = v.find(',', at)) != std::string::npos; at = comma + 1)
    out.push_back(v.substr(at, comma - at));
  out.push_back(v.substr(at));
  for (auto const& item : out)
    if (!ok(item))
      r.fail(flag + ": '" + item + "' in '" + v + "' is not valid");
  return out;
}

bool positive_real(std::string const& s) {
  char* end = nullptr;
  double const x = std::strtod(s.c_str(), &end);
  return !s.empty() && *end == 0 && std::isfinite(x) && x > 0;
}
bool positive_integer(std::string const& s) {
  return !s.empty() && s.size() < 10 && s.find_first_not_of("0123456789") == std::string::npos &&
         std::stol(s) > 0;
}
bool optimizer_name(std::string const& s) {
  for (char const* n : {"sgd", "momentum", "adam", "adamw", "lamb"})
    if (s == n)
      return true;
  return false;
}

Args parse(int argc, char** argv) {
  Args a;
  example::ArgReader r(argc, argv, usage);
  while (r.next()) {
    std::string const& f = r.flag();
    if (f == "--groups")
      a.groups = int(r.integer(1));
    else if (f == "--lr")
      a.lr = list(r, positive_real);
    else if (f == "--optimizer")
      a.optimizer = list(r, optimizer_name);
    else if (f == "--hidden")
      a.hidden = list(r, positive_integer);
    else if (f == "--tp")
      a.tp = list(r, positive_integer);
    else if (f == "--steps")
      a.steps = r.integer(1);
    else if (f == "--eta")
      a.eta = int(r.integer(2, 100));
    else if (f == "--rounds")
      a.rounds = int(r.integer(0, 30));
    else if (f == "--batch")
      a.batch = std::size_t(r.integer(1));
    else if (f == "--val")
      a.val = std::size_t(r.integer(1));
    else if (f == "--seed")
      a.seed = std::uint64_t(r.integer(0, std::numeric_limits<long long>::max()));
    else if (f == "--data")
      a.data = r.value();
    else if (f == "--json")
      a.json = r.value();
    else if (f == "--assign") {
      std::string const v = r.value();
      if (v != "dynamic" && v != "static")
        r.fail("--assign expects dynamic or static, got '" + v + "'");
      a.dynamic = v == "dynamic";
    } else if (f == "--precision") {
      a.precision = r.value();
      if (a.precision != "fp32" && a.precision != "bf16")
        r.fail("--precision expects fp32 or bf16, got '" + a.precision + "'");
    } else if (f == "--help" || f == "-h")
      r.fail("help");
    else
      r.fail("unknown flag " + f);
  }
  if (a.precision == "bf16") {
    // One more Trainer type per optimizer (compile time): bf16 comes with AdamW.
    for (auto const& o : a.optimizer)
      if (o != "adamw")
        usage(("--precision bf16 trains with --optimizer adamw, got '" + o +
               "' in the --optimizer list (default sgd,adamw)")
                  .c_str());
    if (!telar::bf16_layers_supported<float, telar::DefaultMemorySpace>())
      usage("--precision bf16 needs oneDNN (host memory) or cuBLAS (CUDA memory)");
  }
  return a;
}

using T = float;
using D = telar::Dense<T>;
using R = telar::ReLU<T>;
using Model = telar::Sequential<telar::ColumnParallel<D>, R, telar::RowParallel<D>, R, D>;
using Strategy = telar::Strategy<telar::DataParallel<>, telar::TensorParallel<>>;

Model make_model(std::size_t hidden) {
  return Model(telar::ColumnParallel<D>(784, hidden), {}, telar::RowParallel<D>(hidden, hidden), {},
               D(hidden, 10));
}

// The training images minus the last `val` (the validation set, on the device).
struct Data {
  telar::FashionMnist mnist;
  std::size_t train_count = 0;
  telar::BatchGather<telar::DefaultMemorySpace> val;
};

void load(Data& d, Args const& a) {
  d.mnist = telar::load_fashion_mnist(a.data);
  std::size_t const n = d.mnist.train.size;
  if (a.val + a.batch > n)
    throw telar::Error("hpsearch: --val " + std::to_string(a.val) + " and --batch " +
                       std::to_string(a.batch) + " leave no training batch of the " +
                       std::to_string(n) + " images");
  d.train_count = n - a.val;
  std::vector<std::size_t> idx(a.val);
  for (std::size_t i = 0; i < a.val; ++i)
    idx[i] = d.train_count + i;
  d.val.gather(d.mnist.train, idx);
}

// One configuration for trial.budget() steps over the group, then the
// validation loss; S: Strategy, or it with bf16 compute.
template <class S, class Optimizer>
telar::TrialOutcome train(telar::Trial const& trial, Args const& a, Data& d, Optimizer opt) {
  auto const& c = trial.config();
  double const lr = c.real("lr");
  long long const budget = trial.budget();
  telar::TrainerOptions o;
  o.seed = trial.seed();
  o.grid = {0, 1, c.has("tp") ? int(c.integer("tp")) : 1};
  o.lr = telar::warmup_cosine(lr, budget / 10, budget, lr * 0.05);
  o.batch_size = a.batch;
  telar::Trainer<Model, S, Optimizer> trainer(
      trial.comm(), make_model(std::size_t(c.integer("hidden"))), opt, o, 784);
  int const dp = trainer.grid_shape().dp;
  if (a.batch % std::size_t(dp) != 0)
    throw telar::Error("--batch " + std::to_string(a.batch) +
                       " is not divisible by dp=" + std::to_string(dp));
  std::size_t const local = a.batch / std::size_t(dp);
  telar::DistributedSampler sampler(d.train_count, dp, trainer.grid_coords().dp, trial.seed());
  telar::BatchLoader loader(sampler, local);
  telar::BatchGather<telar::DefaultMemorySpace> gather(local, 784);
  telar::LocalBatch batch;
  long long step = 0;
  for (std::uint64_t epoch = 0; step < budget; ++epoch) {
    loader.set_epoch(epoch);
    for (std::size_t s = 0; s < loader.size() && step < budget; ++s) {
      loader.batch(s, batch);
      gather(d.mnist.train, batch);
      trial.check(++step, trainer.step(gather.x(), gather.y()).loss);
    }
  }
  auto const v = trainer.evaluate(d.val.x(), d.val.y());
  return {v.loss, v.accuracy, step};
}

// --precision bf16: the trial under Strategy with telar::Precision<telar::bf16,
// float>, AdamW (parse() refused any other optimizer and a build without
// oneDNN on the host, where no bf16 Trainer can be instantiated).
telar::TrialOutcome train_bf16(telar::Trial const& trial, Args const& a, Data& d) {
  if constexpr (telar::bf16_layers_supported<T, telar::DefaultMemorySpace>())
    return train<example::Bf16<Strategy>>(trial, a, d, telar::AdamW<T>{});
  else
    throw telar::Error(
        "hpsearch: --precision bf16 needs oneDNN (host memory) or cuBLAS (CUDA memory)");
}

// Every trial would fail the same way on a CPU without bf16 instructions:
// refused before the search, on every rank (TELAR_BF16_FALLBACK=fp32 runs
// fp32 with one warning instead; docs/precision.md).
void check_bf16_isa(Args const& a) {
  if (a.precision == "bf16")
    telar::require_bf16<telar::DefaultMemorySpace>("--precision bf16");
}

// Calls train(optimizer) with the optimizer a configuration names (checked by parse()).
template <class Train>
telar::TrialOutcome with_optimizer(std::string const& name, Train train) {
  if (name == "sgd" || name == "momentum") {
    telar::SGD<T> o;
    o.momentum = name == "momentum" ? 0.9f : 0.0f;
    return train(o);
  }
  if (name == "adam")
    return train(telar::Adam<T>{});
  if (name == "lamb")
    return train(telar::LAMB<T>{});
  return train(telar::AdamW<T>{});
}

telar::SearchSpace space(Args const& a) {
  telar::SearchSpace s;
  s.add("lr", a.lr).add("optimizer", a.optimizer).add("hidden", a.hidden);
  if (!a.tp.empty()) // an axis only when asked for: tp=1 on every line says nothing
    s.add("tp", a.tp);
  return s;
}

// --json is checked before the search: no search that cannot save its result.
void check_json(telar::Communicator const& world, std::string const& path) {
  int ok = world.rank() != 0 || path.empty() || example::writable(path);
  world.broadcast(&ok, 1, 0);
  if (!ok)
    throw telar::Error("hpsearch: --json " + path + ": cannot write it");
}

// The search's JSON (telar::SearchResult::json) with what multiplied:
// "precision", "gemm" (the policy) and "gemm_kernels" (fp32: the GEMM
// backend; bf16: the oneDNN implementations that ran on this rank).
std::string search_json(telar::SearchResult const& r, Args const& a) {
  std::string const own = telar::JsonObject()
                              .add("precision", example::precision_ran(a.precision))
                              .add("gemm", example::gemm_name(a.precision))
                              .add("gemm_kernels", example::gemm_kernels(a.precision))
                              .str();
  std::string text = r.json(); // {...}: its members, then ours
  text.pop_back();
  return text + "," + own.substr(1) + "\n";
}

void report(telar::SearchResult const& r, Args const& a) {
  std::printf("%s", r.table().c_str());
  std::printf("search: %zu configurations, %zu rounds, %d groups x %d ranks, wall %.2f s; "
              "the trials' own times add up to %.2f s\n",
              r.leaderboard.size(), r.rounds.size(), r.options.groups, r.group_size, r.wall_seconds,
              r.trial_seconds());
  std::fflush(stdout);
  std::fprintf(stderr, "hpsearch: precision %s, GEMM kernels %s\n", a.precision.c_str(),
               example::gemm_kernels(a.precision).c_str());
  if (!a.json.empty()) {
    std::string const text = search_json(r, a);
    std::FILE* f = std::fopen(a.json.c_str(), "w");
    bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (f != nullptr)
      ok = std::fclose(f) == 0 && ok;
    if (!ok)
      throw telar::Error("hpsearch: --json " + a.json + ": cannot write it");
    std::fprintf(stderr, "hpsearch: leaderboard written to %s\n", a.json.c_str());
  }
}

int run(MPI_Comm comm, int argc, char** argv) {
  Args const a = parse(argc, argv);
  telar::Communicator world(comm, "hpsearch");
  check_json(world, a.json);
  check_bf16_isa(a);
  Data d;
  load(d, a);
  telar::HalvingOptions opts;
  opts.groups = a.groups;
  opts.eta = a.eta;
  opts.rounds = a.rounds;
  opts.budget = a.steps;
  opts.seed = a.seed;
  opts.dynamic = a.dynamic;
  bool const root = world.rank() == 0;
  opts.on_round = [root](telar::RoundSummary const& s) {
    if (root)
      std::fprintf(stderr, "round %d/%d: %d configuration%s x %lld steps, %d failed, %.2f s\n",
                   s.round + 1, s.rounds, s.configurations, s.configurations == 1 ? "" : "s",
                   s.budget, s.failed, s.seconds);
  };
  auto const result =
      telar::successive_halving(comm, space(a).grid(), opts, [&](telar::Trial const& trial) {
        if (a.precision == "bf16")
          return train_bf16(trial, a, d);
        return with_optimizer(trial.config().get("optimizer"),
                              [&](auto opt) { return train<Strategy>(trial, a, d, opt); });
      });
  if (root)
    report(result, a);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  return example::run_main(argc, argv, "hpsearch", run);
}
