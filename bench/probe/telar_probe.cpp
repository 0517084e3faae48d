// telar_probe: measures this machine's telar::MachineProfile and writes it
// where the planner reads it (telar::default_profile_path(), or --out).
//
//   mpirun -np 2 build/bench/probe/telar_probe [--out PATH] [--reps N]
//
// Compute rates are taken on rank 0 while the other ranks wait (one rank
// alone, as the profile defines them), by telar::measure_compute()
// (parallel/machine_probe.hpp; a run whose cached profile is stale calls it
// too): a Dense layer's forward at n = 64, 256, 1024 (GEMM), a 3x3 Conv2D
// 32->32 on 14x14 images, an element-wise ReLU pass, AdamW's update, and the
// conditions they were measured under (time, load, share of a core, build).
// shared_slowdown: a Dense 784->256 forward + backward timed on rank 0 alone
// and on every rank at once (the median ratio). Message costs are fitted
// per link class: alpha + beta * bytes * f(p), least squares weighted by
// 1/t^2 (relative error, so small messages fix alpha) over 8 B .. 64 MiB,
// each call on a fresh buffer out of a pool larger than the caches, for
// telar::RingAllreduce (the "allreduce" the examples use), MPI_Allreduce
// ("mpi_allreduce"), MPI_Reduce_scatter_block, MPI_Allgather and a
// ping-pong: among the ranks of each node ("same node", ranks grouped by
// MPI_Comm_split_type shared) and, when the ranks span nodes, among one
// rank per node ("across nodes", the profile's across_* keys).
// sync_wait: see sync_wait_seconds(). Fixed step costs: Trainer steps of a 4-parameter
// model (DataParallel<RingAllreduce>, SGD) at 1 and 8 micro-batches, less the allreduce's alpha.
// Medians of --reps. Rank 0's compute (rates, optimizer, shared_slowdown)
// is timed in thread CPU time on the serial backend and the message costs
// are scaled to a whole core by the share of a core measured after them
// (per_core()), so a probe under load writes the machine, not the load: the
// run measures its own share (docs/planner.md).
#include <telar/comm/allreduce.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/adam.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/parallel/calibrate.hpp>
#include <telar/parallel/machine_probe.hpp>
#include <telar/parallel/machine_profile.hpp>
#include <telar/train/trainer.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace {

int reps = 7;

// Median seconds of f(): messages by the wall clock (MPI_Wtime), one rank's
// compute (`cpu`) by calibrate_layers()' clock (thread CPU time on the
// serial backend), so that the load at probe time stays out of the rates.
template <class F>
double median_seconds(F&& f, bool cpu = false) {
  auto const now = [cpu] { return cpu ? telar::detail::calibration_clock() : MPI_Wtime(); };
  f(); // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    double const t0 = now();
    f();
    Kokkos::fence();
    t.push_back(now() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Least-squares alpha, beta of t = alpha + beta * x, weighted by 1/t^2:
// the relative error counts, so 8-byte calls fix alpha and 64 MiB ones beta.
telar::LinkCost fit(std::vector<double> const& x, std::vector<double> const& t) {
  double sw = 0, sx = 0, st = 0, sxx = 0, sxt = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    double const w = 1.0 / (t[i] * t[i]);
    sw += w;
    sx += w * x[i];
    st += w * t[i];
    sxx += w * x[i] * x[i];
    sxt += w * x[i] * t[i];
  }
  telar::LinkCost c;
  c.beta = std::max(0.0, (sw * sxt - sx * st) / (sw * sxx - sx * sx));
  c.alpha = std::max(0.0, (st - c.beta * sx) / sw);
  return c;
}

// Buffers that a collective takes in turn, together larger than the caches,
// so no call finds its data cached by the previous one.
struct FreshBuffers {
  std::vector<std::vector<float>> pool;
  std::size_t next = 0;
  explicit FreshBuffers(std::size_t bytes) {
    std::size_t const n =
        std::max<std::size_t>(2, (std::size_t(192) << 20) / std::max<std::size_t>(bytes, 1));
    pool.assign(std::min<std::size_t>(n, 64),
                std::vector<float>(std::max<std::size_t>(bytes / 4, 2), 1.0f));
  }
  float* get() { return pool[next++ % pool.size()].data(); }
};

// Every rank of `comm`: the collective `run(bytes)` over sizes, fitted
// against bytes * factor.
template <class Run>
telar::LinkCost measure(MPI_Comm comm, char const* what, double factor, Run run) {
  std::vector<double> x, t;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  for (std::size_t bytes = 8; bytes <= (std::size_t(64) << 20); bytes *= 4) {
    FreshBuffers in(bytes), out(bytes);
    MPI_Barrier(comm);
    double s = median_seconds([&] { run(bytes, in.get(), out.get()); });
    MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, comm);
    x.push_back(double(bytes) * factor);
    t.push_back(s);
    if (rank == 0)
      std::fprintf(stderr, "%s %zu B: %.1f us\n", what, bytes, s * 1e6);
  }
  return fit(x, t);
}

