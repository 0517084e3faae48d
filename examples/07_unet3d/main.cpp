// Example 07: a 3-D U-Net segmenting synthetic lesions in volumes that are
// split over ranks by depth (spatial parallelism, docs/spatial.md).
//
// The world is dp x sp ranks: each sample's volume is cut into sp slabs of
// its depth (telar::split_extent), each rank reads only its slab of every
// sample from the HDF5 file (telar::VolumeReader, prefetching the next
// batch while the current one trains) and runs the U-Net on it
// (telar::spatial_unet: a telar::SlabGraph of the spatial wrappers, with
// halo exchanges at every 3x3x3 convolution and the concatenated skips
// local). Each rank's backward gives its slab's part of the gradients;
// telar::SlabDataParallel sums the parts and averages the replicas in one
// reduction over all dp x sp ranks, in buckets while backward runs (--zero
// 0), or with the optimizer state sharded over the dp x sp ranks (--zero 1:
// ZeRO-1; --zero 2: ZeRO-2, the gradients reduce-scattered group by group
// as well; --zero 3: ZeRO-3, the values too, each group of nodes gathered
// before it runs).
//
//   unet3d [--generate N | --data FILE.h5] [--size 32] [--depth 2] [--width 8]
//          [--sp S] [--dp D] [--epochs 16] [--batch 2] [--lr 0.003]
//          [--optimizer adam|sgd] [--dice 1] [--val N] [--lesions 3] [--seed 1]
//          [--norm group|batch] [--groups 4] [--eval-bn running|batch]
//          [--limit-steps N] [--json] [--save-params F] [--compare-params F]
//          [--memory-budget SIZE] [--no-overlap] [--precision fp32|bf16]
//          [--timeline PREFIX] [--layout auto] [--dry-run] [--profile FILE]
//          [--zero 0|1|2|3] [--checkpoint-dir DIR] [--checkpoint-every N] [--resume]
//          [--nonfinite stop|skip]
//   mpirun -np 2 unet3d --sp 2
//
// --generate N (default 160 without --data) writes N synthetic volumes of
// --size^3 voxels (background, noise and ellipsoidal lesions:
// docs/volumes.md) to --data (default unet3d_<size>_<N>.h5), then trains on
// them; the last --val volumes (default N / 5) are validation. The loss is
// the voxel cross entropy plus --dice W times the soft Dice loss (0: none).
// Adam (or SGD) with a cosine decay from --lr to --lr / 20. --norm group:
// GroupNorm (--groups per convolution, statistics per sample over the sp
// group); --norm batch: BatchNorm (over the batch and the sp group),
// validated with its running statistics or, --eval-bn batch, each batch's.
// The JSON summary has val_dice (the Dice of the lesion classes over every
// validation voxel), the median step time, the peak memory per rank and the
// planned one. --save-params / --compare-params write the trained
// parameters / report their largest difference from a saved run (the sp = 2
// test compares with sp = 1). --memory-budget SIZE refuses, before
// training and the same on every rank, a run whose plan (activations,
// input, labels, loss gradients, parameters and optimizer state) is over
// SIZE on some rank, naming the activations and the smallest --sp that
// fits. The JSON has the halo bytes this rank sent per step and the
// seconds per step its exchanges waited (exposed), and the weight-gradient
// sums over the spatial group per step (count, values, milliseconds in
// their blocking allreduces on rank 0); --no-overlap completes
// every exchange before computing (to measure what overlap hides).
// --timeline PREFIX writes PREFIX.json (Chrome trace, every rank a
// process: open it in ui.perfetto.dev): each node's forward and backward,
// the halo waits and gradient sums inside them, each exchange in flight,
// the loss, the optimizer and the steps.
// --checkpoint-dir DIR saves the training state (telar::save_checkpoint of
// the telar::SlabDataParallel: every tensor whole, Adam's moments, the
// step, where the data stood) every --checkpoint-every steps and at the
// end; --resume continues from the newest one under any --dp, --sp and
// --zero (the same --seed, global batch, --lr, --epochs, --val,
// --limit-steps and --norm: the data order and the schedule follow them).
// --precision bf16 builds the U-Net with oneDNN's bf16 convolutions
// (telar::spatial_unet<T, M, telar::Bf16Gemm, telar::OneDnnConvBf16>: the
// 3x3x3, 1x1x1 and transposed ones): bf16 products, fp32 accumulation; the
// parameters (the masters), gradients, Adam's moments, the norms, the halos
// and the losses stay fp32 (docs/precision.md). The JSON says which
// convolution kernels ran ("conv", "gemm_kernels").
// --layout auto chooses dp x sp for the world (--batch then the global
// batch, shared by the replicas): every dp x sp ranked by the step time
// telar::predict_slab_step predicts on the machine profile (--profile, else
// the cached one), plain data parallelism preferred within 10%; --dry-run
// prints the ranking (JSON with --json) and trains nothing. The run then
// prints predicted against measured step time (JSON: predicted_step_ms,
// layout_reason).
#include <telar/comm/communicator.hpp>
#include <telar/comm/process_grid.hpp>
#include <telar/data/loader.hpp>
#include <telar/io/detail/agree.hpp>
#include <telar/io/volume.hpp>
#include <telar/optim/adam.hpp>
#include <telar/optim/lr_schedule.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/parallel/slab_data_parallel.hpp>
#include <telar/parallel/spatial_loss.hpp>
#include <telar/parallel/spatial_tally.hpp>
#include <telar/parallel/spatial_unet.hpp>
#include <telar/profile/gather.hpp>
#include <telar/profile/memory.hpp>
#include <telar/profile/trace.hpp>

#include "example_support.hpp"
#include "layout.hpp"
#include "layout_planning.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace {

using T = float;
// Slabs live where halos can be staged (host memory on a device build).
using M = telar::SlabMemorySpace;
using Exec = telar::SlabExecutionSpace;
// The U-Net under the convolutions' GEMM and convolution policies G, C:
// the defaults (fp32), or telar::Bf16Gemm and telar::OneDnnConvBf16.
template <class G, class C>
using UNetOf = typename telar::SpatialUNetLayers<T, M, G, C>::Graph;

// The common flags (epochs, batch, lr, optimizer, seed, data, json, dp,
// limit-steps) and this example's own.
struct Args : example::CommonArgs {
  Args() : CommonArgs(/*epochs*/ 16, /*hidden*/ 1) {
    batch = 2;
    lr = 3e-3;
    optimizer = "adam";
    data.clear(); // a volume file, not Fashion-MNIST
    takes_precision = true;
  }
  long long generate = 0; // volumes to write first (0: read --data)
  std::size_t size = 32, width = 8;
  int depth = 2, sp = 0, lesions = 3;
  // --zero: the optimizer state (2: and the gradients, 3: and the values) over dp x sp
  int zero = 0;
  bool zero_given = false; // --layout auto then keeps it
  long long val = -1;
  double dice = 1;
  std::string save_params, compare_params;
  std::string eval_bn = "running"; // validation's BatchNorm statistics: running or batch
  std::string norm = "group";      // batch or group
  std::size_t groups = 4;
  bool overlap = true;     // interior rows computed while the halo travels
  double predicted_ms = 0; // --layout auto: the chosen layout's predicted step
};

