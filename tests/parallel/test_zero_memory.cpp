// What ZeRO-2 and ZeRO-3 ranks hold: no full gradient buffer (ZeRO-2/3), no
// full parameter buffer (ZeRO-3), read off the Kokkos allocations by label;
// and the bytes each sends per step, from the communicators' counters.
#include "support.hpp"

#include <telar/core/detail/bf16_copy.hpp>
#include <telar/data/synthetic.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/adam.hpp>
#include <telar/parallel/precision.hpp>
#include <telar/train/trainer.hpp>

#include <catch2/catch_test_macros.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace {

using Model = telar::Sequential<telar::Dense<float>, telar::ReLU<float>, telar::Dense<float>,
                                telar::ReLU<float>, telar::Dense<float>>;
Model make_model() {
  return Model(telar::Dense<float>(32, 64), {}, telar::Dense<float>(64, 64), {},
               telar::Dense<float>(64, 8));
}
constexpr std::size_t model_values = 32 * 64 + 64 + 64 * 64 + 64 + 64 * 8 + 8;

// Live and peak bytes per Kokkos allocation label (Kokkos Tools callbacks).
struct Meter {
  std::map<std::string, std::int64_t> live, peak;
  std::map<void const*, std::pair<std::string, std::int64_t>> where;
  void reset_peaks() { peak = live; }
  std::int64_t peak_of(std::string const& label) const {
    auto it = peak.find(label);
    return it == peak.end() ? 0 : it->second;
  }
};
Meter meter;

void on_alloc(Kokkos::Profiling::SpaceHandle, char const* label, void const* ptr,
              std::uint64_t size) {
  std::string const l(label);
  meter.where[ptr] = {l, std::int64_t(size)};
  auto& v = meter.live[l];
  v += std::int64_t(size);
  meter.peak[l] = std::max(meter.peak[l], v);
}
void on_free(Kokkos::Profiling::SpaceHandle, char const*, void const* ptr, std::uint64_t) {
  auto it = meter.where.find(ptr);
  if (it == meter.where.end())
    return;
  meter.live[it->second.first] -= it->second.second;
  meter.where.erase(it);
}

struct Watch {
  Watch() {
    meter = Meter{};
    Kokkos::Tools::Experimental::set_allocate_data_callback(on_alloc);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(on_free);
  }
  ~Watch() {
    Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(nullptr);
  }
};

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

struct Batch {
  telar::Matrix<float> x;
  telar::Labels<> y;
};
Batch make_batch(std::size_t n) {
  auto ds = telar::make_synthetic(n, 32, 8, 7);
  Batch b{telar::Matrix<float>("x", n, 32), telar::Labels<>("y", n)};
  auto hx = Kokkos::create_mirror_view(b.x);
  auto hy = Kokkos::create_mirror_view(b.y);
  for (std::size_t i = 0; i < n; ++i) {
    hy(i) = ds.y[i];
    for (std::size_t j = 0; j < 32; ++j)
      hx(i, j) = ds.x[i * 32 + j];
  }
  Kokkos::deep_copy(b.x, hx);
  Kokkos::deep_copy(b.y, hy);
  return b;
}

template <class Sharding>
using Dp = telar::Strategy<telar::DataParallel<telar::RingAllreduce, Sharding>>;

// Bytes the data-parallel group's communicator counted for one step (the
// second: the first may differ by one-off exchanges).
template <class Sharding>
std::uint64_t bytes_per_step(Batch const& batch, int microbatches) {
  telar::TrainerOptions opts;
  opts.bucket_bytes = 4096;
  opts.microbatches = microbatches;
  opts.shared_memory = false;
  telar::Trainer<Model, Dp<Sharding>, telar::Adam<float>> t(MPI_COMM_WORLD, make_model(), {}, opts,
                                                            32);
  std::size_t const local = batch.x.extent(0) / std::size_t(world_size());
  std::size_t const b = std::size_t(t.grid_coords().dp) * local;
  auto x = telar::rows(batch.x, b, b + local);
  auto y = telar::rows(batch.y, b, b + local);
  t.step(x, y);
  t.grid()->dp().reset_bytes_sent();
  t.step(x, y);
  return t.grid()->dp().bytes_sent();
}

