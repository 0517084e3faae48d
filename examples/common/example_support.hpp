// What the numbered examples share: the common flags, the training loop with
// its progress and per-epoch evaluation, the timeline files and the JSON
// summary. Each example keeps its model, its own flags and its strategy.
#pragma once

#include <telar/config.hpp>
#include <telar/data.hpp>
#include <telar/io/checkpoint_lock.hpp>
#include <telar/optim/adam.hpp>
#include <telar/optim/lamb.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/profile/machine_memory.hpp>
#include <telar/profile/trace.hpp>
#include <telar/schedule/svg.hpp>
#include <telar/schedule/tags.hpp>
#include <telar/train/json.hpp>
#include <telar/train/progress.hpp>
#include <telar/train/trainer.hpp>
#if TELAR_HAVE_HDF5
#include <telar/io/checkpoint.hpp>
#endif

#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace example {

// An example's usage message; it throws the exit code 2.
using Usage = void (*)(char const* why);

// The flags every example takes. The defaults that differ come from the example.
struct CommonArgs {
  CommonArgs(int default_epochs, std::size_t default_hidden)
      : epochs(default_epochs), hidden(default_hidden) {}
  int epochs;
  std::size_t batch = 64;
  double lr = 1e-3;
  std::string optimizer = "adamw";
  std::uint64_t seed = 1;
  std::size_t hidden;
  std::string data = telar::default_fashion_mnist_dir();
  bool json = false;
  int dp = 0, pp = 1, tp = 1;
  std::string schedule = "1f1b";
  int microbatches = 0; // 0: pp * 2 when pipelining, else 1
  std::string timeline;
  long limit_steps = -1;
  std::size_t memory_budget = 0; // bytes per rank (0: none)
  std::string checkpoint_dir;    // --checkpoint-dir (empty: no checkpoints)
  long checkpoint_every = 0;     // steps between checkpoints (0: only at the end)
  bool resume = false;           // continue from the newest checkpoint in the directory
  telar::NonFinite nonfinite = telar::NonFinite::stop; // a step with a NaN or infinity
  bool layout_auto = false;       // --layout auto: the planner's fastest layout that fits
  bool dry_run = false;           // --dry-run: print the planner's ranking and train nothing
  std::string profile;            // --profile: the machine profile (empty: the cached one)
  std::string layout_reason;      // why this layout: the planner's, or empty (given by flags)
  std::string precision = "fp32"; // --precision fp32|bf16 (docs/precision.md)
  bool takes_precision = false;   // the example has --precision (else: unknown flag)
  bool bf16_weight_copy = true;   // --bf16-weight-copy 1|0 (TrainerOptions::bf16_weight_copy)
};

// "1.5GB", "512MiB", "2000000": bytes (B, KB, MB, GB powers of 1000; KiB,
// MiB, GiB powers of 1024); 0 when malformed, and 0 with *too_large set
// when well-formed but past what a size_t holds.
inline std::size_t parse_bytes(std::string const& text, bool* too_large = nullptr) {
  char* end = nullptr;
  double const v = std::strtod(text.c_str(), &end);
  std::string const unit(end);
  static std::pair<char const*, double> const units[] = {
      {"", 1},     {"B", 1},        {"KB", 1e3},        {"MB", 1e6},
      {"GB", 1e9}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  // 2^64 as a double: the first value a size_t cannot hold (converting one
  // at or past it is undefined behaviour, not a wrap).
  double const limit = 18446744073709551616.0;
  for (auto const& [name, scale] : units)
    if (unit == name && end != text.c_str() && v > 0) {
      if (!(v * scale < limit)) { // inf too ("1e999")
        if (too_large != nullptr)
          *too_large = true;
        return 0;
      }
      return std::size_t(v * scale);
    }
  return 0;
}

// "gpipe|1f1b|...": the schedule tags' canonical names.
inline std::string schedule_choices() {
  std::string out;
  for (auto const& n : telar::schedule::schedule_names())
    out += (out.empty() ? "" : "|") + n;
  return out;
}

// Walks argv flag by flag; a missing or malformed value ends in usage().
class ArgReader {
public:
  ArgReader(int argc, char** argv, Usage usage) : argc_(argc), argv_(argv), usage_(usage) {}

  // Moves to the next flag; false past the last one.
  bool next() {
    if (++i_ >= argc_)
      return false;
    flag_ = argv_[i_];
    return true;
  }
  std::string const& flag() const { return flag_; }

  // The current flag's value (the next argument).
  std::string value() {
    if (i_ + 1 >= argc_)
      fail(flag_ + " needs a value");
    return argv_[++i_];
  }

  // The value as an integer in [lo, hi]: trailing characters, overflow and
  // values out of range are errors naming the flag and the value as typed.
  long long integer(long long lo = 0, long long hi = std::numeric_limits<int>::max()) {
    std::string const v = value();
    char* end = nullptr;
    errno = 0;
    long long const x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != 0 || errno == ERANGE || x < lo || x > hi)
      fail(flag_ + " expects an integer from " + std::to_string(lo) + " to " + std::to_string(hi) +
           ", got '" + v + "'");
    return x;
  }
  long number() { return long(integer(0)); }

  // The value as a path: an empty one (--checkpoint-dir "", an unset shell
  // variable) is refused, not read as "no such output".
  std::string path(char const* what) {
    std::string v = value();
    if (v.empty())
      fail(flag_ + " expects " + what + ", got an empty string");
    return v;
  }

  // The value as a finite real greater than zero.
  double positive_real() {
    std::string const v = value();
    char* end = nullptr;
    errno = 0;
    double const x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != 0 || errno == ERANGE || !std::isfinite(x) || !(x > 0))
      fail(flag_ + " expects a finite number greater than 0, got '" + v + "'");
    return x;
  }

  // The value as a real in [0, hi), "0" included (positive_real's are not).
  double fraction(double hi) {
    std::string const v = value();
    char* end = nullptr;
    double const x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != 0 || !(x >= 0 && x < hi))
      fail(flag_ + " expects a number from 0 up to " + (hi == 1 ? "1 (excluded)" : "any") +
           ", got '" + v + "'");
    return x;
  }

  [[noreturn]] void fail(std::string const& why) const {
    usage_(why.c_str());
    throw 2; // usage() throws already; this tells the compiler
  }

