// Allreduce algorithms: exact sums of small integers for every rank count
// and many lengths (0, 1, shorter than the rank count, not divisible, many
// segments), random values against a serial sum, bitwise agreement across
// ranks, concurrent operations waited in different orders. Bf16Wire: half
// the bytes, within its bound of the exact sum, the same on every rank.
#include <telar/comm/allreduce.hpp>
#include <telar/comm/bf16_wire.hpp>
#include <telar/comm/topology.hpp>

#include "mpi_check.hpp"

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using telar::Communicator;

static_assert(telar::is_allreduce_algorithm_v<telar::MpiAllreduce>);
static_assert(telar::is_allreduce_algorithm_v<telar::RingAllreduce>);
static_assert(telar::is_allreduce_algorithm_v<telar::RecursiveHalvingDoubling>);
static_assert(telar::is_allreduce_algorithm_v<const telar::HierarchicalAllreduce>);
static_assert(telar::is_allreduce_algorithm_v<telar::TopologyAwareAllreduce>);
static_assert(telar::is_allreduce_algorithm_v<telar::Bf16Wire<telar::RingAllreduce>>);
static_assert(!telar::is_allreduce_algorithm_v<int>);
static_assert(!telar::is_allreduce_algorithm_v<Communicator>);

namespace {
std::vector<std::size_t> lengths(int p) {
  auto const up = static_cast<std::size_t>(p);
  return {0, 1, 2, 3, up > 1 ? up - 1 : 0, up, up + 1, 2 * up - 1, 7, 64, 1000, 4099, 65537};
}

// Configurations: defaults, plus tiny segments and one message in flight so
// every transfer is cut into many pieces.
template <class Algo>
std::vector<Algo> configs() {
  Algo a{}, b{};
  b.segment_bytes = 40;
  b.max_in_flight = 1;
  Algo c{};
  c.segment_bytes = 1024;
  c.max_in_flight = 3;
  return {a, b, c};
}
template <>
std::vector<telar::MpiAllreduce> configs<telar::MpiAllreduce>() {
  return {telar::MpiAllreduce{}};
}

template <class Algo, class T>
void check_exact(Communicator const& comm, Algo const& algo) {
  int const p = comm.size(), r = comm.rank();
  for (std::size_t n : lengths(p)) {
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i)
      v[i] = T((r + 1) * static_cast<int>(i % 7 + 1));
    algo.start(comm, v.data(), n).wait();
    bool ok = true;
    for (std::size_t i = 0; i < n; ++i)
      ok = ok && v[i] == T((i % 7 + 1) * p * (p + 1) / 2);
    INFO(Algo::name() << " n=" << n << " segment_bytes=" << sizeof(T));
    TELAR_REQUIRE_ALL(ok);
  }
}

template <class Algo>
Algo with_segment(std::size_t bytes) {
  Algo a{};
  if constexpr (std::is_base_of_v<telar::SegmentedSettings, Algo>)
    a.segment_bytes = bytes;
  return a;
}

// n values uniform in [-1, 1) drawn with `seed`.
std::vector<float> uniform_of(unsigned seed, std::size_t n) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v)
    x = dist(gen);
  return v;
}

std::uint64_t fnv(void const* p, std::size_t bytes) {
  auto const* b = static_cast<unsigned char const*>(p);
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < bytes; ++i)
    h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
} // namespace

TEMPLATE_TEST_CASE("allreduce sums exactly for any rank count and length", "[comm][allreduce]",
                   telar::MpiAllreduce, telar::RingAllreduce, telar::RecursiveHalvingDoubling,
                   telar::HierarchicalAllreduce) {
  Communicator comm(MPI_COMM_WORLD, "world");
  for (auto const& algo : configs<TestType>()) {
    check_exact<TestType, float>(comm, algo);
    check_exact<TestType, double>(comm, algo);
  }
  // The blocking convenience and the generic entry point.
  std::vector<int> v(10, comm.rank());
  TestType::allreduce(comm, v.data(), v.size());
  telar::allreduce(TestType{}, comm, v.data(), v.size());
  int const s = comm.size() * (comm.size() - 1) / 2;
  TELAR_REQUIRE_ALL(v == std::vector<int>(10, s * comm.size()));
}