// The Trainer's flags, which this example (a SlabGraph trained by hand)
// does not offer.
bool trainer_flag(std::string const& f) {
  for (char const* t :
       {"--hidden", "--pp", "--tp", "--schedule", "--microbatches", "--bf16-weight-copy"})
    if (f == t)
      return true;
  return false;
}

[[noreturn]] void usage(char const* why) {
  std::fprintf(stderr,
               "unet3d: %s\n"
               "usage: unet3d [--generate N | --data FILE.h5] [--size EDGE] [--depth L] "
               "[--width W] [--sp S] [--dp D] [--epochs N] [--batch B] [--lr X] "
               "[--optimizer adam|sgd] [--dice W] [--val N] [--lesions K] [--seed N] "
               "[--norm batch|group] [--groups G] [--eval-bn running|batch] [--limit-steps N] "
               "[--json] [--save-params FILE] "
               "[--compare-params FILE] [--memory-budget SIZE] [--no-overlap] "
               "[--precision fp32|bf16] [--timeline PREFIX] [--layout auto] [--dry-run] "
               "[--profile FILE] [--zero 0|1|2|3] [--checkpoint-dir DIR] [--checkpoint-every N] "
               "[--resume] [--nonfinite stop|skip]\n",
               why);
  throw 2;
}

Args parse(int argc, char** argv) {
  Args a;
  example::ArgReader r(argc, argv, usage);
  while (r.next()) {
    std::string const& f = r.flag();
    if (f == "--generate")
      a.generate = r.integer(1);
    else if (f == "--size")
      a.size = std::size_t(r.integer(1));
    else if (f == "--depth")
      a.depth = int(r.integer(0, 6));
    else if (f == "--width")
      a.width = std::size_t(r.integer(1));
    else if (f == "--sp")
      a.sp = int(r.integer(1));
    else if (f == "--dice")
      a.dice = r.fraction(1e6); // 0: no Dice term
    else if (f == "--val")
      a.val = r.integer(1);
    else if (f == "--lesions")
      a.lesions = int(r.integer(1));
    else if (f == "--norm")
      a.norm = r.value();
    else if (f == "--groups")
      a.groups = std::size_t(r.integer(1));
    else if (f == "--eval-bn")
      a.eval_bn = r.value();
    else if (f == "--save-params")
      a.save_params = r.value();
    else if (f == "--compare-params")
      a.compare_params = r.value();
    else if (f == "--no-overlap")
      a.overlap = false;
    else if (f == "--zero")
      a.zero = int(r.integer(0)), a.zero_given = true;
    else if (f == "--timeline") // PREFIX.json: every rank's spans
      a.timeline = r.path("a file name prefix");
    else if (trainer_flag(f))
      usage((f + " is not offered: unet3d trains its U-Net without the Trainer (use --sp and "
                 "--dp)")
                .c_str());
    else if (!example::read_common_flag(r, a))
      usage(("unknown flag " + f).c_str());
  }
  if (a.zero > 3)
    usage(("--zero expects 0 (none), 1, 2 or 3 (ZeRO stages over dp x sp), got " +
           std::to_string(a.zero))
              .c_str());
  if (a.norm != "batch" && a.norm != "group")
    usage(("--norm expects batch or group, got '" + a.norm + "'").c_str());
  if (a.eval_bn != "running" && a.eval_bn != "batch")
    usage(("--eval-bn expects running or batch, got '" + a.eval_bn + "'").c_str());
  if (a.optimizer != "adam" && a.optimizer != "sgd")
    usage(("--optimizer expects adam or sgd, got '" + a.optimizer + "'").c_str());
  if (a.precision != "fp32" && a.precision != "bf16")
    usage(("--precision expects fp32 or bf16, got '" + a.precision + "'").c_str());
  if (a.precision == "bf16" && !telar::bf16_layers_supported<T, M>())
    usage("--precision bf16 needs oneDNN (host memory) or cuBLAS (CUDA memory)");
  if (a.generate == 0 && a.data.empty())
    a.generate = 160;
  if (a.generate > 0 && a.data.empty())
    a.data = "unet3d_" + std::to_string(a.size) + "_" + std::to_string(a.generate) + ".h5";
  return a;
}

// dp x sp = world: the flags given, the other degree from the world size.
void degrees(Args& a, int world) {
  auto const refuse = [&](char const* flag, int v) {
    usage((std::string(flag) + " " + std::to_string(v) + " does not divide the " +
           std::to_string(world) + " ranks (dp x sp = ranks)")
              .c_str());
  };
  if (a.sp > 0 && world % a.sp != 0)
    refuse("--sp", a.sp);
  if (a.dp > 0 && world % a.dp != 0)
    refuse("--dp", a.dp);
  if (a.sp == 0)
    a.sp = world / (a.dp > 0 ? a.dp : 1);
  if (a.dp == 0)
    a.dp = world / a.sp;
  if (a.sp * a.dp != world)
    usage(("--dp " + std::to_string(a.dp) + " x --sp " + std::to_string(a.sp) + " is not the " +
           std::to_string(world) + " ranks")
              .c_str());
}

// --val, or a fifth of the volumes (at least one).
long long validation_volumes(Args const& a, telar::VolumeShape const& v) {
  return a.val > 0 ? a.val : std::max(1LL, v.samples / 5);
}

// The U-Net needs edges that halve `depth` times; the volume's H and W too.
void check_volume(Args const& a, telar::VolumeShape const& v) {
  long long const step = 1LL << a.depth;
  for (long long e : {v.depth, v.height, v.width})
    if (e % step != 0)
      throw telar::DataError("unet3d: " + a.data + ": volumes of " + std::to_string(v.depth) + "x" +
                             std::to_string(v.height) + "x" + std::to_string(v.width) +
                             " do not halve " + std::to_string(a.depth) + " times (--depth " +
                             std::to_string(a.depth) + " needs every edge a multiple of " +
                             std::to_string(step) + ")");
  long long const samples = v.samples, val = validation_volumes(a, v);
  if (val >= samples)
    throw telar::DataError("unet3d: " + a.data + " holds " + std::to_string(samples) +
                           " volumes: too few for " + std::to_string(val) +
                           " validation volumes and at least one to train on");
}

// A batch's slabs as the graph's input [b, C * rows * H * W] and labels.
void to_device(telar::VolumeBatch const& b, telar::Matrix<T, M>& x, telar::VoxelLabels<M>& y) {
  std::size_t const n = b.samples(), cols = b.images.size() / std::max<std::size_t>(n, 1);
  std::size_t const voxels = b.labels.size() / std::max<std::size_t>(n, 1);
  if (x.extent(0) != n || x.extent(1) != cols)
    x = telar::Matrix<T, M>("unet3d::x", n, cols);
  if (y.extent(0) != n || y.extent(1) != voxels)
    y = telar::VoxelLabels<M>("unet3d::labels", n, voxels);
  auto hx = Kokkos::create_mirror_view(x);
  auto hy = Kokkos::create_mirror_view(y);
  std::copy(b.images.begin(), b.images.end(), hx.data());
  std::copy(b.labels.begin(), b.labels.end(), hy.data());
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(y, hy);
}