// Bytes handed to MPI_Iallgatherv (ZeRO-3's gathers) and to MPI's
// reduce-scatters (ZeRO's gradients) through MPI's profiling interface: what
// MPI was given, not Telar's own counter.
std::uint64_t iallgatherv_bytes = 0;
std::uint64_t reduce_scatter_bytes = 0;

// The second step of strategy S (the first may differ by one-off work),
// with the MPI byte counters and the meter's peaks reset before it: what
// `read(trainer)` then finds. One group per Dense layer, traced.
template <class S, class Read, class Net = Model>
auto second_step(Batch const& batch, bool shared_memory, Read read, Net (*make)() = make_model) {
  telar::TrainerOptions opts;
  opts.bucket_bytes = 1024;
  opts.shared_memory = shared_memory;
  opts.trace = true;
  Watch watch;
  telar::Trainer<Net, S, telar::Adam<float>> t(MPI_COMM_WORLD, make(), {}, opts, 32);
  std::size_t const local = 8, d = std::size_t(t.grid_coords().dp) * local;
  auto x = telar::rows(batch.x, d, d + local);
  auto y = telar::rows(batch.y, d, d + local);
  t.step(x, y);
  meter.reset_peaks();
  iallgatherv_bytes = reduce_scatter_bytes = 0;
  t.step(x, y);
  return read(t);
}

// The names of the trace's events that start with `prefix`.
template <class Trainer>
std::vector<std::string> events(Trainer const& t, std::string const& prefix) {
  std::vector<std::string> out;
  for (auto const& e : t.trace().events())
    if (e.name.rfind(prefix, 0) == 0)
      out.push_back(e.name);
  return out;
}

// What a ZeRO step's gradient reduce-scatters were given, the peak of its
// group gradient buffers, the plan's communication and gradient bytes, and
// the reduce-scatters' trace labels. ZeRO-1 between ranks (in shared memory
// nothing travels).
struct ReduceRun {
  std::uint64_t sent = 0;
  std::int64_t peak = 0;
  std::size_t plan_comm = 0, plan_grads = 0;
  std::vector<std::string> labels;
};
template <class S>
ReduceRun reduce_run(Batch const& batch) {
  return second_step<S>(batch, false, [](auto const& t) {
    auto const& plan = t.memory_plan().bytes;
    return ReduceRun{reduce_scatter_bytes, meter.peak_of("telar::ZeRO::group_grads"),
                     plan[telar::MemoryCategory::communication],
                     plan[telar::MemoryCategory::gradients], events(t, "reduce-scatter group")};
  });
}

// What a ZeRO-3 step gathered and held.
struct GatherRun {
  std::uint64_t gathered = 0;      // bytes sent to MPI_Iallgatherv
  std::int64_t peak = 0;           // peak of the gathered group buffers
  std::size_t plan = 0;            // the plan's communication bytes
  std::vector<std::string> labels; // the gathers' trace events
  std::vector<float> parameters;   // after the second step
  std::uint64_t copy_reads = 0;    // weights the bf16 matmuls read as words, both steps
};
template <class S, class Net = Model>
GatherRun gather_run(Batch const& batch, Net (*make)() = make_model) {
  std::uint64_t const reads = telar::detail::bf16_copy().hits;
  GatherRun run = second_step<S>(
      batch, true,
      [](auto const& t) {
        return GatherRun{iallgatherv_bytes, meter.peak_of("telar::ZeRO::gathered"),
                         t.memory_plan().bytes[telar::MemoryCategory::communication],
                         events(t, "all-gather group"), t.parameters()};
      },
      make);
  run.copy_reads = telar::detail::bf16_copy().hits - reads;
  return run;
}