TEMPLATE_TEST_CASE("allreduce of random values matches a serial sum", "[comm][allreduce]",
                   telar::MpiAllreduce, telar::RingAllreduce, telar::RecursiveHalvingDoubling,
                   telar::HierarchicalAllreduce) {
  Communicator comm(MPI_COMM_WORLD, "world");
  int const p = comm.size(), r = comm.rank();
  std::size_t const n = 30011;
  auto data_of = [n](int rank) { return uniform_of(1234u + unsigned(rank), n); };
  std::vector<double> serial(n, 0.0);
  for (int q = 0; q < p; ++q) {
    auto const v = data_of(q);
    for (std::size_t i = 0; i < n; ++i)
      serial[i] += v[i];
  }
  auto const algo = with_segment<TestType>(4096); // many segments
  std::vector<float> v = data_of(r);
  algo.start(comm, v.data(), n).wait();
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i)
    worst = std::max(worst, std::abs(v[i] - serial[i]));
  INFO("max error " << worst);
  TELAR_REQUIRE_ALL(worst <= 1e-5 * p);
  if constexpr (!std::is_same_v<TestType, telar::MpiAllreduce>) {
    // Each block is summed in one place and then copied: every replica
    // holds bitwise the same values (data-parallel replicas stay identical).
    long h = static_cast<long>(fnv(v.data(), n * sizeof(float)) >> 2);
    long lo = h, hi = h;
    comm.allreduce(&lo, 1, telar::ReduceOp::min);
    comm.allreduce(&hi, 1, telar::ReduceOp::max);
    TELAR_REQUIRE_ALL(lo == hi);
  }
}

TEMPLATE_TEST_CASE("concurrent allreduces complete in any waiting order", "[comm][allreduce]",
                   telar::MpiAllreduce, telar::RingAllreduce, telar::RecursiveHalvingDoubling,
                   telar::HierarchicalAllreduce) {
  Communicator comm(MPI_COMM_WORLD, "world");
  int const p = comm.size(), r = comm.rank();
  constexpr int k = 8;
  std::vector<std::vector<double>> bufs(k);
  std::vector<telar::AllreduceOp<double>> ops;
  auto const algo = with_segment<TestType>(256);
  for (int b = 0; b < k; ++b) {
    bufs[b].assign(static_cast<std::size_t>(100 * (b + 1)), double(r + b));
    ops.push_back(algo.start(comm, bufs[b].data(), bufs[b].size()));
  }
  // Odd ranks wait in reverse order: progress of every in-flight operation
  // inside any wait keeps this from deadlocking.
  if (r % 2 == 1)
    for (int b = k - 1; b >= 0; --b)
      ops[b].wait();
  else
    telar::wait_all(ops);
  bool ok = true;
  for (int b = 0; b < k; ++b)
    for (double x : bufs[b])
      ok = ok && x == double(p * (p - 1) / 2 + p * b);
  TELAR_REQUIRE_ALL(ok);
  // Polling with test() also completes an operation.
  std::vector<float> v(333, 1.f);
  auto op = algo.start(comm, v.data(), v.size());
  while (!op.test()) {
  }
  TELAR_REQUIRE_ALL(op.done() && v[0] == float(p) && v[332] == float(p));
}

TEST_CASE("hierarchical allreduce with every group size", "[comm][allreduce]") {
  Communicator comm(MPI_COMM_WORLD, "world");
  int const p = comm.size();
  for (int g = 1; g <= p; ++g) {
    if (p % g != 0)
      continue;
    telar::HierarchicalAllreduce algo(g);
    algo.segment_bytes = 64;
    check_exact<telar::HierarchicalAllreduce, float>(comm, algo);
    TELAR_REQUIRE_ALL(algo.group_size_for(comm) == g);
  }
  int const auto_g = telar::HierarchicalAllreduce{}.group_size_for(comm);
  TELAR_REQUIRE_ALL(auto_g >= 1 && p % auto_g == 0);
  if (p == 4)
    TELAR_REQUIRE_ALL(auto_g == 2); // one node: near-square 2 x 2
  if (p > 2 && p % 2 == 1) {
    // A group size that does not divide p is an error on every rank.
    bool threw = false;
    std::vector<float> v(4);
    try {
      telar::HierarchicalAllreduce(2).start(comm, v.data(), v.size());
    } catch (telar::CommError const& e) {
      threw = std::string(e.what()).find("does not divide") != std::string::npos;
    }
    TELAR_REQUIRE_ALL(threw);
  }
}