private:
  int argc_;
  char** argv_;
  Usage usage_;
  int i_ = 0;
  std::string flag_;
};

// Reads the current flag into `a` when it is a common one; false otherwise.
// --schedule is left to the example (one checks the spelling, one does not).
inline bool read_common_flag(ArgReader& r, CommonArgs& a) {
  std::string const& f = r.flag();
  if (f == "--precision" && a.takes_precision)
    a.precision = r.value();
  else if (f == "--bf16-weight-copy" && a.takes_precision)
    a.bf16_weight_copy = r.integer(0, 1) == 1;
  else if (f == "--epochs")
    a.epochs = int(r.integer(1));
  else if (f == "--batch")
    a.batch = std::size_t(r.integer(1));
  else if (f == "--lr")
    a.lr = r.positive_real();
  else if (f == "--optimizer")
    a.optimizer = r.value();
  else if (f == "--seed")
    a.seed = std::uint64_t(r.integer(0, std::numeric_limits<long long>::max()));
  else if (f == "--hidden")
    a.hidden = std::size_t(r.integer(1));
  else if (f == "--data")
    a.data = r.path("a directory");
  else if (f == "--json")
    a.json = true;
  else if (f == "--dp")
    a.dp = int(r.integer(0)); // 0: the ranks left over
  else if (f == "--pp")
    a.pp = int(r.integer(1));
  else if (f == "--tp")
    a.tp = int(r.integer(1));
  else if (f == "--microbatches")
    a.microbatches = int(r.integer(1));
  else if (f == "--timeline")
    a.timeline = r.path("a file name prefix");
  else if (f == "--limit-steps")
    a.limit_steps = long(r.integer(1, std::numeric_limits<long>::max()));
  else if (f == "--checkpoint-dir")
    a.checkpoint_dir = r.path("a directory");
  else if (f == "--checkpoint-every")
    a.checkpoint_every = long(r.integer(1, std::numeric_limits<long>::max()));
  else if (f == "--resume")
    a.resume = true;
  else if (f == "--layout") {
    std::string const v = r.value();
    if (v != "auto" && v != "manual")
      r.fail("--layout expects auto or manual, got '" + v + "'");
    a.layout_auto = v == "auto";
  } else if (f == "--dry-run")
    a.dry_run = true;
  else if (f == "--profile")
    a.profile = r.path("a file");
  else if (f == "--memory-budget") {
    std::string const v = r.value();
    bool too_large = false;
    a.memory_budget = parse_bytes(v, &too_large);
    if (too_large)
      r.fail("--memory-budget " + v +
             " is too large: at most 18446744073709551615 bytes (2^64 - 1, 16 EiB)");
    if (a.memory_budget == 0)
      r.fail("--memory-budget takes a size such as 1.5GB, 512MiB or 100000 (B, KB, MB, GB, KiB, "
             "MiB, GiB)");
  } else if (f == "--nonfinite") {
    std::string const v = r.value();
    if (v != "stop" && v != "skip")
      r.fail("--nonfinite expects stop or skip, got '" + v + "'");
    a.nonfinite = v == "stop" ? telar::NonFinite::stop : telar::NonFinite::skip;
  } else if (f == "--help" || f == "-h")
    r.fail("help");
  else
    return false;
  return true;
}