// Six layers of about the same size: six gather groups, none near half the
// model (where PerStep's bf16 words pay: residency_gathered.hpp).
using Deep = telar::Sequential<telar::Dense<float>, telar::ReLU<float>, telar::Dense<float>,
                               telar::ReLU<float>, telar::Dense<float>, telar::ReLU<float>,
                               telar::Dense<float>, telar::ReLU<float>, telar::Dense<float>,
                               telar::ReLU<float>, telar::Dense<float>>;
Deep make_deep() {
  using D = telar::Dense<float>;
  return Deep(D(32, 32), {}, D(32, 32), {}, D(32, 32), {}, D(32, 32), {}, D(32, 32), {}, D(32, 8));
}

// The KiB a gather's trace label gives ("all-gather group 3 (12 KiB)").
std::size_t label_kib(std::string const& label) {
  return std::size_t(std::stoul(label.substr(label.find('(') + 1)));
}

} // namespace

extern "C" int MPI_Iallgatherv(const void* send, int count, MPI_Datatype type, void* recv,
                               const int counts[], const int displs[], MPI_Datatype recv_type,
                               MPI_Comm comm, MPI_Request* request) {
  int size = 0;
  MPI_Type_size(type, &size);
  iallgatherv_bytes += std::uint64_t(count) * std::uint64_t(size);
  return PMPI_Iallgatherv(send, count, type, recv, counts, displs, recv_type, comm, request);
}

extern "C" int MPI_Ireduce_scatter(const void* send, void* recv, const int counts[],
                                   MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                                   MPI_Request* request) {
  int size = 0, ranks = 0;
  MPI_Type_size(type, &size);
  MPI_Comm_size(comm, &ranks);
  for (int r = 0; r < ranks; ++r)
    reduce_scatter_bytes += std::uint64_t(counts[r]) * std::uint64_t(size);
  return PMPI_Ireduce_scatter(send, recv, counts, type, op, comm, request);
}

extern "C" int MPI_Ireduce_scatter_block(const void* send, void* recv, int count, MPI_Datatype type,
                                         MPI_Op op, MPI_Comm comm, MPI_Request* request) {
  int size = 0, ranks = 0;
  MPI_Type_size(type, &size);
  MPI_Comm_size(comm, &ranks);
  reduce_scatter_bytes += std::uint64_t(count) * std::uint64_t(ranks) * std::uint64_t(size);
  return PMPI_Ireduce_scatter_block(send, recv, count, type, op, comm, request);
}