TEST_CASE("algorithm names", "[comm][allreduce]") {
  REQUIRE(std::string(telar::MpiAllreduce::name()) == "mpi");
  REQUIRE(std::string(telar::RingAllreduce::name()) == "ring");
  REQUIRE(std::string(telar::RecursiveHalvingDoubling::name()) == "recursive_halving_doubling");
  REQUIRE(std::string(telar::HierarchicalAllreduce::name()) == "hierarchical");
  REQUIRE(std::string(telar::TopologyAwareAllreduce::name()) == "topology_aware");
}

namespace {
// Sets an environment variable for one scope (the same on every rank).
struct ScopedEnv {
  char const* name;
  ScopedEnv(char const* n, char const* value) : name(n) {
    if (value)
      setenv(n, value, 1);
    else
      unsetenv(n);
  }
  ~ScopedEnv() { unsetenv(name); }
};

// The group size TopologyAwareAllreduce must pick with k ranks per fake node
// on p ranks: k when there are >= 2 nodes of k >= 2 consecutive ranks, else 0 (flat).
int expected_group(int p, int k) {
  return (k > 1 && p > k && p % k == 0) ? k : 0;
}
} // namespace

// The topology-aware allreduce against the flat ring on `comm`, over sizes
// not divisible by the ranks per node and of several segments: within
// tolerance, and bitwise equal on every rank.
namespace {
void check_topology_aware_equals_flat(Communicator& comm, std::mt19937& gen) {
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (std::size_t n : {std::size_t(1), std::size_t(3), std::size_t(1001), std::size_t(65537),
                        (std::size_t(1) << 20) + 3}) {
    std::vector<float> x(n);
    for (auto& v : x)
      v = dist(gen);
    std::vector<float> flat = x;
    telar::RingAllreduce{}.start(comm, flat.data(), n).wait();
    telar::TopologyAwareAllreduce{}.start(comm, x.data(), n).wait();
    bool ok = true;
    for (std::size_t i = 0; i < n; ++i)
      ok = ok && std::fabs(x[i] - flat[i]) <= 1e-5f * (1.f + std::fabs(flat[i]));
    std::uint64_t h = fnv(x.data(), n * sizeof(float)), h0 = h;
    comm.broadcast(&h0, 1, 0);
    INFO("n=" << n);
    TELAR_REQUIRE_ALL(ok && h == h0);
  }
}
} // namespace

TEST_CASE("topology-aware allreduce equals the flat one on fake nodes", "[comm][allreduce]") {
  int const p = telar_test::world_size();
  std::mt19937 gen(1234u + unsigned(telar_test::world_rank()));
  for (char const* k : {"1", "2", "3"}) {
    ScopedEnv fake("TELAR_RANKS_PER_NODE", k);
    Communicator comm(MPI_COMM_WORLD, "world"); // fresh: the layout is cached per communicator
    int const g = telar::TopologyAwareAllreduce{}.group_size_for(comm);
    auto const layout = telar::node_layout(comm);
    INFO("TELAR_RANKS_PER_NODE=" << k << " p=" << p << " group " << g);
    TELAR_REQUIRE_ALL(g == expected_group(p, std::atoi(k)));
    TELAR_REQUIRE_ALL(layout.nodes == (p + std::atoi(k) - 1) / std::atoi(k));
    TELAR_REQUIRE_ALL(layout.local_rank == comm.rank() % std::atoi(k));
    check_topology_aware_equals_flat(comm, gen);
  }
}

// On the nodes the run really has (the emulated cluster's test runs it on 2
// nodes of 2 ranks, tests/cluster/cluster_allreduce.sh, and reads the line).
TEST_CASE("topology-aware allreduce equals the flat one on this run's nodes",
          "[comm][allreduce][nodes]") {
  Communicator comm(MPI_COMM_WORLD, "world");
  auto const layout = telar::node_layout(comm);
  int const g = telar::TopologyAwareAllreduce{}.group_size_for(comm);
  if (comm.rank() == 0)
    std::printf("allreduce nodes: %d node(s) of %d rank(s), hierarchical groups of %d\n",
                layout.nodes, layout.ranks_per_node, g);
  std::mt19937 gen(99u + unsigned(comm.rank()));
  check_topology_aware_equals_flat(comm, gen);
}