inline void check_common(CommonArgs const& a, Usage usage) {
  if (a.epochs < 1 || a.batch < 1 || a.hidden < 1 || !(a.lr > 0))
    usage("--epochs, --batch, --hidden and --lr must be positive");
  if (a.precision != "fp32" && a.precision != "bf16")
    usage(("--precision expects fp32 or bf16, got '" + a.precision + "'").c_str());
}

// --precision bf16 in an example whose strategy type is S: S with
// telar::Precision<telar::bf16, float>, which rebinds the model's Dense,
// convolution and attention layers to bf16 compute (docs/precision.md).
template <class S>
struct with_bf16;
template <class... Ps>
struct with_bf16<telar::Strategy<Ps...>> {
  using type = telar::Strategy<Ps..., telar::Precision<telar::bf16, float>>;
};
template <class S>
using Bf16 = typename with_bf16<S>::type;

// --precision bf16 is one more Trainer type (compile time), so it comes with
// one optimizer, AdamW (and the planner plans that one type).
template <class Usage>
void check_bf16_run(CommonArgs const& a, Usage usage) {
  if (a.precision == "bf16" && a.optimizer != "adamw")
    usage("--precision bf16 trains with --optimizer adamw");
}

// The GEMM policy the model runs under --precision.
inline char const* gemm_name(std::string const& precision) {
  return precision == "bf16" ? telar::Bf16Gemm::name()
                             : telar::gemm_backend_name<float, telar::DefaultMemorySpace>();
}

// The convolution policy the model runs under --precision.
inline char const* conv_name(std::string const& precision) {
  return precision == "bf16" ? telar::bf16_conv_policy_t<float, telar::DefaultMemorySpace>::name()
                             : telar::conv_backend_name<float, telar::DefaultMemorySpace>();
}

// What --precision ran, for the JSON summary: bf16, or fp32 where the CPU
// (or GPU) lacks the bf16 instructions and TELAR_BF16_FALLBACK=fp32 asked for the
// fallback (the summary says what ran, not what was asked for).
inline std::string precision_ran(std::string const& precision) {
  if (precision == "bf16" && !telar::require_bf16<telar::DefaultMemorySpace>("--precision bf16"))
    return "fp32 (TELAR_BF16_FALLBACK)";
  return precision;
}

// Which kernels multiplied, for the JSON summary: the bf16 implementations
// as oneDNN (matmul, convolutions) and cuBLAS reported them, or the fp32
// GEMM backend.
inline std::string gemm_kernels(std::string const& precision) {
  if (precision == "bf16")
    return telar::bf16_kernels();
  std::string const name = gemm_name(precision);
  return name == "onednn" ? "dnnl_sgemm" : name;
}

// Calls train(optimizer) with the optimizer --optimizer names.
template <class T, class Train>
int with_optimizer(std::string const& name, Usage usage, Train train) {
  if (name == "sgd")
    return train(telar::SGD<T>{});
  if (name == "momentum") {
    telar::SGD<T> o;
    o.momentum = 0.9f;
    return train(o);
  }
  if (name == "adam")
    return train(telar::Adam<T>{});
  if (name == "adamw")
    return train(telar::AdamW<T>{});
  if (name == "lamb")
    return train(telar::LAMB<T>{});
  usage(("unknown optimizer '" + name + "'").c_str());
  return 2; // not reached: usage() throws
}

// Micro-batches per step: --microbatches, else 2 x pp when pipelining, else 1.
inline int microbatches_of(CommonArgs const& a) {
  return a.microbatches > 0 ? a.microbatches : (a.pp > 1 ? 2 * a.pp : 1);
}

// Why the run's memory budget is what it is, when no --memory-budget gave
// it (appended to the plan's refusal); empty otherwise.
inline std::string default_budget_note;

// The default memory budget per rank: the host's available memory (the
// smallest reading of any rank) over the ranks on the busiest host, so that
// a run larger than the machine is refused by the memory plan, naming the
// flag that made it large, not killed in the allocator (collective; the same
// on every rank). 0 (none) for device memory, or when unknown.
inline std::size_t machine_budget(MPI_Comm comm) {
  if constexpr (!Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                            telar::DefaultMemorySpace>::accessible)
    return 0;
  telar::MachineMemory const mem = telar::machine_memory();
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int on_node = 1;
  MPI_Comm_size(node, &on_node);
  MPI_Comm_free(&node);
  unsigned long long v[2] = {mem.bytes / (unsigned long long)on_node, // min over ranks
                             ~0ULL - (unsigned long long)on_node};    // max ranks per host
  MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_UNSIGNED_LONG_LONG, MPI_MIN, comm);
  on_node = int(~0ULL - v[1]);
  if (v[0] == 0)
    return 0;
  default_budget_note = "; that budget is the default: this host's available memory "
                        "(MemAvailable, or its cgroup's limit if lower) over its " +
                        std::to_string(on_node) + " rank(s) (--memory-budget sets another)";
  return std::size_t(v[0]);
}