TEST_CASE("ZeRO-2 holds no full gradient buffer, ZeRO-3 no full parameter buffer",
          "[zero][memory]") {
  int const n = world_size();
  auto const batch = make_batch(std::size_t(8 * n));
  std::size_t const local = 8;
  telar::TrainerOptions opts;
  opts.bucket_bytes = 1024; // one group per Dense layer
  Watch watch;
  SECTION("ZeRO-2") {
    telar::Trainer<Model, Dp<telar::ZeRO<2>>, telar::Adam<float>> t(MPI_COMM_WORLD, make_model(),
                                                                    {}, opts, 32);
    std::size_t const d = std::size_t(t.grid_coords().dp) * local;
    meter.reset_peaks();
    t.step(telar::rows(batch.x, d, d + local), telar::rows(batch.y, d, d + local));
    if (n > 1) {
      CHECK(meter.peak_of("telar::ParameterStore::grads") == 0);
      CHECK(t.parameter_store().grads().size() == 0);
      std::int64_t const full = std::int64_t(t.parameter_store().size() * sizeof(float));
      // Group buffers come and go: fewer than all of them at once.
      CHECK(meter.peak_of("telar::ZeRO::group_grads") > 0);
      CHECK(meter.peak_of("telar::ZeRO::group_grads") < full);
      CHECK(meter.live["telar::ZeRO::group_grads"] == 0);
      CHECK(meter.peak_of("telar::ZeRO::shard_grads") == full / n);
      // The Trainer's own meter agrees: its gradients are the shard.
      CHECK(t.memory()[telar::MemoryCategory::gradients] == std::size_t(full / n));
    }
    CHECK(meter.peak_of("telar::ParameterStore::values") >=
          std::int64_t(model_values * sizeof(float)));
  }
  SECTION("ZeRO-3, per micro-batch") {
    telar::Trainer<Model, Dp<telar::ZeRO<3>>, telar::Adam<float>> t(MPI_COMM_WORLD, make_model(),
                                                                    {}, opts, 32);
    // Construction drew one layer at a time: never the whole model at once.
    CHECK(meter.peak_of("telar::Dense::weight") < std::int64_t(model_values * sizeof(float)));
    CHECK(meter.live["telar::Dense::weight"] == 0);
    std::size_t const d = std::size_t(t.grid_coords().dp) * local;
    meter.reset_peaks();
    t.step(telar::rows(batch.x, d, d + local), telar::rows(batch.y, d, d + local));
    std::int64_t const full = std::int64_t(t.parameter_store().size() * sizeof(float));
    CHECK(meter.peak_of("telar::ParameterStore::values") == 0);
    CHECK(meter.peak_of("telar::ParameterStore::grads") == 0);
    CHECK(t.parameter_store().values().size() == 0);
    CHECK(meter.live["telar::ZeRO::param_shard"] == full / n);
    CHECK(t.memory()[telar::MemoryCategory::parameters] == std::size_t(full / n));
    CHECK(meter.live["telar::ZeRO::gathered"] == 0);
    // Gathered per use: never every group at once.
    CHECK(meter.peak_of("telar::ZeRO::gathered") > 0);
    CHECK(meter.peak_of("telar::ZeRO::gathered") < full);
    // The Trainer's memory plan: exact for the shard, an upper bound of the
    // temporary buffers (gathered groups and group gradients).
    auto const& plan = t.memory_plan().bytes;
    CHECK(std::int64_t(plan[telar::MemoryCategory::parameters]) == full / n);
    CHECK(std::int64_t(plan[telar::MemoryCategory::gradients]) == full / n);
    CHECK(std::int64_t(plan[telar::MemoryCategory::communication]) >=
          meter.peak_of("telar::ZeRO::gathered"));
    CHECK(std::int64_t(plan[telar::MemoryCategory::communication]) < 2 * full);
  }
  SECTION("ZeRO-3, per step") {
    using Z = telar::ZeRO<3, telar::ZeRO3Gather::PerStep>;
    telar::Trainer<Model, Dp<Z>, telar::Adam<float>> t(MPI_COMM_WORLD, make_model(), {}, opts, 32);
    std::size_t const d = std::size_t(t.grid_coords().dp) * local;
    meter.reset_peaks();
    t.step(telar::rows(batch.x, d, d + local), telar::rows(batch.y, d, d + local));
    CHECK(meter.peak_of("telar::ParameterStore::values") == 0);
    CHECK(meter.live["telar::ZeRO::gathered"] == 0);
    CHECK(meter.peak_of("telar::ZeRO::gathered") >=
          std::int64_t(model_values * sizeof(float)) - 64 * std::int64_t(sizeof(float)));
  }
}

TEST_CASE("bytes sent per step: ZeRO-3 at most 1.5x data parallelism, counted", "[zero][traffic]") {
  int const n = world_size();
  if (n < 2)
    return; // one rank sends nothing
  auto const batch = make_batch(std::size_t(8 * n));
  auto const dp = bytes_per_step<telar::NoSharding>(batch, 1);
  auto const z2 = bytes_per_step<telar::ZeRO<2>>(batch, 1);
  auto const z3 = bytes_per_step<telar::ZeRO<3>>(batch, 1);
  auto const z3_step = bytes_per_step<telar::ZeRO<3, telar::ZeRO3Gather::PerStep>>(batch, 2);
  auto const z3_mb = bytes_per_step<telar::ZeRO<3, telar::ZeRO3Gather::PerMicrobatch>>(batch, 2);
  INFO("dp " << dp << " zero2 " << z2 << " zero3 " << z3 << " zero3 per step (2 mb) " << z3_step
             << " per micro-batch (2 mb) " << z3_mb);
  // Ψ = the parameters' bytes: a ring allreduce sends 2(N-1)/N Ψ.
  double const psi = double(model_values * sizeof(float));
  CHECK(double(dp) >= 2.0 * (n - 1) / n * psi);
  CHECK(double(z2) <= 1.05 * double(dp));
  CHECK(double(z3) <= 1.5 * double(dp));
  CHECK(double(z3) > double(z2));
  // Gathering once per step sends less than once per micro-batch.
  CHECK(z3_step < z3_mb);
}