// The graph's data-parallel update (telar::SlabDataParallel): the
// parameters drawn from --seed, the slabs' gradients summed and averaged
// over dp in one reduction over the world while backward runs (--zero 0:
// allreduce buckets; 2, 3: reduce-scattered groups) or after it (1), Adam
// or SGD over this rank's shard (--zero 1 to 3: 1/(dp x sp) of the
// optimizer state), a cosine decay from --lr to --lr / 20 over the run's
// `steps`; its checkpoints.
template <class UNet>
class Update {
  template <class Sharding>
  using DP = telar::Strategy<telar::DataParallel<telar::TopologyAwareAllreduce, Sharding>,
                             telar::SpatialParallel>;
  template <class Sharding, class Opt>
  using Of = telar::SlabDataParallel<UNet, DP<Sharding>, Opt>;
  template <class Opt>
  using ByStage = std::variant<Of<telar::NoSharding, Opt>, Of<telar::ZeRO<1>, Opt>,
                               Of<telar::ZeRO<2>, Opt>, Of<telar::ZeRO<3>, Opt>>;

public:
  // `extra`: the flags beyond the common ones a resumed run must repeat.
  Update(Args const& a, long long steps, UNet& net, telar::ProcessGrid const& grid,
         telar::TraceRecorder* trace, std::string extra)
      : lr_(telar::warmup_cosine(a.lr, 0, steps, a.lr / 20)), config_(a), extra_(std::move(extra)) {
    config_.batch = a.batch * std::size_t(a.dp); // the global batch: dp may change on resume
    telar::SlabDataParallelOptions o;
    o.trace = trace;
    o.nonfinite = a.nonfinite; // --nonfinite stop|skip
    if (a.optimizer == "adam")
      make(a.zero, adam_, net, grid, a.seed, telar::Adam<T>{}, o);
    else
      make(a.zero, sgd_, net, grid, a.seed, telar::SGD<T>{}, o);
  }
  // The graph's forward (--zero 3: gathering each group of nodes).
  telar::Matrix<T, M> const& forward(telar::ConstMatrix<T, M> x) {
    telar::Matrix<T, M> const* y = nullptr;
    visit([&](auto& u) { y = &u.forward(Exec{}, x); });
    return *y;
  }
  // Every value in the graph's views (--zero 3: all-gathered; collective).
  void gather() {
    visit([&](auto& u) { u.gather(Exec{}); });
  }
  void backward(telar::ConstMatrix<T, M> dy) {
    visit([&](auto& u) { u.backward(Exec{}, dy); });
  }
  // The update at the schedule's next step (a resumed run's continues);
  // true when --nonfinite skip skipped it.
  bool step() {
    bool skipped = false;
    visit([&](auto& u) { skipped = u.step(Exec{}, lr_(u.steps() + 1)); });
    return skipped;
  }
  // Steps skipped (--nonfinite skip), a resumed run's before it included.
  long long skipped() {
    long long n = 0;
    visit([&](auto& u) { n = u.skipped_steps(); });
    return n;
  }
  // Steps taken, a resumed run's before it included.
  long long steps() {
    long long n = 0;
    visit([&](auto& u) { n = u.steps(); });
    return n;
  }
  // --checkpoint-dir: the state after `batch` batches of `epoch` (collective).
  void save(long long epoch, long long batch) {
    visit([&](auto& u) { example::save(u, config_, int(epoch), batch, extra_); });
  }
  // --resume: the newest checkpoint's state, under this run's dp, sp and
  // --zero; where its data stood ({0, 0} without one).
  telar::RunPosition resume() {
    telar::RunPosition pos;
    visit([&](auto& u) { pos = example::resume(u, config_, extra_); });
    return pos;
  }

private:
  // The stage's alternative, built in place (it binds the graph: not movable).
  template <class Opt>
  static void make(int zero, std::optional<ByStage<Opt>>& v, UNet& net,
                   telar::ProcessGrid const& grid, std::uint64_t seed, Opt opt,
                   telar::SlabDataParallelOptions o) {
    if (zero == 1)
      v.emplace(std::in_place_index<1>, net, grid, seed, opt, o);
    else if (zero == 2)
      v.emplace(std::in_place_index<2>, net, grid, seed, opt, o);
    else if (zero == 3)
      v.emplace(std::in_place_index<3>, net, grid, seed, opt, o);
    else
      v.emplace(std::in_place_index<0>, net, grid, seed, opt, o);
  }
  template <class F>
  void visit(F&& f) {
    if (adam_)
      std::visit(f, *adam_);
    else
      std::visit(f, *sgd_);
  }

  telar::LRSchedule lr_;
  example::CommonArgs config_; // the flags checkpoints record (--batch: global)
  std::string extra_;
  std::optional<ByStage<telar::Adam<T>>> adam_;
  std::optional<ByStage<telar::SGD<T>>> sgd_;
};

// The loss of one batch (the same on every rank of the sp group) and the
// gradient of its logits: voxel cross entropy, plus --dice W soft Dice.
double loss_and_gradient(Args const& a, telar::Communicator const& sp, std::size_t classes,
                         telar::Matrix<T, M> const& logits, telar::VoxelLabels<M> const& labels,
                         telar::Matrix<T, M>& dlogits, telar::Matrix<T, M>& ddice) {
  if (dlogits.extent(0) != logits.extent(0) || dlogits.extent(1) != logits.extent(1)) {
    dlogits = telar::Matrix<T, M>("unet3d::dlogits", logits.extent(0), logits.extent(1));
    ddice = telar::Matrix<T, M>("unet3d::ddice", logits.extent(0), logits.extent(1));
  }
  double loss = telar::spatial_voxel_cross_entropy(Exec{}, telar::VoxelCrossEntropy<T, M>(classes),
                                                   sp, logits, labels, dlogits);
  if (a.dice > 0) {
    loss += a.dice * telar::spatial_soft_dice(Exec{}, telar::SoftDice<T, M>(classes), sp, logits,
                                              labels, ddice);
    T const w = T(a.dice);
    auto g = dlogits;
    auto d = ddice;
    Kokkos::parallel_for(
        "unet3d::dice_gradient", Kokkos::RangePolicy<Exec>(0, g.span()),
        KOKKOS_LAMBDA(std::size_t i) { g.data()[i] += w * d.data()[i]; });
  }
  return loss;
}