// The five collectives over the ranks of `mpi` (at least 2), named `link`
// in the log: telar::RingAllreduce, MPI_Allreduce, MPI_Reduce_scatter_block,
// MPI_Allgather, and a ping-pong between its ranks 0 and 1 (half a round trip).
telar::LinkCosts measure_links(MPI_Comm mpi, std::string const& link) {
  int rank = 0, p = 1;
  MPI_Comm_rank(mpi, &rank);
  MPI_Comm_size(mpi, &p);
  double const pd = double(p);
  telar::Communicator comm(mpi, "telar_probe " + link);
  auto name = [&](char const* what) {
    static std::string s;
    s = std::string(what) + " (" + link + ")";
    return s.c_str();
  };
  telar::LinkCosts l;
  l.allreduce = measure(mpi, name("ring allreduce"), 2 * (pd - 1) / pd,
                        [&](std::size_t bytes, float* a, float*) {
                          telar::RingAllreduce::allreduce(comm, a, bytes / 4);
                        });
  l.mpi_allreduce = measure(
      mpi, name("MPI_Allreduce"), 2 * (pd - 1) / pd, [&](std::size_t bytes, float* a, float* b) {
        MPI_Allreduce(a, b, int(std::max<std::size_t>(bytes / 4, 1)), MPI_FLOAT, MPI_SUM, mpi);
      });
  l.reduce_scatter = measure(mpi, name("MPI_Reduce_scatter_block"), (pd - 1) / pd,
                             [&](std::size_t bytes, float* a, float* b) {
                               MPI_Reduce_scatter_block(
                                   a, b, int(std::max<std::size_t>(bytes / 4 / std::size_t(p), 1)),
                                   MPI_FLOAT, MPI_SUM, mpi);
                             });
  l.all_gather = measure(mpi, name("MPI_Allgather"), (pd - 1) / pd,
                         [&](std::size_t bytes, float* a, float* b) {
                           int const n = int(std::max<std::size_t>(bytes / std::size_t(p), 1));
                           MPI_Allgather(a, n, MPI_CHAR, b, n, MPI_CHAR, mpi);
                         });
  l.send_recv = measure(mpi, name("send/recv"), 1.0, [&](std::size_t bytes, float* a, float* b) {
    for (int i = 0; i < 2; ++i) {
      if (rank == 0) {
        MPI_Send(a, int(bytes), MPI_CHAR, 1, 0, mpi);
        MPI_Recv(b, int(bytes), MPI_CHAR, 1, 0, mpi, MPI_STATUS_IGNORE);
      } else if (rank == 1) {
        MPI_Recv(b, int(bytes), MPI_CHAR, 0, 0, mpi, MPI_STATUS_IGNORE);
        MPI_Send(a, int(bytes), MPI_CHAR, 0, 0, mpi);
      }
    }
  });
  l.send_recv.alpha /= 4; // two round trips of two messages
  l.send_recv.beta /= 4;
  return l;
}