TEST_CASE("TELAR_ALLREDUCE forces flat or hierarchical", "[comm][allreduce]") {
  int const p = telar_test::world_size();
  ScopedEnv fake("TELAR_RANKS_PER_NODE", "2");
  Communicator comm(MPI_COMM_WORLD, "world");
  telar::TopologyAwareAllreduce algo;
  {
    ScopedEnv mode("TELAR_ALLREDUCE", "flat");
    TELAR_REQUIRE_ALL(algo.group_size_for(comm) == 0);
  }
  {
    ScopedEnv mode("TELAR_ALLREDUCE", "hierarchical");
    int const g = algo.group_size_for(comm);
    TELAR_REQUIRE_ALL(g >= 1 && (expected_group(p, 2) == 0 || g == 2));
    std::vector<double> v(777, 1.0 + comm.rank());
    algo.start(comm, v.data(), v.size()).wait();
    TELAR_REQUIRE_ALL(v[0] == p * (p + 1) / 2.0 && v[776] == v[0]);
  }
  algo.mode = telar::AllreduceMode::flat; // the member, when the variable is unset
  TELAR_REQUIRE_ALL(algo.group_size_for(comm) == 0);
  // Bad values: a CommError naming the variable, the value and the rank, on every rank.
  auto message = [&](char const* var, char const* value) {
    ScopedEnv bad(var, value);
    Communicator fresh(MPI_COMM_WORLD, "world");
    std::vector<float> v(8, 1.f);
    try {
      telar::TopologyAwareAllreduce{}.start(fresh, v.data(), v.size()).wait();
    } catch (telar::CommError const& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string const rank = "on rank " + std::to_string(comm.rank()) + " of " + std::to_string(p);
  if (p > 1) {
    TELAR_REQUIRE_ALL(message("TELAR_ALLREDUCE", "ring") ==
                      "telar: TELAR_ALLREDUCE='ring' " + rank +
                          ": expected auto, flat or hierarchical");
    TELAR_REQUIRE_ALL(message("TELAR_RANKS_PER_NODE", "0") ==
                      "telar: TELAR_RANKS_PER_NODE='0' " + rank + ": expected a positive integer");
  }
}

// Each rank's value rounded once to bf16 (u = 2^-8), p - 1 partial sums
// rounded again: within p u sum_r |x_r| of the exact sum (bf16_wire.hpp).
// Values exactly representable in bf16 with few significant bits sum exactly.
TEMPLATE_TEST_CASE("Bf16Wire sums floats in bf16 within its bound, at half the bytes",
                   "[comm][allreduce][bf16]", telar::RingAllreduce, telar::RecursiveHalvingDoubling,
                   telar::HierarchicalAllreduce) {
  Communicator comm(MPI_COMM_WORLD, "world");
  int const p = comm.size(), r = comm.rank();
  std::size_t const n = 30011;
  auto data_of = [n](int rank) { return uniform_of(99u + unsigned(rank), n); };
  std::vector<double> exact(n, 0.0), magnitude(n, 0.0);
  for (int q = 0; q < p; ++q) {
    auto const v = data_of(q);
    for (std::size_t i = 0; i < n; ++i) {
      exact[i] += v[i];
      magnitude[i] += std::abs(v[i]);
    }
  }
  telar::Bf16Wire<TestType> wire;
  wire.segment_bytes = 4096; // many segments
  std::vector<float> v = data_of(r), f = v;
  comm.reset_bytes_sent();
  wire.start(comm, v.data(), n).wait();
  auto const bf16_bytes = comm.bytes_sent();
  comm.reset_bytes_sent();
  static_cast<TestType const&>(wire).start(comm, f.data(), n).wait();
  auto const fp32_bytes = comm.bytes_sent();
  double const u = std::ldexp(1.0, -8);
  double worst = 0; // error over the bound, worst element
  bool rounded = false;
  for (std::size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(v[i] - exact[i]) / (p * u * magnitude[i]));
    rounded = rounded || v[i] != f[i];
  }
  INFO(TestType::name() << ": worst error / bound " << worst << ", bytes " << bf16_bytes
                        << " (bf16) and " << fp32_bytes << " (fp32)");
  TELAR_REQUIRE_ALL(worst <= 1.0);
  TELAR_REQUIRE_ALL(2 * bf16_bytes == fp32_bytes);
  TELAR_REQUIRE_ALL(rounded || p == 1);
  long h = static_cast<long>(fnv(v.data(), n * sizeof(float)) >> 2), lo = h, hi = h;
  comm.allreduce(&lo, 1, telar::ReduceOp::min);
  comm.allreduce(&hi, 1, telar::ReduceOp::max);
  TELAR_REQUIRE_ALL(lo == hi);
  // Small integers are bf16 values and their sums too: exact.
  std::vector<float> w(257, float(r + 1));
  wire.start(comm, w.data(), w.size()).wait();
  TELAR_REQUIRE_ALL(w == std::vector<float>(257, float(p * (p + 1) / 2)));
}