// Under Precision<bf16, float> ZeRO-3 gathers the values as bf16 words:
// half the bytes handed to MPI, received into the same fp32 group buffers
// (nothing allocated beside them: the memory plan is the fp32 one).
namespace {
// A template on the memory space: where the words are not made (they are
// the host's: in CUDA memory ZeRO-3 gathers fp32) nothing of it is
// instantiated.
template <class M>
void bf16_zero3_case() {
  if constexpr (!telar::test::onednn_bf16_v<M>) {
    SKIP("bf16 gathers are the host's (oneDNN's bf16 layers): not in this memory space");
  } else {
    if (!telar::bf16_available())
      SKIP("no AVX512-BF16 or AMX here: bf16 is refused, not emulated");
    auto const batch = make_batch(std::size_t(8 * world_size()));
    GatherRun const fp32 = gather_run<Dp<telar::ZeRO<3>>>(batch);
    GatherRun const bf16 = gather_run<telar::test::on_space_t<
        telar::Strategy<telar::DataParallel<telar::RingAllreduce, telar::ZeRO<3>>,
                        telar::Precision<telar::bf16, float>>,
        M>>(batch);
    INFO("gathered bytes " << fp32.gathered << " (fp32) " << bf16.gathered << " (bf16); peak "
                           << fp32.peak << " / " << bf16.peak << "; plan " << fp32.plan << " / "
                           << bf16.plan);
    CHECK(fp32.gathered > 0);
    CHECK(2 * bf16.gathered == fp32.gathered);
    // The timeline's labels give the bytes sent, bf16 marked: half as many,
    // group by group (KiB rounded down).
    REQUIRE(fp32.labels.size() == bf16.labels.size());
    REQUIRE(!bf16.labels.empty());
    for (std::size_t i = 0; i < bf16.labels.size(); ++i) {
      INFO(fp32.labels[i] << " / " << bf16.labels[i]);
      CHECK(fp32.labels[i].find("bf16") == std::string::npos);
      CHECK(bf16.labels[i].find(" KiB bf16)") != std::string::npos);
      CHECK(label_kib(bf16.labels[i]) == label_kib(fp32.labels[i]) / 2);
    }
    CHECK(bf16.peak == fp32.peak);
    CHECK(bf16.plan == fp32.plan);
    CHECK(std::int64_t(bf16.plan) >= bf16.peak);

    // PerStep keeps every group gathered as bf16 words and widens only the
    // group in use, within the plan; the layers read the same rounded values
    // (parameters equal to the PerMicrobatch run's). With a group over half
    // the model (this model's middle layer) the words would hold more: fp32
    // as before.
    using PerStep = telar::ZeRO<3, telar::ZeRO3Gather::PerStep>;
    using Bf16PerStep =
        telar::test::on_space_t<telar::Strategy<telar::DataParallel<telar::RingAllreduce, PerStep>,
                                                telar::Precision<telar::bf16, float>>,
                                M>;
    using Bf16PerMb = telar::test::on_space_t<
        telar::Strategy<telar::DataParallel<telar::RingAllreduce, telar::ZeRO<3>>,
                        telar::Precision<telar::bf16, float>>,
        M>;
    GatherRun const fp32_step = gather_run<Dp<PerStep>>(batch, make_deep);
    GatherRun const bf16_step = gather_run<Bf16PerStep>(batch, make_deep);
    GatherRun const bf16_mb = gather_run<Bf16PerMb>(batch, make_deep);
    INFO("per step: peak " << fp32_step.peak << " / " << bf16_step.peak << "; plan "
                           << fp32_step.plan << " / " << bf16_step.plan);
    CHECK(2 * bf16_step.gathered == fp32_step.gathered);
    // Every group's words (half the fp32 peak) and the widest group in fp32.
    CHECK(bf16_step.peak == fp32_step.peak / 2 + std::int64_t(4 * (32 * 32 + 32)));
    CHECK(bf16_step.plan < fp32_step.plan);
    CHECK(std::int64_t(bf16_step.plan) >= bf16_step.peak);
    CHECK(bf16_step.parameters == bf16_mb.parameters);
    // The group's words are its weights' bf16 copy: every weight operand of
    // both steps (6 Dense, forward and input gradient but the first's) is
    // read from them, none converted again; PerMicrobatch has no words.
    CHECK(bf16_step.copy_reads == 2 * (6 + 5));
    CHECK(bf16_mb.copy_reads == 0);
    GatherRun const fp32_wide = gather_run<Dp<PerStep>>(batch);
    GatherRun const bf16_wide = gather_run<Bf16PerStep>(batch);
    CHECK(bf16_wide.peak == fp32_wide.peak);
    CHECK(bf16_wide.plan == fp32_wide.plan);
  }
}
} // namespace