// Grid, schedule and a warm-up + cosine learning rate over the whole run.
// Given the communicator, a run without --memory-budget is budgeted to the
// machine's memory (machine_budget).
inline telar::TrainerOptions trainer_options(CommonArgs const& a, std::size_t train_size,
                                             MPI_Comm comm = MPI_COMM_NULL) {
  telar::TrainerOptions opts;
  opts.seed = a.seed;
  opts.grid = {a.dp, a.pp, a.tp};
  opts.schedule = a.schedule;
  opts.microbatches = microbatches_of(a);
  opts.trace = !a.timeline.empty();
  opts.memory_budget = a.memory_budget;
  if (a.memory_budget == 0 && comm != MPI_COMM_NULL)
    opts.memory_budget = machine_budget(comm);
  opts.batch_size = a.batch; // for the memory plan's activations
  opts.nonfinite = a.nonfinite;
  opts.bf16_weight_copy = a.bf16_weight_copy;
  std::size_t const steps_per_epoch = train_size / a.batch;
  if (steps_per_epoch == 0) // a run that trains nothing must not report success
    throw telar::Error("--batch " + std::to_string(a.batch) + " is larger than the " +
                       std::to_string(train_size) + " training samples: no step would run");
  long long const total_steps = (long long)steps_per_epoch * a.epochs;
  opts.lr = telar::warmup_cosine(a.lr, std::min<long long>(100, total_steps / 10), total_steps,
                                 a.lr * 0.05);
  return opts;
}

// Each data-parallel rank trains on an equal share of the global batch, cut
// into the micro-batches (checked here, before any step).
inline std::size_t local_batch(CommonArgs const& a, int dp, char const* program) {
  if (a.batch % std::size_t(dp) != 0)
    throw telar::Error(std::string(program) + ": --batch " + std::to_string(a.batch) +
                       " is not divisible by dp=" + std::to_string(dp));
  std::size_t const local = a.batch / std::size_t(dp);
  int const m = microbatches_of(a);
  if (std::size_t(m) > local)
    throw telar::Error(std::string(program) + ": " +
                       (a.microbatches > 0 ? "--microbatches " + std::to_string(m)
                                           : std::to_string(m) + " micro-batches (2 x pp)") +
                       " is more than the local batch of " + std::to_string(local) +
                       " samples (--batch " + std::to_string(a.batch) +
                       " over dp=" + std::to_string(dp) + "): every micro-batch needs a sample");
  return local;
}

// Synthetic samples of any shape in `classes` classes, for benchmarks and
// for models that do not take Fashion-MNIST: `n` training samples and n / 4
// held-out ones, shaped `shape` (telar::make_synthetic's separable clusters).
inline telar::FashionMnist synthetic_data(std::size_t n, telar::Shape const& shape, int classes,
                                          std::uint64_t seed) {
  telar::SyntheticOptions test_options;
  test_options.first_sample = n;
  telar::FashionMnist d{telar::make_synthetic(n, shape.size(), classes, seed),
                        telar::make_synthetic(n / 4, shape.size(), classes, seed, test_options)};
  d.train.shape.assign(shape.dims.begin(), shape.dims.begin() + shape.rank);
  d.test.shape = d.train.shape;
  return d;
}

// The first `count` test samples, on the device once for every evaluation.
inline telar::BatchGather<telar::DefaultMemorySpace> test_set(telar::Dataset const& test,
                                                              std::size_t count) {
  telar::BatchGather<telar::DefaultMemorySpace> set;
  std::vector<std::size_t> all(count);
  for (std::size_t i = 0; i < all.size(); ++i)
    all[i] = i;
  set.gather(test, all);
  return set;
}

// What a run measured.
struct Result {
  double last_loss = 0;     // mean training loss of the last epoch
  telar::StepResult test{}; // the test set after the last epoch
  long long samples = 0, steps = 0, skipped_steps = 0;
  double train_seconds = 0;
  double median_ms = 0; // median step time
  double param_l2 = 0;
  double predicted_ms = 0; // the cost model's step time for this layout (0: none)
};

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// "--seed 1 --batch 64 --lr 0.001 --epochs 3" and the example's `extra`:
// the flags a resumed run must repeat, because the data order and the
// learning-rate schedule are functions of them (saved with each checkpoint).
inline std::string run_config(CommonArgs const& a, std::string const& extra = "") {
  char lr[32];
  std::snprintf(lr, sizeof lr, "%.9g", a.lr);
  return "--seed " + std::to_string(a.seed) + " --batch " + std::to_string(a.batch) + " --lr " +
         lr + " --epochs " + std::to_string(a.epochs) + extra;
}