// Dice of the lesion classes over validation voxels: per class c >= 1,
// true positives, predicted and true voxels of the argmax, summed.
void count_dice(telar::Matrix<T, M> const& logits, telar::VolumeBatch const& b, std::size_t classes,
                std::vector<double>& counts) {
  auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, logits);
  std::size_t const n = b.samples(), V = b.labels.size() / n;
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t v = 0; v < V; ++v) {
      std::size_t best = 0;
      for (std::size_t c = 1; c < classes; ++c)
        if (h(s, c * V + v) > h(s, best * V + v))
          best = c;
      std::size_t const truth = std::size_t(b.labels[s * V + v]);
      counts[3 * best + 0] += best == truth;
      counts[3 * best + 1] += 1;
      counts[3 * truth + 2] += 1;
    }
}

// Validation: volumes [first, samples) dealt round-robin over dp, read
// slab by slab (collective over the world: every rank reads the same
// number of times), evaluated with BatchNorm's running statistics, or with
// each validation batch's own (--eval-bn batch, as in training).
template <class UNet>
double validate(Args const& a, UNet& net, telar::VolumeReader& reader, long long first,
                std::size_t classes, telar::Communicator const& world, int dp_rank) {
  std::vector<std::size_t> mine;
  for (long long v = first; v < reader.shape().samples; ++v)
    if ((v - first) % a.dp == dp_rank)
      mine.push_back(std::size_t(v));
  long long const per_rank = (reader.shape().samples - first + a.dp - 1) / a.dp;
  long long const rounds = (per_rank + (long long)a.batch - 1) / (long long)a.batch;
  std::vector<double> counts(3 * classes, 0.0);
  telar::VolumeBatch b;
  telar::Matrix<T, M> x;
  telar::VoxelLabels<M> labels;
  net.set_training(a.eval_bn == "batch");
  for (long long r = 0; r < rounds; ++r) {
    std::size_t const lo = std::min(mine.size(), std::size_t(r) * a.batch);
    std::size_t const hi = std::min(mine.size(), lo + a.batch);
    reader.read(std::vector<std::size_t>(mine.begin() + long(lo), mine.begin() + long(hi)), b);
    if (b.samples() == 0) // the whole sp group has none: it shares the samples
      continue;
    to_device(b, x, labels);
    count_dice(net.forward(Exec{}, x), b, classes, counts);
  }
  net.set_training(true);
  world.allreduce(counts.data(), counts.size());
  double dice = 0;
  for (std::size_t c = 1; c < classes; ++c)
    dice += 2 * counts[3 * c] / std::max(1.0, counts[3 * c + 1] + counts[3 * c + 2]);
  return dice / double(classes - 1);
}

// The parameters, flattened (every rank holds the same).
template <class UNet>
std::vector<double> flat_parameters(UNet& net) {
  std::vector<double> all;
  net.parameters([&](char const*, auto& v, auto&) {
    auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, v);
    all.insert(all.end(), h.data(), h.data() + h.span());
  });
  return all;
}

// --compare-params: the largest |difference| from a file --save-params wrote.
double compare_parameters(std::string const& path, std::vector<double> const& p) {
  std::ifstream in(path);
  std::vector<double> q;
  for (double v; in >> v;)
    q.push_back(v);
  if (q.size() != p.size())
    throw std::runtime_error("unet3d: " + path + " holds " + std::to_string(q.size()) +
                             " parameters, the network has " + std::to_string(p.size()));
  double worst = 0;
  for (std::size_t i = 0; i < p.size(); ++i)
    worst = std::max(worst, std::abs(p[i] - q[i]));
  return worst;
}

void save_parameters(std::string const& path, std::vector<double> const& p) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f)
    throw std::runtime_error("unet3d: cannot write " + path);
  for (double v : p)
    std::fprintf(f, "%.9g\n", v);
  std::fclose(f);
}

// --timeline PREFIX: every rank's spans in PREFIX.json, one process row per
// rank (collective): each node's forward and backward (F<i>, B<i>), the
// halo waits inside them and the gradient sums over sp (lane 0), each
// exchange from its post to the end of its wait (lane 1), the steps (lane 2).
void write_timeline(Args const& a, telar::TraceRecorder const& trace,
                    telar::Communicator const& world) {
  if (a.timeline.empty())
    return;
  std::string const path = a.timeline + ".json";
  bool const ok = telar::gather_chrome_trace(&world, trace, path);
  if (world.rank() == 0)
    std::fprintf(stderr,
                 ok ? "unet3d: timeline written to %s (open in ui.perfetto.dev)\n"
                    : "unet3d: could not write the timeline %s\n",
                 path.c_str());
}

struct Summary {
  double loss = 0, val_dice = 0, train_s = 0;
  long long steps = 0, skipped = 0;       // skipped: --nonfinite skip, a resumed run's included
  std::vector<double> step_s, step_cpu_s; // wall and this process's CPU time
  telar::HaloTally halo;                  // training steps' exchanges only (not validation's)
  telar::GroupSumTally sums;              // training steps' weight-gradient sums over sp
};

// What one step's exchanges and group sums added to the tallies.
void add_tallies(Summary& sum, telar::HaloTally const& before, telar::GroupSumTally const& sums) {
  telar::HaloTally const& now = telar::halo_tally();
  sum.halo.exchanges += now.exchanges - before.exchanges;
  sum.halo.bytes_sent += now.bytes_sent - before.bytes_sent;
  sum.halo.window_s += now.window_s - before.window_s;
  sum.halo.exposed_s += now.exposed_s - before.exposed_s;
  sum.sums.sums += telar::group_sum_tally().sums - sums.sums;
  sum.sums.values += telar::group_sum_tally().values - sums.values;
  sum.sums.seconds += telar::group_sum_tally().seconds - sums.seconds;
}

// One epoch of training from its batch `first` (a resumed run's position);
// false once --limit-steps (counting a resumed run's earlier steps) is
// reached. --checkpoint-every saves on the way, not after the run's last
// step (train() saves that one).
template <class UNet>
bool train_epoch(Args const& a, UNet& net, telar::VolumeReader& reader, telar::BatchLoader& loader,
                 Update<UNet>& update, std::size_t classes, telar::Communicator const& sp,
                 telar::Communicator const& dp, int epoch, std::size_t first, Summary& sum,
                 telar::TraceRecorder& trace) {
  telar::ProgressBar bar("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(a.epochs),
                         (long long)loader.size(), sp.rank() == 0 && dp.rank() == 0);
  telar::VolumeBatch b;
  telar::Matrix<T, M> x, dlogits, ddice;
  telar::VoxelLabels<M> labels;
  if (first < loader.size())
    reader.prefetch(loader.batch(first).indices);
  for (std::size_t s = first; s < loader.size(); ++s) {
    auto const t0 = std::chrono::steady_clock::now();
    double const step_began = trace.now();
    std::clock_t const c0 = std::clock();
    reader.wait(b);
    telar::HaloTally const before = telar::halo_tally();
    telar::GroupSumTally const sums_before = telar::group_sum_tally();
    bool const limit = update.steps() + 1 == a.limit_steps, last = s + 1 == loader.size() || limit;
    if (!last)
      reader.prefetch(loader.batch(s + 1).indices); // read while this step trains
    to_device(b, x, labels);
    auto const& logits = update.forward(x);
    double const loss_began = trace.now();
    double loss = loss_and_gradient(a, sp, classes, logits, labels, dlogits, ddice);
    trace.add("loss", "loss", loss_began, trace.now());
    update.backward(dlogits);
    add_tallies(sum, before, sums_before);
    double const update_began = trace.now();
    bool const skipped = update.step(); // the same verdict on every rank
    trace.add("optimizer", "optimizer", update_began, trace.now());
    dp.allreduce(&loss, 1);
    if (!skipped) // a skipped step's loss is not finite: the last finite one stays
      sum.loss = loss / dp.size();
    sum.step_s.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    sum.step_cpu_s.push_back(double(std::clock() - c0) / CLOCKS_PER_SEC);
    trace.add("step " + std::to_string(sum.steps + 1), "step", step_began, trace.now(), 2);
    ++sum.steps;
    char text[64];
    std::snprintf(text, sizeof text, "loss %.4f", sum.loss);
    bar.update((long long)s + 1, text, double(a.batch * std::size_t(dp.size())));
    bool const run_ends = limit || (s + 1 == loader.size() && epoch + 1 == a.epochs);
    if (a.checkpoint_every > 0 && update.steps() % a.checkpoint_every == 0 && !run_ends)
      update.save(epoch, (long long)s + 1);
    if (limit)
      return false;
  }
  return true;
}