// Rank 0's `l` on every rank of MPI_COMM_WORLD.
void broadcast_links(telar::LinkCosts& l) {
  for (telar::LinkCost* c :
       {&l.allreduce, &l.mpi_allreduce, &l.reduce_scatter, &l.all_gather, &l.send_recv}) {
    MPI_Bcast(&c->alpha, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Bcast(&c->beta, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  }
}

// Median seconds of a Dense 784->256 forward + backward on 64 rows.
double dense_step_seconds() {
  using D = telar::Dense<float>;
  auto const t = telar::detail::time_layer(D(784, 256), telar::Shape{784}, 64, reps * 3);
  return t.forward + t.backward_input + t.backward_weight;
}

// Expected scheduling wait of one blocking synchronisation: every rank
// loops (compute ~1 ms, 8-byte telar::RingAllreduce); the median loop less
// the median of the same compute with no allreduce, less the allreduce's alpha.
double sync_wait_seconds(telar::Communicator const& comm, double alpha) {
  using D = telar::Dense<float>;
  auto run = [&](bool sync) {
    std::vector<double> t;
    float flag = 1;
    for (int i = 0; i < 4 + 6 * reps; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      double const t0 = MPI_Wtime();
      (void)telar::detail::time_layer(D(784, 256), telar::Shape{784}, 64, 1);
      if (sync)
        telar::RingAllreduce::allreduce(comm, &flag, 1);
      if (i >= 4)
        t.push_back(MPI_Wtime() - t0);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  std::vector<double> d;
  for (int i = 0; i < 3; ++i) { // interleaved
    double const with = run(true), without = run(false);
    d.push_back(with - without - alpha);
  }
  std::sort(d.begin(), d.end());
  double w = std::max(0.0, d[1]);
  MPI_Allreduce(MPI_IN_PLACE, &w, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return w;
}

// The share of a core every rank had (measure_scheduling() on all at once,
// the mean over ranks), around the message measurements.
double share_of_a_core() {
  MPI_Barrier(MPI_COMM_WORLD);
  double s = telar::measure_scheduling(0.1).cpu_share;
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return s / p;
}

// Message costs per core: a collective on shared memory is CPU copies and
// polling, so wall times taken with `share` of a core are `share` x what a
// core takes; the cost model divides by the run's own share (docs/planner.md).
void per_core(telar::MachineProfile& prof, double share) {
  std::vector<telar::LinkCost*> links{&prof.allreduce, &prof.mpi_allreduce, &prof.reduce_scatter,
                                      &prof.all_gather, &prof.send_recv};
  if (prof.ranks_per_node > 0) // measured: the ranks spanned nodes
    links.insert(links.end(),
                 {&prof.across.allreduce, &prof.across.mpi_allreduce, &prof.across.reduce_scatter,
                  &prof.across.all_gather, &prof.across.send_recv});
  for (telar::LinkCost* l : links) {
    l->alpha *= share;
    l->beta *= share;
  }
}

// Median seconds of a Trainer step of a 4-parameter model with `m` micro-batches.
double trainer_step_seconds(int p, int m) {
  using Model = telar::Sequential<telar::Dense<float>>;
  using S = telar::Strategy<telar::DataParallel<telar::RingAllreduce>>;
  telar::TrainerOptions o;
  o.batch_size = std::size_t(8 * p);
  o.microbatches = m;
  o.grid = {p, 1, 1};
  telar::Trainer<Model, S, telar::SGD<float>> trainer(
      MPI_COMM_WORLD, Model(telar::Dense<float>(1, 2)), telar::SGD<float>{}, o, telar::Shape{1});
  telar::Matrix<float> x("x", 8, 1);
  telar::Labels<telar::DefaultMemorySpace> y("y", 8);
  std::vector<double> t;
  for (int i = 0; i < 3 + 4 * reps; ++i) {
    double const s = trainer.step(x, y).seconds;
    if (i >= 3)
      t.push_back(s);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int rank = 0, p = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    std::string out = telar::default_profile_path();
    for (int i = 1; i < argc; ++i) {
      if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc)
        out = argv[++i];
      else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
        reps = std::max(1, std::atoi(argv[++i]));
    }
    telar::MachineProfile prof;
    char host[256] = "unknown";
    int len = 0;
    MPI_Get_processor_name(host, &len);
    prof.name = std::string(host) + " (telar_probe, np " + std::to_string(p) + ")";
    prof.cores = std::max(1, int(std::thread::hardware_concurrency()));
    if (rank == 0) // rates, optimizer, and the conditions they were measured under
      telar::measure_compute(prof, reps);
    // Compute of every rank at once against rank 0 alone, interleaved.
    if (p > 1) {
      std::vector<double> ratio;
      for (int i = 0; i < 3; ++i) {
        MPI_Barrier(MPI_COMM_WORLD);
        double alone = 0;
        if (rank == 0)
          alone = dense_step_seconds();
        MPI_Barrier(MPI_COMM_WORLD);
        double const together = dense_step_seconds();
        ratio.push_back(together / alone);
      }
      std::sort(ratio.begin(), ratio.end());
      prof.shared_slowdown = std::max(1.0, ratio[1]);
      MPI_Bcast(&prof.shared_slowdown, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    }
    if (p > 1) {
      // Link classes: ranks sharing rank 0's node measure "same node"; one
      // rank per node (the first of each) "across nodes", when ranks span
      // nodes (MPI_Comm_split_type shared).
      MPI_Comm node = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
      int local = 0, on_node = 1, nodes = 1;
      MPI_Comm_rank(node, &local);
      MPI_Comm_size(node, &on_node);
      MPI_Comm_split(MPI_COMM_WORLD, local == 0 ? 0 : MPI_UNDEFINED, rank, &leaders);
      if (leaders != MPI_COMM_NULL)
        MPI_Comm_size(leaders, &nodes);
      MPI_Bcast(&nodes, 1, MPI_INT, 0, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &on_node, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      telar::LinkCosts same = prof.link_class(false);
      if (on_node >= 2) { // every node measures at once: its own links, as in a run
        same = measure_links(node, "same node");
        broadcast_links(same);
      } else if (rank == 0)
        std::fprintf(stderr, "one rank per node: same-node costs left at their defaults\n");
      prof.allreduce = same.allreduce;
      prof.mpi_allreduce = same.mpi_allreduce;
      prof.reduce_scatter = same.reduce_scatter;
      prof.all_gather = same.all_gather;
      prof.send_recv = same.send_recv;
      if (nodes >= 2) {
        if (leaders != MPI_COMM_NULL)
          prof.across = measure_links(leaders, "across nodes");
        broadcast_links(prof.across);
        prof.link = "same node and across nodes";
        prof.ranks_per_node = on_node;
      }
      if (leaders != MPI_COMM_NULL)
        MPI_Comm_free(&leaders);
      MPI_Comm_free(&node);
      telar::Communicator comm(MPI_COMM_WORLD, "telar_probe");
      prof.sync_wait_us = 1e6 * sync_wait_seconds(comm, prof.allreduce.alpha);
      per_core(prof, share_of_a_core());
    }
    {
      // Fixed step costs; the 4-parameter model's own allreduce is the
      // model's dp sync, not a fixed cost.
      // Per whole core, as the message costs: wall times taken with `share`
      // of a core are `share` x what a core takes (the model stretches them
      // by the run's own share).
      double const one = trainer_step_seconds(p, 1), eight = trainer_step_seconds(p, 8);
      double const share = share_of_a_core();
      double const sync = p > 1 ? prof.allreduce.alpha : 0.0;
      prof.step_overhead_us = std::max(0.0, (one * share - sync) * 1e6);
      prof.microbatch_overhead_us = std::max(0.0, (eight - one) * share / 7 * 1e6);
      MPI_Bcast(&prof.step_overhead_us, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
      MPI_Bcast(&prof.microbatch_overhead_us, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    }
    if (rank == 0) {
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(out).parent_path(), ec);
      try {
        telar::save_machine_profile(prof, out);
        std::printf("%s\nwritten to %s\n", prof.to_json().c_str(), out.c_str());
      } catch (std::exception const& e) {
        std::fprintf(stderr, "telar_probe: %s\n", e.what());
        rc = 1;
      }
    }
  }
  MPI_Finalize();
  return rc;
}