// The flags of `now` whose values differ in `saved` ("--flag value ..."
// lists): "--seed 2, this run has --seed 1"; "" when all shared flags agree.
inline std::string config_difference(std::string const& saved, std::string const& now) {
  auto pairs = [](std::string const& text) {
    std::vector<std::pair<std::string, std::string>> out;
    std::istringstream in(text);
    for (std::string flag, value; in >> flag >> value;)
      out.emplace_back(flag, value);
    return out;
  };
  std::string was, is;
  auto const old = pairs(saved);
  for (auto const& [flag, value] : pairs(now))
    for (auto const& [oflag, ovalue] : old)
      if (flag == oflag && value != ovalue) {
        was += (was.empty() ? "" : " ") + flag + " " + ovalue;
        is += (is.empty() ? "" : " ") + flag + " " + value;
      }
  return was.empty() ? "" : was + ", this run has " + is;
}

// --checkpoint-dir: the training state after `batch` batches of `epoch`.
template <class TrainerT>
void save(TrainerT& trainer, CommonArgs const& a, int epoch, long long batch,
          std::string const& extra = "") {
#if TELAR_HAVE_HDF5
  if (!a.checkpoint_dir.empty())
    telar::save_checkpoint(trainer, a.checkpoint_dir, {epoch, batch, a.seed, run_config(a, extra)});
#else
  (void)trainer, (void)a, (void)epoch, (void)batch, (void)extra;
#endif
}

// --resume: the newest checkpoint's state and position ({0, 0} without one:
// a first run and its requeued copies can share one command line). A
// checkpoint of other training flags (run_config) is refused on every rank
// (each reads the same file), never silently continued with this run's.
template <class TrainerT>
telar::RunPosition resume(TrainerT& trainer, CommonArgs const& a, std::string const& extra = "") {
#if TELAR_HAVE_HDF5
  if (!a.resume)
    return {};
  auto const last = telar::latest_checkpoint(a.checkpoint_dir);
  if (!last) {
    if (trainer.rank() == 0)
      std::fprintf(stderr, "--resume: no checkpoint in %s: starting at step 0\n",
                   a.checkpoint_dir.c_str());
    return {};
  }
  auto const pos = telar::load_checkpoint(trainer, *last);
  std::string const saved = pos.config.empty() ? "--seed " + std::to_string(pos.seed) : pos.config;
  if (std::string const diff = config_difference(saved, run_config(a, extra)); !diff.empty())
    throw telar::Error("--resume: " + *last + " was written by a run with " + diff +
                       ": give the same values to continue it (the data order and the "
                       "learning-rate schedule follow them), or another --checkpoint-dir to "
                       "start afresh");
  if (trainer.rank() == 0)
    std::fprintf(stderr, "resumed at step %lld (epoch %lld, batch %lld) from %s\n", trainer.steps(),
                 pos.epoch + 1, pos.batch, last->c_str());
  return pos;
#else
  (void)trainer, (void)a, (void)extra;
  return {};
#endif
}

// One epoch's steps, with a progress bar on rank 0; false once --limit-steps is reached.
template <class TrainerT>
bool train_epoch(TrainerT& trainer, CommonArgs const& a, telar::Dataset const& train,
                 telar::BatchLoader& loader, telar::BatchGather<telar::DefaultMemorySpace>& gather,
                 int epoch, std::vector<double>& step_ms, Result& r, std::size_t first = 0) {
  telar::ProgressBar bar("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(a.epochs),
                         (long long)loader.size(), trainer.rank() == 0);
  double sum = 0;
  long long n = 0, ran = 0;
  bool go_on = true;
  telar::LocalBatch batch;
  for (std::size_t s = first; s < loader.size(); ++s) {
    loader.batch(s, batch);
    gather(train, batch);
    auto step = trainer.step(gather.x(), gather.y());
    step_ms.push_back(step.seconds * 1e3);
    r.train_seconds += step.seconds;
    r.samples += step.samples;
    if (!step.skipped) { // a skipped step's loss is NaN or infinite: the mean is of the others
      sum += step.loss;
      ++n;
    }
    ++ran;
    ++r.steps;
    if (s % 20 == 0 || s + 1 == loader.size()) {
      char m[96];
      std::snprintf(m, sizeof m, "loss %.4f lr %.2e", sum / double(n), step.lr);
      bar.update((long long)s + 1, m, double(a.batch));
    }
    bool const last = a.limit_steps > 0 && trainer.steps() >= a.limit_steps;
    if (a.checkpoint_every > 0 && trainer.steps() % a.checkpoint_every == 0 && !last)
      save(trainer, a, epoch, (long long)s + 1);
    if (last) { // --limit-steps counts the steps of resumed runs too
      go_on = false;
      break;
    }
  }
  r.last_loss = n > 0 ? sum / double(n) : ran > 0 ? std::nan("") : 0.0; // NaN: all skipped
  return go_on;
}