// The run's epochs, from where --resume left it, each validated; then the
// last checkpoint (--checkpoint-dir).
template <class UNet>
struct Epochs {
  Args const& a;
  UNet& net;
  telar::VolumeReader& reader;
  telar::BatchLoader& loader;
  Update<UNet>& update;
  telar::Communicator const &world, &sp, &dp;
  telar::TraceRecorder& trace;

  void all(long long first_val, std::size_t classes, Summary& s) {
    telar::RunPosition const pos = update.resume();
    int e = int(pos.epoch);
    bool more = a.limit_steps <= 0 || update.steps() < a.limit_steps;
    for (; e < a.epochs && more; ++e) {
      loader.set_epoch(std::uint64_t(e));
      std::size_t const first = e == pos.epoch ? std::size_t(pos.batch) : 0;
      more = train_epoch(a, net, reader, loader, update, classes, sp, dp, e, first, s, trace);
      update.gather(); // --zero 3: the whole values for validation and the report
      s.val_dice = validate(a, net, reader, first_val, classes, world, dp.rank());
      if (world.rank() == 0)
        std::fprintf(stderr, "unet3d: epoch %d: loss %.4f, val_dice %.4f\n", e + 1, s.loss,
                     s.val_dice);
    }
    if (s.steps == 0)
      return;
    if (more) // every epoch done: a resumed run starts after them
      update.save(e, 0);
    else // stopped in epoch e - 1 (the earlier ones ran whole)
      update.save(e - 1, update.steps() - (long long)loader.size() * (e - 1));
  }
};

} // namespace