TEST_CASE("ZeRO-3 under Precision<bf16, float> gathers half the bytes", "[zero][bf16]") {
  bf16_zero3_case<telar::DefaultMemorySpace>();
}

// Under Precision<..., bf16> ZeRO's gradient reduce-scatters send bf16 words,
// rounded in place in the fp32 buffers: half the bytes handed to MPI, the
// same buffers, the same plan. fp32 compute, so no bf16 kernels are needed.
namespace {
template <int Stage>
using Bf16Reduce = telar::Strategy<telar::DataParallel<telar::RingAllreduce, telar::ZeRO<Stage>>,
                                   telar::Precision<float, float, telar::bf16>>;

template <int Stage>
void bf16_reduce_case(Batch const& batch) {
  ReduceRun const fp32 = reduce_run<Dp<telar::ZeRO<Stage>>>(batch);
  ReduceRun const bf16 = reduce_run<Bf16Reduce<Stage>>(batch);
  INFO("ZeRO-" << Stage << ": reduce-scatter bytes " << fp32.sent << " (fp32) " << bf16.sent
               << " (bf16); group peak " << fp32.peak << " / " << bf16.peak);
  if (world_size() > 1)
    CHECK(fp32.sent > 0);
  CHECK(2 * bf16.sent == fp32.sent);
  // Group buffers live until their reduction is seen complete, which
  // depends on timing (smaller messages may finish sooner): both peaks stay
  // within the one plan.
  CHECK(bf16.plan_comm == fp32.plan_comm);
  CHECK(bf16.peak <= std::int64_t(bf16.plan_comm));
  CHECK(fp32.peak <= std::int64_t(fp32.plan_comm));
  if (Stage >= 2 && (world_size() > 1 || Stage == 3))
    CHECK(bf16.peak > 0);
  CHECK(bf16.plan_grads == fp32.plan_grads);
  // ZeRO-2/3 trace each group's reduce-scatter with the bytes that travelled.
  REQUIRE(bf16.labels.size() == fp32.labels.size());
  for (std::size_t i = 0; i < bf16.labels.size(); ++i) {
    INFO(fp32.labels[i] << " / " << bf16.labels[i]);
    CHECK(fp32.labels[i].find("bf16") == std::string::npos);
    CHECK(bf16.labels[i].find(" KiB bf16)") != std::string::npos);
    CHECK(label_kib(bf16.labels[i]) == label_kib(fp32.labels[i]) / 2);
  }
}
} // namespace

TEST_CASE("ZeRO's gradients reduce-scattered in bf16 send half the bytes", "[zero][bf16]") {
  auto const batch = make_batch(std::size_t(8 * world_size()));
  bf16_reduce_case<1>(batch);
  bf16_reduce_case<2>(batch);
  bf16_reduce_case<3>(batch);
}