// Whether `path` can be written (rank 0 tries; a file it had to create is removed again).
inline bool writable(std::string const& path) {
  std::FILE* probe = std::fopen(path.c_str(), "r");
  bool const existed = probe != nullptr;
  if (probe != nullptr)
    std::fclose(probe);
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr)
    return false;
  std::fclose(f);
  if (!existed)
    std::remove(path.c_str());
  return true;
}

// Rank 0's lock on --checkpoint-dir (telar::CheckpointLock), held for the
// run: a second run given the same directory is refused.
using DirLock = std::optional<telar::CheckpointLock>;

// Takes the lock of `dir` into `lock`; the refusal's message, or "".
inline std::string lock_dir(std::string const& dir, DirLock& lock) {
  try {
    lock.emplace(dir);
  } catch (telar::CheckpointError const& e) {
    return e.what();
  }
  if (!lock->warning().empty())
    std::fprintf(stderr, "warning: %s\n", lock->warning().c_str());
  return {};
}

// The files the run will write are checked before it trains, so a run never
// trains for hours and then fails to save what it produced (collective over
// `world`, every rank of the run; null: this process alone). Returns the
// checkpoint directory's lock: keep it until the run ends.
[[nodiscard]] inline DirLock check_output_files(telar::Communicator const* world,
                                                CommonArgs const& a) {
  std::string bad;
  DirLock lock;
  bool const root = world == nullptr || world->rank() == 0;
  if (root && (a.resume || a.checkpoint_every > 0) && a.checkpoint_dir.empty())
    bad = "--resume and --checkpoint-every need --checkpoint-dir";
  if (root && bad.empty() && !a.checkpoint_dir.empty()) {
#if TELAR_HAVE_HDF5
    std::error_code ec;
    std::filesystem::create_directories(a.checkpoint_dir, ec);
    if (!writable(a.checkpoint_dir + "/.telar_probe"))
      bad = "--checkpoint-dir " + a.checkpoint_dir + ": cannot write there";
    else
      bad = lock_dir(a.checkpoint_dir, lock);
#else
    bad = "--checkpoint-dir: this build has no parallel HDF5 (TELAR_ENABLE_HDF5)";
#endif
  }
  if (root && bad.empty() && !a.timeline.empty())
    for (char const* ext : {".json", ".svg"})
      if (bad.empty() && !writable(a.timeline + ext))
        bad = "--timeline " + a.timeline + ": cannot write " + a.timeline + ext;
  // Rank 0's verdict, word for word on every rank.
  if (world != nullptr && world->size() > 1) {
    unsigned long long n = bad.size();
    world->broadcast(&n, 1, 0);
    bad.resize(std::size_t(n));
    world->broadcast(bad.data(), bad.size(), 0);
  }
  if (!bad.empty())
    throw telar::Error(bad);
  return lock;
}
template <class TrainerT>
[[nodiscard]] DirLock check_outputs(TrainerT const& trainer, CommonArgs const& a) {
  auto const* grid = trainer.grid();
  return check_output_files(grid != nullptr ? &grid->world() : nullptr, a);
}

// What a run checks once its Trainer stands and before it reads its data, so
// that a refused flag costs no load: the local batch and the files it will
// write (collective).
struct Preflight {
  std::size_t local; // samples per data-parallel rank and step
  DirLock lock;      // the checkpoint directory's, held until the run ends
};

template <class TrainerT>
[[nodiscard]] Preflight preflight(TrainerT const& trainer, CommonArgs const& a,
                                  char const* program) {
  std::size_t const local = local_batch(a, trainer.grid_shape().dp, program);
  return {local, check_outputs(trainer, a)};
}

