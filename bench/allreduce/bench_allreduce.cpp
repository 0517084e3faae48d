// Allreduce benchmark: every Telar algorithm against MPI_Allreduce for
// message sizes from 4 B to 64 MB (float), then 1000 tensors of 4 KB reduced
// one by one against the same data packed into one 4 MB allreduce.
//
//   mpiexec -np 2 ./bench_allreduce [--max-bytes N] [--min-bytes N]
//       [--mode sweep|buckets|all] [--segment-bytes N] [--max-in-flight N]
//       [--group-size N] [--rounds N]
//
// --mode interleaved: ring, hier and MPI_Allreduce take turns, one call each
// per round, for --rounds rounds at each size; the median per algorithm then
// compares them under the same load (for machines whose speed drifts).
//
// Each figure is the median over repetitions of the slowest rank's time,
// after warm-up; the number of repetitions falls with the size so a sweep
// stays short. algbw = bytes / time; busbw = algbw * 2(p-1)/p (what each
// link carries in a bandwidth-optimal allreduce); "vs MPI" = MPI_Allreduce's
// time / this time (> 1: faster than MPI_Allreduce).
#include <telar/comm/allreduce.hpp>
#include <telar/comm/communicator.hpp>
#include <telar/comm/topology.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

struct Options {
  std::size_t min_bytes = 4;
  std::size_t max_bytes = std::size_t(64) << 20;
  std::string mode = "all";
  std::size_t segment_bytes = telar::SegmentedSettings::default_segment_bytes;
  int max_in_flight = telar::SegmentedSettings::default_max_in_flight;
  int group_size = 0;
  int rounds = 9;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string const k = argv[i], v = argv[i + 1];
    if (k == "--min-bytes")
      o.min_bytes = std::stoull(v);
    else if (k == "--max-bytes")
      o.max_bytes = std::stoull(v);
    else if (k == "--mode")
      o.mode = v;
    else if (k == "--segment-bytes")
      o.segment_bytes = std::stoull(v);
    else if (k == "--max-in-flight")
      o.max_in_flight = std::stoi(v);
    else if (k == "--group-size")
      o.group_size = std::stoi(v);
    else if (k == "--rounds")
      o.rounds = std::stoi(v);
    else {
      std::fprintf(stderr, "bench_allreduce: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return o;
}

using Run = std::function<void(float*, std::size_t)>;
struct Algo {
  std::string name;
  Run run;
};

// Median of the per-repetition time of the slowest rank.
double time_it(telar::Communicator const& comm, Run const& run, float* data, std::size_t n,
               int warmup, int reps) {
  for (int i = 0; i < warmup; ++i)
    run(data, n);
  std::vector<double> t(static_cast<std::size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    comm.barrier();
    double const t0 = MPI_Wtime();
    run(data, n);
    t[static_cast<std::size_t>(i)] = MPI_Wtime() - t0;
  }
  comm.allreduce(t.data(), t.size(), telar::ReduceOp::max);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Sums of (rank + 1) are exact in float: checks each algorithm once per size.
bool verify(telar::Communicator const& comm, Run const& run, float* data, std::size_t n) {
  int const p = comm.size();
  std::fill(data, data + n, float(comm.rank() + 1));
  run(data, n);
  float const want = float(p * (p + 1) / 2);
  bool ok = n == 0 || (data[0] == want && data[n / 2] == want && data[n - 1] == want);
  return !comm.any(!ok);
}

std::string human(std::size_t b) {
  char buf[32];
  if (b >= (1u << 20))
    std::snprintf(buf, sizeof buf, "%zu MB", b >> 20);
  else if (b >= (1u << 10))
    std::snprintf(buf, sizeof buf, "%zu KB", b >> 10);
  else
    std::snprintf(buf, sizeof buf, "%zu B", b);
  return buf;
}

void sweep(telar::Communicator const& comm, std::vector<Algo> const& algos, Options const& o) {
  int const p = comm.size();
  bool const root = comm.rank() == 0;
  std::vector<float> buf(o.max_bytes / sizeof(float) + 1, 0.f);
  if (root) {
    std::printf("\n## Sweep: median time per allreduce (float, in place)\n\n");
    std::printf("| size | reps |");
    for (auto const& a : algos)
      std::printf(" %s us | algbw GB/s | busbw GB/s | vs MPI |", a.name.c_str());
    std::printf("\n|---:|---:|");
    for (std::size_t i = 0; i < algos.size(); ++i)
      std::printf("---:|---:|---:|---:|");
    std::printf("\n");
  }
  for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
    std::size_t const n = bytes / sizeof(float);
    int const reps =
        static_cast<int>(std::clamp<std::size_t>((std::size_t(256) << 20) / bytes, 5, 200));
    int const warmup = bytes >= (std::size_t(16) << 20) ? 1 : 3;
    std::vector<double> times;
    for (auto const& a : algos) {
      if (!verify(comm, a.run, buf.data(), n)) {
        if (root)
          std::printf("\nbench_allreduce: %s gave a wrong sum at %zu bytes\n", a.name.c_str(),
                      bytes);
        MPI_Abort(comm.native(), 3);
      }
      std::fill(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n), 0.5f);
      times.push_back(time_it(comm, a.run, buf.data(), n, warmup, reps));
    }
    if (root) {
      std::printf("| %s | %d |", human(bytes).c_str(), reps);
      for (std::size_t i = 0; i < algos.size(); ++i) {
        double const algbw = double(bytes) / times[i] / 1e9;
        double const busbw = algbw * 2.0 * (p - 1) / p;
        std::printf(" %.1f | %.2f | %.2f | %.2f |", times[i] * 1e6, algbw, busbw,
                    times[0] / times[i]);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
}

// One call of each algorithm per round, in turn; the median of the slowest
// rank's time per algorithm.
void interleaved(telar::Communicator const& comm, std::vector<Algo> const& algos,
                 Options const& o) {
  bool const root = comm.rank() == 0;
  std::vector<float> buf(o.max_bytes / sizeof(float) + 1, 0.f);
  if (root) {
    std::printf("\n## Interleaved: median of %d rounds, ms (slowest rank)\n\n| size |", o.rounds);
    for (auto const& a : algos)
      std::printf(" %s |", a.name.c_str());
    std::printf(" %s / %s |\n|---:|", algos[0].name.c_str(), algos[1].name.c_str());
    for (std::size_t i = 0; i <= algos.size(); ++i)
      std::printf("---:|");
    std::printf("\n");
  }
  for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
    std::size_t const n = bytes / sizeof(float);
    std::vector<std::vector<double>> t(algos.size());
    for (int r = 0; r < o.rounds + 1; ++r) // round 0 warms up
      for (std::size_t a = 0; a < algos.size(); ++a) {
        if (r == 0 && !verify(comm, algos[a].run, buf.data(), n))
          MPI_Abort(comm.native(), 3);
        std::vector<double> one = {time_it(comm, algos[a].run, buf.data(), n, 0, 1)};
        if (r > 0)
          t[a].push_back(one[0]);
      }
    if (!root)
      continue;
    std::printf("| %s |", human(bytes).c_str());
    std::vector<double> med;
    for (auto& v : t) {
      std::sort(v.begin(), v.end());
      med.push_back(v[v.size() / 2]);
      std::printf(" %.2f |", med.back() * 1e3);
    }
    std::printf(" %.2f |\n", med[0] / med[1]);
    std::fflush(stdout);
  }
}

// 1000 tensors of 1024 floats: one allreduce each (blocking), all started at
// once then waited (Telar's non-blocking interface), or packed into one
// buffer (copy in, one allreduce, copy out).
void buckets(telar::Communicator const& comm, std::vector<Algo> const& algos,
             std::vector<std::function<std::vector<telar::AllreduceOp<float>>(
                 std::vector<std::vector<float>>&)>> const& starts,
             Options const&) {
  constexpr int k = 1000;
  constexpr std::size_t len = 1024;
  std::vector<std::vector<float>> tensors(k, std::vector<float>(len, 0.25f));
  std::vector<float> packed(k * len);
  bool const root = comm.rank() == 0;
  if (root) {
    std::printf("\n## %d tensors of %zu floats (4 KB): total time in ms (median of 5)\n\n", k, len);
    std::printf("| algorithm | one by one | all started, then waited | packed into one 4 MB buffer "
                "(incl. copies) |\n");
    std::printf("|---|---:|---:|---:|\n");
  }
  for (std::size_t a = 0; a < algos.size(); ++a) {
    auto const& run = algos[a].run;
    Run one_by_one = [&](float*, std::size_t) {
      for (auto& t : tensors)
        run(t.data(), len);
    };
    Run concurrent = [&](float*, std::size_t) {
      if (!starts[a])
        return;
      auto ops = starts[a](tensors);
      telar::wait_all(ops);
    };
    Run pack = [&](float*, std::size_t) {
      for (int i = 0; i < k; ++i)
        std::memcpy(packed.data() + i * len, tensors[static_cast<std::size_t>(i)].data(),
                    len * sizeof(float));
      run(packed.data(), packed.size());
      for (int i = 0; i < k; ++i)
        std::memcpy(tensors[static_cast<std::size_t>(i)].data(), packed.data() + i * len,
                    len * sizeof(float));
    };
    double const t1 = time_it(comm, one_by_one, nullptr, 0, 1, 5);
    double const t2 = starts[a] ? time_it(comm, concurrent, nullptr, 0, 1, 5) : 0.0;
    double const t3 = time_it(comm, pack, nullptr, 0, 1, 5);
    if (root) {
      if (starts[a])
        std::printf("| %s | %.1f | %.1f | %.1f |\n", algos[a].name.c_str(), t1 * 1e3, t2 * 1e3,
                    t3 * 1e3);
      else
        std::printf("| %s | %.1f | n/a | %.1f |\n", algos[a].name.c_str(), t1 * 1e3, t3 * 1e3);
      std::fflush(stdout);
    }
  }
}

template <class Policy>
std::function<std::vector<telar::AllreduceOp<float>>(std::vector<std::vector<float>>&)>
starter(telar::Communicator const& comm, Policy policy) {
  return [&comm, policy](std::vector<std::vector<float>>& ts) {
    std::vector<telar::AllreduceOp<float>> ops;
    ops.reserve(ts.size());
    for (auto& t : ts)
      ops.push_back(policy.start(comm, t.data(), t.size()));
    return ops;
  };
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    Options const o = parse(argc, argv);
    telar::Communicator comm(MPI_COMM_WORLD, "bench");
    telar::abort_on_error(comm, [&] {
      telar::RingAllreduce ring;
      telar::RecursiveHalvingDoubling rhd;
      telar::HierarchicalAllreduce hier(o.group_size);
      for (telar::SegmentedSettings* s : {static_cast<telar::SegmentedSettings*>(&ring),
                                          static_cast<telar::SegmentedSettings*>(&rhd),
                                          static_cast<telar::SegmentedSettings*>(&hier)}) {
        s->segment_bytes = o.segment_bytes;
        s->max_in_flight = o.max_in_flight;
      }
      std::vector<Algo> algos = {
          {"MPI_Allreduce",
           [&](float* d, std::size_t n) {
             MPI_Allreduce(MPI_IN_PLACE, d, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm.native());
           }},
          {"MpiAllreduce",
           [&](float* d, std::size_t n) { telar::MpiAllreduce{}.start(comm, d, n).wait(); }},
          {"ring", [&](float* d, std::size_t n) { ring.start(comm, d, n).wait(); }},
          {"rhd", [&](float* d, std::size_t n) { rhd.start(comm, d, n).wait(); }},
          {"hier", [&](float* d, std::size_t n) { hier.start(comm, d, n).wait(); }},
      };
      int const g = hier.group_size_for(comm);
      auto const nodes = telar::node_layout(comm);
      int const auto_g = telar::TopologyAwareAllreduce{}.group_size_for(comm);
      if (comm.rank() == 0) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(version, &len);
        std::string v(version, static_cast<std::size_t>(len));
        v = v.substr(0, v.find_first_of("\n,"));
        std::printf("# bench_allreduce\n\n");
        std::printf("- ranks: %d\n- MPI: %s\n", comm.size(), v.c_str());
        std::printf("- nodes: %d, %d rank(s) on rank 0's node, %s; TopologyAwareAllreduce: %s\n",
                    nodes.nodes, nodes.ranks_per_node, nodes.regular() ? "regular" : "irregular",
                    auto_g == 0 ? "flat (ring)" : "hierarchical");
        std::printf("- sizes: %zu B .. %zu B, x4; float sum in place\n", o.min_bytes, o.max_bytes);
        std::printf("- repetitions: clamp(256 MB / size, 5, 200) after 3 warm-up runs (1 from 16 "
                    "MB); median of the slowest rank\n");
        std::printf("- ring/rhd/hier: segment %zu B, %d messages in flight per direction; hier "
                    "groups of %d x %d\n",
                    o.segment_bytes, o.max_in_flight, g, comm.size() / g);
        std::printf("- MPI_Allreduce: blocking call on the same communicator; MpiAllreduce: "
                    "MPI_Iallreduce + Telar's bounded wait\n");
        std::fflush(stdout);
      }
      if (o.mode == "sweep" || o.mode == "all")
        sweep(comm, algos, o);
      if (o.mode == "interleaved")
        interleaved(comm, {algos[2], algos[4], algos[0]}, o); // ring, hier, MPI_Allreduce
      if (o.mode == "buckets" || o.mode == "all") {
        std::vector<
            std::function<std::vector<telar::AllreduceOp<float>>(std::vector<std::vector<float>>&)>>
            starts = {nullptr, starter(comm, telar::MpiAllreduce{}), starter(comm, ring),
                      starter(comm, rhd), starter(comm, hier)};
        buckets(comm, algos, starts, o);
      }
    });
  }
  MPI_Finalize();
  return 0;
}