namespace {

// --generate: the synthetic set, written by every rank (docs/volumes.md).
void generate(Args const& a, telar::Communicator const& world) {
  telar::SyntheticVolumeOptions o;
  o.samples = a.generate;
  o.depth = o.height = o.width = (long long)a.size;
  o.max_lesions = a.lesions;
  o.seed = a.seed;
  telar::write_synthetic_volumes(a.data, o, world);
}

// Peak bytes of this rank: per category, and of the total; the part that
// training added, and what the plan says it would; the parameters'
// values, gradients and optimizer state held before training (--zero
// shards them), and their plan.
struct Memory {
  telar::MemoryBytes bytes;
  std::size_t total = 0, training = 0, plan = 0, state = 0, state_plan = 0;
};

// What the meter counts as the parameters' state: values, gradients, the
// optimizer's (telar::SlabDataParallel allocates them so).
std::size_t state_bytes(telar::MemoryBytes const& held) {
  using C = telar::MemoryCategory;
  return held[C::parameters] + held[C::gradients] + held[C::optimizer_state];
}

// The depth planes rank `rank` of `sp` reads of each volume: its own and
// the halo planes the graph's first node reads (SlabGraph::input_halo).
template <class UNet>
telar::SlabRange input_planes(telar::VolumeShape const& v, int sp, int rank, UNet const& net) {
  telar::SlabRange r = telar::split_extent(v.depth, sp, rank, 0);
  auto const h = net.input_halo();
  r.halo_lo = (long long)h[0], r.halo_hi = (long long)h[1];
  return r;
}

// The plan of a training step's bytes on this rank: the graph's, plus the
// input slab (read with its halo planes), its labels and the loss
// gradients (cross entropy and Dice).
template <class UNet>
std::size_t planned_bytes(Args const& a, UNet const& net, telar::VolumeShape const& v) {
  std::size_t const in = net.input_size_with_halo(), out = net.slab_shape(net.size() - 1).size();
  std::size_t const voxels = out / std::size_t(v.classes);
  return net.activation_bytes(a.batch) +
         a.batch * (sizeof(T) * in + sizeof(int) * voxels + 2 * sizeof(T) * out);
}

// The U-Net of the flags over `sp` (not built).
template <class G, class C>
UNetOf<G, C> make_unet(Args const& a, telar::VolumeShape const& v, telar::Communicator const& sp) {
  telar::UNetOptions o;
  o.in_channels = std::size_t(v.channels), o.classes = std::size_t(v.classes);
  o.depth = a.depth, o.width = a.width, o.groups = a.groups, o.overlap = a.overlap;
  o.norm = a.norm == "group" ? telar::UNetOptions::Norm::group : telar::UNetOptions::Norm::batch;
  return telar::spatial_unet<T, M, G, C>(sp, o);
}

telar::Shape volume_shape(telar::VolumeShape const& v) {
  return {std::size_t(v.channels), std::size_t(v.depth), std::size_t(v.height),
          std::size_t(v.width)};
}

// Parameters, their gradients and the optimizer's state (Adam's two
// moments, SGD's momentum) on one of the `ranks` the update shards over
// (dp x sp: telar::SlabDataParallel sums over the world): --zero 1 keeps
// 1/ranks of the state, --zero 2 also of the gradients, --zero 3 also of
// the values (its groups in flight: transient_bytes).
template <class UNet>
std::size_t parameter_bytes(Args const& a, UNet& net, int ranks) {
  // The store's own layout (nothing allocated): each tensor from an
  // aligned start, a sharded store a multiple of `ranks` alignments long.
  using Store = telar::ParameterStore<T, M>;
  std::size_t const d = a.zero > 0 ? std::size_t(ranks) : 1;
  Store store;
  store.layout(net, std::vector<bool>(net.layer_count(), true), d * Store::alignment);
  std::size_t const n = store.size(), shard = n / d;
  std::size_t const grads = a.zero >= 2 ? shard : n, values = a.zero == 3 ? shard : n;
  return sizeof(T) * (values + grads + shard * (a.optimizer == "adam" ? 2 : 1));
}

// ZeRO's buffers in flight during a step, beyond the state (an upper
// bound): --zero 2 and 3 the gradient groups being accumulated and
// reduced, --zero 3 also the groups gathered (in use, prefetched), each at
// most a bucket (SlabDataParallelOptions::bucket_bytes), and the whole
// values gather() brings back for validation.
template <class UNet>
std::size_t transient_bytes(Args const& a, UNet& net, int ranks) {
  if (a.zero < 2 || (a.zero == 2 && ranks < 2))
    return 0;
  std::size_t n = 0;
  net.parameters([&](char const*, auto& v, auto&) { n += v.span(); });
  std::size_t const groups =
      std::min(sizeof(T) * n, 2 * telar::SlabDataParallelOptions{}.bucket_bytes);
  return a.zero == 2 ? groups : 2 * groups + sizeof(T) * n;
}

// What the plan holds for the parameters over `ranks`: their state and
// ZeRO's buffers in flight.
template <class UNet>
std::size_t parameter_plan(Args const& a, UNet& net, int ranks) {
  return parameter_bytes(a, net, ranks) + transient_bytes(a, net, ranks);
}

// The most any rank of an sp group of `size` plans to hold (activation
// bytes in `activations`), from graphs built as each of its ranks; 0 when
// the layers refuse that split.
template <class G, class C>
std::size_t plan_at_sp(Args const& a, telar::VolumeShape const& v, telar::Communicator const& sp,
                       int size, std::size_t params, std::size_t* activations) {
  std::size_t most = 0;
  for (int r = 0; r < size; ++r) {
    telar::SpatialPlanAs as(size, r);
    auto g = make_unet<G, C>(a, v, sp);
    try {
      g.build(volume_shape(v));
    } catch (telar::ShapeError const&) {
      return 0;
    }
    std::size_t const bytes = planned_bytes(a, g, v) + params;
    if (bytes > most)
      most = bytes, *activations = g.activation_bytes(a.batch);
  }
  return most;
}

// The lowest ZeRO stage above --zero whose plan fits the budget at this
// layout (`other`: the plan's bytes besides the parameters' state and
// ZeRO's buffers in flight), as advice for a refusal; "" when none does (or
// one rank: nothing to shard).
template <class UNet>
std::string zero_that_fits(Args const& a, UNet& net, std::size_t other) {
  int const ranks = a.dp * a.sp;
  for (int z = a.zero + 1; ranks > 1 && z <= 3; ++z) {
    Args b = a;
    b.zero = z;
    std::size_t const bytes = other + parameter_plan(b, net, ranks);
    if (bytes <= a.memory_budget)
      return "the parameters' state sharded over dp x sp: --zero " + std::to_string(z) + " needs " +
             telar::MemoryBytes::human(bytes) + " per rank, the lowest stage that fits; ";
  }
  return "";
}

// --memory-budget: refuses (the same text on every rank: it depends only on
// the plans) a run some rank of which plans more than the budget, naming
// the activations, the lowest ZeRO stage and the smallest sp whose plans
// fit.
template <class G, class C>
void check_budget(Args const& a, telar::VolumeShape const& v, UNetOf<G, C>& net,
                  telar::Communicator const& sp, telar::Communicator const& world) {
  if (a.memory_budget == 0)
    return;
  std::size_t const params = parameter_plan(a, net, world.size());
  unsigned long long need = planned_bytes(a, net, v) + params;
  unsigned long long acts = net.activation_bytes(a.batch);
  world.allreduce(&need, 1, telar::ReduceOp::max);
  world.allreduce(&acts, 1, telar::ReduceOp::max);
  if (need <= a.memory_budget)
    return;
  using telar::MemoryBytes;
  std::string msg = "a rank needs " + MemoryBytes::human(need) + " to train (activations " +
                    MemoryBytes::human(acts) +
                    " of it: node outputs, their gradients, halo-extended inputs, workspaces), "
                    "over the --memory-budget of " +
                    MemoryBytes::human(a.memory_budget) + " at sp=" + std::to_string(a.sp) +
                    " (batch " + std::to_string(a.batch) + " per rank); " +
                    zero_that_fits(a, net, std::size_t(need) - params);
  std::size_t most = 0, act = 0;
  int k = a.sp + 1;
  for (; k <= std::min<int>(64, int(v.depth)); ++k) {
    most = plan_at_sp<G, C>(a, v, sp, k, params, &act);
    if (most == 0 || most <= a.memory_budget)
      break;
  }
  if (most > 0 && most <= a.memory_budget)
    msg += "the activations split with the volume: --sp " + std::to_string(k) + " (" +
           std::to_string(k * a.dp) + " ranks) needs " + MemoryBytes::human(most) +
           " per rank (activations " + MemoryBytes::human(act) + "), the smallest sp that fits";
  else
    msg += "no sp up to " + std::to_string(k - 1) + " fits (a smaller --batch or --width may)";
  throw telar::Error(msg);
}

// The convolution policy the U-Net runs under --precision, and the kernels
// that ran (bf16: oneDNN's implementations as it reported them).
char const* conv_name(Args const& a) {
  return a.precision == "bf16" ? telar::OneDnnConvBf16::name() : telar::conv_backend_name<T, M>();
}
std::string conv_kernels(Args const& a) {
  return a.precision == "bf16" ? telar::bf16_kernels() : std::string(conv_name(a));
}

template <class UNet>
void report(Args const& a, UNet& net, telar::VolumeShape const& v, Summary const& s,
            double param_diff, Memory const& memory, telar::Communicator const& world) {
  unsigned long long most = memory.total;
  world.allreduce(&most, 1, telar::ReduceOp::max);
  double const step_ms = 1e3 * example::median(s.step_s);
  if (world.rank() != 0)
    return;
  std::fprintf(stderr,
               "unet3d: val_dice %.4f, loss %.4f, %lld steps in %.1f s (median step %.1f ms)\n",
               s.val_dice, s.loss, s.steps, s.train_s, step_ms);
  if (a.predicted_ms > 0)
    std::fprintf(stderr, "step time: predicted %.1f ms, measured %.1f ms\n", a.predicted_ms,
                 step_ms);
  if (!a.json)
    return;
  std::size_t parameters = 0;
  net.parameters([&](char const*, auto& w, auto&) { parameters += w.span(); });
  telar::JsonObject j;
  j.add("final_loss", s.loss)
      .add("skipped_steps", s.skipped)
      .add("program", "unet3d")
      .add("sp", a.sp)
      .add("dp", a.dp)
      .add("zero", a.zero)
      .add("size", (long long)v.depth)
      .add("depth", a.depth)
      .add("width", (long long)a.width)
      .add("norm", a.norm)
      .add("samples", (long long)v.samples)
      .add("steps", s.steps)
      .add("val_dice", s.val_dice)
      .add("step_ms", step_ms)
      .add("step_cpu_ms", 1e3 * example::median(s.step_cpu_s))
      .add("train_s", s.train_s)
      .add("peak_bytes_per_rank", (long long)most)
      .raw("memory_rank0", memory.bytes.json())
      .add("training_bytes_rank0", (long long)memory.training)
      .add("training_bytes_plan_rank0", (long long)memory.plan)
      .add("state_bytes_rank0", (long long)memory.state)
      .add("state_bytes_plan_rank0", (long long)memory.state_plan)
      .add("overlap", a.overlap)
      .add("precision", example::precision_ran(a.precision))
      .add("conv", conv_name(a))
      .add("gemm_kernels", conv_kernels(a))
      .add("halo_bytes_per_step_rank0", double(s.halo.bytes_sent) / double(std::max(1LL, s.steps)))
      .add("halo_exposed_ms_per_step_rank0",
           1e3 * s.halo.exposed_s / double(std::max(1LL, s.steps)))
      .add("halo_window_ms_per_step_rank0", 1e3 * s.halo.window_s / double(std::max(1LL, s.steps)))
      .add("halo_exchanges_per_step", double(s.halo.exchanges) / double(std::max(1LL, s.steps)))
      .add("group_sums_per_step", double(s.sums.sums) / double(std::max(1LL, s.steps)))
      .add("group_sum_values_per_step", double(s.sums.values) / double(std::max(1LL, s.steps)))
      .add("group_sum_ms_per_step_rank0", 1e3 * s.sums.seconds / double(std::max(1LL, s.steps)))
      .add("predicted_step_ms", a.predicted_ms > 0 ? a.predicted_ms : std::nan(""))
      .add("layout_reason", a.layout_reason.empty() ? "given by flags" : a.layout_reason)
      .add("nodes", net.size())
      .add("parameter_values", (long long)parameters);
  if (param_diff >= 0)
    j.add("param_max_diff", param_diff);
  std::printf("%s\n", j.str().c_str());
  std::fflush(stdout);
}

// This replica's batches of the training volumes [0, first_val); refused
// when the file has fewer than one global batch.
telar::BatchLoader training_batches(Args const& a, long long first_val, long long val,
                                    int dp_rank) {
  telar::BatchLoader loader({std::size_t(first_val), a.dp, dp_rank, a.seed}, a.batch);
  if (loader.size() == 0)
    usage(("--batch " + std::to_string(a.batch) + " x dp " + std::to_string(a.dp) + " needs " +
           std::to_string(a.batch * std::size_t(a.dp)) + " training volumes, " + a.data + " has " +
           std::to_string(first_val) + " (and " + std::to_string(val) + " for validation)")
              .c_str());
  return loader;
}

// Builds the U-Net under the convolutions' policies G, C (--precision),
// trains it, validates it each epoch and reports.
template <class G, class C>
int train(Args const& a, telar::ProcessGrid const& grid, telar::VolumeShape const& v) {
  telar::Communicator const &world = grid.world(), &sp = grid.sp(), &dp = grid.dp();
  int const dp_rank = grid.coords().dp, sp_rank = grid.coords().sp;
  telar::MemoryMeterInstall meter;
  telar::MemoryMeter::Scope counted(telar::MemoryCategory::activations); // unlabelled: activations
  auto net = make_unet<G, C>(a, v, sp);
  net.build(volume_shape(v)); // refuses a split the layers cannot take, on every rank
  net.initialize(a.seed);
  check_budget<G, C>(a, v, net, sp, world);
  long long const val = validation_volumes(a, v), first_val = v.samples - val;
  telar::BatchLoader loader = training_batches(a, first_val, val, dp_rank);
  long long const steps = (long long)loader.size() * a.epochs;
  std::size_t const classes = std::size_t(v.classes);
  Summary s;
  telar::TraceRecorder trace(!a.timeline.empty());
  // A resumed run repeats the flags that fix its data order and schedule.
  std::string const extra = " --val " + std::to_string(val) + " --limit-steps " +
                            std::to_string(a.limit_steps) + " --norm " + a.norm;
  // Binds the parameters: their values, gradients and optimizer state are
  // held before training, as the layers' own were.
  Update<decltype(net)> update(
      a, a.limit_steps > 0 ? std::min<long long>(a.limit_steps, steps) : steps, net, grid,
      trace.enabled() ? &trace : nullptr, extra);
  // From here on what Telar allocates is training's: activations, their
  // gradients, halo buffers, workspaces (the peak less this baseline).
  telar::MemoryBytes const held = telar::MemoryMeter::instance().current();
  std::size_t const baseline = held.total();
  int const tracker = telar::MemoryMeter::instance().start_tracking();
  // Each rank reads its own depth planes and the first convolution's halo
  // planes with them (that layer exchanges nothing; every later one does).
  telar::VolumeReader reader(a.data, {input_planes(v, a.sp, sp_rank, net), {}}, world);
  if (world.rank() == 0)
    std::fprintf(stderr,
                 "unet3d: %lld volumes %lldx%lldx%lld (%lld for validation), U-Net depth %d "
                 "width %zu (%d nodes), dp %d x sp %d, rank 0 holds depth [%zu, %zu), %s\n",
                 v.samples, v.depth, v.height, v.width, val, a.depth, a.width, net.size(), a.dp,
                 a.sp, net.input_slab().begin, net.input_slab().end, a.optimizer.c_str());
  world.barrier(); // one origin for every rank's spans
  trace.reset_origin();
  net.set_trace(trace.enabled() ? &trace : nullptr);
  auto const t0 = std::chrono::steady_clock::now();
  Epochs<decltype(net)> epochs{a, net, reader, loader, update, world, sp, dp, trace};
  epochs.all(first_val, classes, s);
  s.skipped = update.skipped();
  example::check_divergence(s.skipped, update.steps(), s.loss, "loss", world.rank() == 0);
  s.train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::size_t peak = 0;
  telar::MemoryBytes const memory = telar::MemoryMeter::instance().peaks(tracker, &peak);
  auto const params = flat_parameters(net);
  if (!a.save_params.empty() && world.rank() == 0)
    save_parameters(a.save_params, params);
  double const diff = a.compare_params.empty() ? -1 : compare_parameters(a.compare_params, params);
  write_timeline(a, trace, world);
  report(a, net, v, s, diff,
         {memory, peak, peak - baseline,
          planned_bytes(a, net, v) + transient_bytes(a, net, world.size()), state_bytes(held),
          parameter_bytes(a, net, world.size())}, // sharded over the world
         world);
  return 0;
}

// A GEMM or convolution policy as a value (C++17 lambdas take no template
// parameters).
template <class P>
struct Policy {
  using type = P;
};

// f(Policy<G>{}, Policy<C>{}) under --precision's GEMM and convolution
// policies: the defaults (fp32), or oneDNN's bf16 ones (G a template
// argument, so that a build without oneDNN, where parse() refused bf16,
// does not instantiate them).
template <class G = telar::Bf16Gemm, class F>
auto under_precision(Args const& a, F&& f) {
  if constexpr (G::template supports<T, M>())
    if (a.precision == "bf16")
      return f(Policy<G>{}, Policy<telar::OneDnnConvBf16>{});
  return f(Policy<telar::AutoGemm>{}, Policy<telar::AutoConv>{});
}

// Seconds of loss_and_gradient on `rows` samples of the output slab `out`
// on this process alone, the fastest of three: cached in `prof` with the
// layers' times (as the forward of group "unet3d loss <out>"), so a run
// plans with the times its --dry-run had. `timed` counts a new one.
double loss_seconds(Args const& a, std::size_t rows, telar::Shape const& out, std::size_t classes,
                    telar::MachineProfile& prof, std::size_t& timed) {
  std::string const group = telar::MachineProfile::layer_group(
      a.dice > 0 ? "unet3d loss+dice" : "unet3d loss", out.str(), "", 1);
  auto& times = prof.layer_times[group];
  if (times.count(rows) == 0) {
    telar::Communicator const self(MPI_COMM_SELF, "unet3d::loss timing");
    telar::Matrix<T, M> y("unet3d::timing::logits", rows, out.size()), dlogits, ddice;
    telar::VoxelLabels<M> labels("unet3d::timing::labels", rows, out.size() / classes);
    times[rows].forward = telar::detail::best_call_seconds(
        3, [&] { loss_and_gradient(a, self, classes, y, labels, dlogits, ddice); });
    ++timed;
  }
  return times[rows].forward;
}

// Every dp x sp of the world ranked for this U-Net and volume, the global
// batch --batch shared by the replicas. Each rank's graph has its layers
// timed at its slabs first, into `prof` (which its prediction then reads;
// `timed` counts them), and so is the loss on its output slab.
template <class G, class C>
std::vector<unet3d::Layout> plan_layouts(Args const& a, telar::VolumeShape const& v,
                                         telar::Communicator const& world,
                                         telar::MachineProfile& prof, std::size_t& timed) {
  unet3d::Search s;
  s.world = world.size();
  s.global_batch = a.batch;
  s.budget = a.memory_budget;
  if (a.zero_given)
    s.stages = {a.zero};
  auto cost = [&](int sp, int rank, std::size_t batch, int zero) {
    telar::SpatialPlanAs as(sp, rank);
    auto g = make_unet<G, C>(a, v, world);
    g.build(volume_shape(v));
    g.initialize(a.seed);
    timed += telar::calibrate_slab_layers(g, batch, prof);
    unet3d::RankCost c;
    c.step = telar::predict_slab_step(g, batch, s.world / sp, sp, prof, {zero},
                                      true); // the input read with its halo planes
    c.step.loss =
        loss_seconds(a, batch, g.slab_shape(g.size() - 1), std::size_t(v.classes), prof, timed);
    Args b = a;
    b.batch = batch;
    b.zero = zero;
    c.bytes = planned_bytes(b, g, v) + parameter_plan(b, g, s.world); // shards over the world
    return c;
  };
  return unet3d::rank_layouts(s, cost);
}

// Rank 0's ranking (--dry-run prints it) as "dp sp zero predicted_ms
// reason", or "!why" when no layout can run.
// The share of a core every rank saw is add_scheduling's, measured by all
// of them before (it measures once per process: no message here).
std::string ranked_choice(MPI_Comm comm, Args const& a, telar::VolumeShape const& v,
                          telar::Communicator const& world) {
  telar::MachineProfile prof = example::detail::loaded_profile(a);
  example::detail::add_scheduling(comm, prof);
  auto const began = std::chrono::steady_clock::now();
  std::size_t timed = 0;
  auto const all = under_precision(a, [&](auto g, auto c) {
    return plan_layouts<typename decltype(g)::type, typename decltype(c)::type>(a, v, world, prof,
                                                                                timed);
  });
  example::detail::keep_calibration(
      a, prof, timed,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
  if (a.dry_run) {
    std::fprintf(stderr, "unet3d: layouts of %d ranks, global batch %zu, profile %s\n%s",
                 world.size(), a.batch, prof.name.c_str(), unet3d::table(all).c_str());
    if (a.json)
      std::printf("%s\n", unet3d::json(all, prof.name).c_str());
    std::fflush(stdout);
  }
  unet3d::Layout const& best = all.front();
  if (!best.fits)
    return "!unet3d: no layout of " + std::to_string(world.size()) + " ranks can run:\n" +
           unet3d::table(all);
  return std::to_string(best.dp) + " " + std::to_string(best.sp) + " " + std::to_string(best.zero) +
         " " + std::to_string(best.predicted_ms) + " " + best.reason;
}

// --layout auto / --dry-run: rank 0 ranks the layouts (the others wait
// asleep) and every rank takes its choice into `a` (dp, sp, the ZeRO stage
// unless --zero gave one, batch per replica); false after --dry-run.
bool choose_layout(MPI_Comm comm, Args& a, telar::VolumeShape const& v,
                   telar::Communicator const& world) {
  if (a.layout_auto && (a.sp > 0 || a.dp > 0))
    usage("--layout auto chooses --sp and --dp (give neither)");
  telar::MachineProfile scheduling; // every rank spins while the share is measured
  example::detail::add_scheduling(comm, scheduling);
  std::string text;
  if (world.rank() == 0)
    try {
      text = ranked_choice(comm, a, v, world);
    } catch (std::exception const& e) {
      text = std::string("!") + e.what();
    }
  text = example::detail::broadcast_or_throw(comm, text);
  if (a.dry_run)
    return false;
  std::istringstream in(text);
  int zero = 0;
  in >> a.dp >> a.sp >> zero >> a.predicted_ms;
  std::getline(in >> std::ws, a.layout_reason);
  a.batch /= std::size_t(a.dp);
  if (!a.zero_given)
    a.zero = zero;
  if (world.rank() == 0)
    std::fprintf(stderr,
                 "layout auto: chose dp=%d x sp=%d, ZeRO stage %d (batch %zu per replica), "
                 "predicted %.1f ms/step (%s)\n",
                 a.dp, a.sp, a.zero, a.batch, a.predicted_ms, a.layout_reason.c_str());
  return true;
}

int run(MPI_Comm comm, int argc, char** argv) {
  Args a = parse(argc, argv);
  telar::Communicator world(comm, "world");
  bool const plan = a.layout_auto || a.dry_run;
  if (!plan)
    degrees(a, world.size()); // refused before volumes are written
  // --timeline and --checkpoint-dir refused before anything runs (rank 0's
  // verdict on every rank); the directory locked for the run.
  example::DirLock const lock = example::check_output_files(&world, a);
  if (a.generate > 0)
    generate(a, world);
  telar::VolumeShape const v = telar::read_volume_shape(a.data, world);
  check_volume(a, v);
  if (plan && !choose_layout(comm, a, v, world))
    return 0; // --dry-run
  degrees(a, world.size());
  telar::GridShape shape;
  shape.dp = a.dp, shape.sp = a.sp;
  telar::ProcessGrid const grid(world, shape); // its sp group holds one sample's slabs
  return under_precision(a, [&](auto g, auto c) {
    return train<typename decltype(g)::type, typename decltype(c)::type>(a, grid, v);
  });
}

} // namespace

int main(int argc, char** argv) {
  return example::run_main(argc, argv, "unet3d", run);
}