// Trains --epochs epochs (or --limit-steps steps), evaluating after each.
template <class TrainerT>
Result fit(TrainerT& trainer, CommonArgs const& a, Preflight const& checked,
           telar::FashionMnist const& data,
           telar::BatchGather<telar::DefaultMemorySpace>& test_set) {
  std::size_t const local = checked.local;
  telar::DistributedSampler sampler(data.train.size, trainer.grid_shape().dp,
                                    trainer.grid_coords().dp, a.seed, true, telar::LastBatch::drop);
  telar::BatchLoader loader(sampler, local);
  telar::BatchGather<telar::DefaultMemorySpace> gather(local, data.train.features);
  std::vector<double> step_ms;
  Result r;
  auto const pos = resume(trainer, a);
  bool go_on = a.limit_steps <= 0 || trainer.steps() < a.limit_steps;
  int epoch = int(pos.epoch);
  for (; epoch < a.epochs && go_on; ++epoch) {
    loader.set_epoch(std::uint64_t(epoch));
    std::size_t const first = epoch == pos.epoch ? std::size_t(pos.batch) : 0;
    go_on = train_epoch(trainer, a, data.train, loader, gather, epoch, step_ms, r, first);
    r.test = trainer.evaluate(test_set.x(), test_set.y());
    if (trainer.rank() == 0)
      std::fprintf(stderr, "epoch %d: train loss %.4f, test loss %.4f, test accuracy %.2f%%\n",
                   epoch + 1, r.last_loss, r.test.loss, 100 * r.test.accuracy);
  }
  if (r.steps > 0 && go_on) // every epoch done: a resumed run starts after them
    save(trainer, a, epoch, 0);
  else if (r.steps > 0) // stopped in epoch - 1 (earlier epochs ran whole)
    save(trainer, a, epoch - 1, trainer.steps() - (long long)loader.size() * (epoch - 1));
  r.param_l2 = trainer.param_l2(); // collective: every rank
  // The first step allocates buffers and sets up communicators: a warm-up,
  // left out of the median once there are steps enough to spare it.
  if (step_ms.size() >= 3)
    step_ms.erase(step_ms.begin());
  r.median_ms = median(step_ms);
  r.skipped_steps = trainer.skipped_steps();
  return r;
}

// --timeline: a Chrome trace of every rank and, when pipelining, an SVG chart
// of the last step (collective).
template <class TrainerT>
void write_timeline(TrainerT& trainer, std::string const& prefix, char const* program) {
  if (prefix.empty())
    return;
  bool const root = trainer.rank() == 0;
  std::string const path = prefix + ".json";
  if (trainer.write_trace(path) && root)
    std::fprintf(stderr, "%s: timeline written to %s (open in ui.perfetto.dev)\n", program,
                 path.c_str());
  // The last training step's pipeline, drawn like the simulator's charts.
  auto const tl = trainer.pipeline_timeline();
  if (root && trainer.grid_shape().pp > 1) {
    auto const stats = telar::schedule::analyze(tl);
    telar::schedule::SvgOptions svg;
    svg.title = tl.name + ", last step";
    telar::schedule::write_svg(tl, prefix + ".svg", svg);
    std::fprintf(stderr, "%s: pipeline chart %s.svg (bubble %.1f%%)\n", program, prefix.c_str(),
                 100 * stats.bubble_fraction);
  }
}

// The "config" keys every example reports, in order; the example appends its own.
template <class Model, class Strategy, class Optimizer, class Loss>
telar::JsonObject common_config(telar::Trainer<Model, Strategy, Optimizer, Loss> const& trainer,
                                CommonArgs const& a) {
  telar::JsonObject config;
  config.add("epochs", a.epochs)
      .add("batch", (long long)a.batch)
      .add("lr", a.lr)
      .add("optimizer", Optimizer::name())
      .add("seed", (long long)a.seed)
      .add("hidden", (long long)a.hidden)
      .add("ranks", trainer.size())
      .add("dp", trainer.grid_shape().dp)
      .add("pp", trainer.grid_shape().pp)
      .add("tp", trainer.grid_shape().tp)
      .add("schedule", trainer.pipeline_schedule().name)
      .add("microbatches", trainer.options().microbatches)
      .add("precision", precision_ran(a.precision))
      .add("bf16_weight_copy", a.bf16_weight_copy)
      .add("gemm_kernels", gemm_kernels(a.precision))
      .add("host_loops", telar::host_loops());
  return config;
}

// The end of a run: the cost model's step time against the measured median.
inline void print_prediction(double predicted_ms, double measured_ms) {
  if (predicted_ms > 0)
    std::fprintf(stderr, "step time: predicted %.2f ms, measured %.2f ms (median, %+.0f%%)\n",
                 predicted_ms, measured_ms, 100 * (measured_ms / predicted_ms - 1));
}

// The JSON summary's predicted_step_ms and layout_reason (beside step_ms_median).
inline telar::JsonObject& add_prediction(telar::JsonObject& j, CommonArgs const& a,
                                         double predicted_ms) {
  return j.add("predicted_step_ms", predicted_ms)
      .add("layout_reason", a.layout_reason.empty() ? "given by flags" : a.layout_reason);
}

// --nonfinite skip: skipped steps are named on the terminal (rank 0); a run
// that skipped more than half of its steps, or whose final `what` loss is
// not finite, diverged: every rank throws the same message (the counts and
// losses are reduced values), so the run fails instead of exiting 0.
inline void check_divergence(long long skipped, long long steps, double loss, char const* what,
                             bool root) {
  std::string const counted = std::to_string(skipped) + " of " + std::to_string(steps) + " steps";
  if (skipped * 2 > steps)
    throw telar::Error("--nonfinite skip skipped " + counted +
                       " (more than half: a loss or gradient was NaN or infinite): the run "
                       "diverged; lower --lr or find the step with --nonfinite stop");
  if (!std::isfinite(loss))
    throw telar::Error(std::string("the final ") + what + " is " + telar::detail::loss_text(loss) +
                       " (" + counted + " skipped): the run diverged");
  if (skipped > 0 && root)
    std::fprintf(stderr,
                 "warning: --nonfinite skip skipped %s (a loss or gradient was NaN or "
                 "infinite)\n",
                 counted.c_str());
}

// Rank 0's measured and planned memory peaks: printed, and as JSON fields.
template <class TrainerT>
void print_memory(TrainerT const& trainer) {
  std::fprintf(stderr, "memory (rank 0, peak since construction): %s\nmemory plan (rank 0): %s\n",
               trainer.memory().str().c_str(), trainer.memory_plan().bytes.str().c_str());
}
template <class TrainerT>
telar::JsonObject& add_memory(telar::JsonObject& j, TrainerT const& trainer) {
  return j.raw("memory", trainer.memory().json())
      .raw("memory_plan", trainer.memory_plan().bytes.json());
}

// Rank 0: the final line and, with --json, the one-line summary the tests parse.
template <class TrainerT>
void print_report(TrainerT const& trainer, CommonArgs const& a, Result const& r,
                  telar::JsonObject const& config) {
  if (trainer.rank() != 0)
    return;
  double const samples_per_s = double(r.samples) / r.train_seconds;
  std::fprintf(stderr, "final: test accuracy %.2f%%, median step %.2f ms, %.0f samples/s\n",
               100 * r.test.accuracy, r.median_ms, samples_per_s);
  print_prediction(r.predicted_ms, r.median_ms);
  print_memory(trainer);
  if (!a.json)
    return;
  telar::JsonObject j;
  j.add("final_loss", r.last_loss)
      .add("test_loss", r.test.loss)
      .add("test_accuracy", r.test.accuracy)
      .add("samples_per_s", samples_per_s)
      .add("step_ms_median", r.median_ms);
  add_prediction(j, a, r.predicted_ms)
      .add("param_l2", r.param_l2)
      .add("steps", r.steps)
      .add("skipped_steps", r.skipped_steps)
      .add("strategy", trainer.strategy_name())
      .add("layout", trainer.layout());
  add_memory(j, trainer).add("config", config);
  std::printf("%s\n", j.str().c_str());
  std::fflush(stdout);
}

// The run's summary (print_report), then every rank: check_divergence.
template <class TrainerT>
void report(TrainerT const& trainer, CommonArgs const& a, Result const& r,
            telar::JsonObject const& config) {
  print_report(trainer, a, r, config);
  check_divergence(trainer.skipped_steps(), trainer.steps(), r.test.loss, "test loss",
                   trainer.rank() == 0);
}

// MPI and Kokkos around run(comm, argc, argv); a usage error (the same on
// every rank: they parse the same flags) exits with its code. Any other error
// is printed by the rank that raised it, which then ends the whole job with
// MPI_Abort: the other ranks may be waiting for it in a collective, and would
// otherwise wait out the communication timeout (or hang in MPI_Finalize).
template <class Run>
int run_main(int argc, char** argv, char const* program, Run run) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    try {
      rc = run(MPI_COMM_WORLD, argc, argv);
    } catch (int code) {
      rc = code;
    } catch (std::exception const& e) {
      std::fprintf(stderr, "%s: rank %d: %s\n", program, rank, e.what());
      std::fflush(stderr);
      int size = 1;
      MPI_Comm_size(MPI_COMM_WORLD, &size);
      if (size > 1) {
        // Half a second before the abort: the launcher forwards what was
        // printed (MPICH's hydra dropped it when the abort came at once), and
        // ranks failing the same way print too. Then end the job, also for
        // ranks that did not fail and wait on this one.
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        telar::detail::exit_if_abort_hangs(1); // a lost host can hold MPI_Abort
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      rc = 1;
    }
  }
  MPI_Finalize();
  return rc;
}

} // namespace example
