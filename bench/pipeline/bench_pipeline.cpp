// Pipeline schedules, measured and predicted, on one MLP:
//   in -> H, K blocks of H x H Dense + ReLU, -> 10, fp32, SGD, synthetic data.
//
//   mpirun -np P bench_pipeline [--blocks 7] [--hidden 1024] [--in 784] [--batch 128]
//        [--microbatches 8] [--chunks 2] [--warmup 5] [--steps 10] [--rounds 5]
//        [--max-rounds 4*rounds] [--pairs 100] [--max-foreign 0.05] [--max-wait 900]
//        [--schedules gpipe,1f1b,interleaved,zb-h1,zb-h2] [--svg DIR] [--dump NAME] [--json]
//
// One Trainer per schedule (same model, same seed, pp = P ranks, tracing on). After the warm-up
// steps the schedules take turns: each round runs --steps steps of every schedule (the order
// rotates from round to round), so slow drifts of a shared machine hit all of them alike.
// Per step: the step time (slowest rank, after a barrier), the measured timeline of the step
// (Trainer::pipeline_timeline) and its bubble fraction (schedule::analyze), and the bubble
// schedule::simulate predicts with a CostModel from the same step: mean F, B, W (or fused
// Backward) per virtual stage, the optimizer step, the mean time a rank spends posting a send
// and a receive, alpha and beta from a ping-pong of one activation message over the pipeline
// communicator. Reported: medians over steps, the median of the per-step differences, and
// checks of the model (see the second table). Then --pairs alternating 1F1B / ZB-H1 steps give
// their throughput ratio.
//
// The machine may be shared: a block of steps during which other processes used more than
// --max-foreign of the CPUs (Linux /proc/stat) is dropped, and the next block waits (up to
// --max-wait seconds in all) for a quiet moment. --svg DIR writes, per schedule, the measured
// timeline of the step with the median bubble and its prediction; --dump NAME prints every
// step of one schedule and the measured and predicted events of its median step.
// Timings are figures to read, never to assert.
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/schedule.hpp>
#include <telar/train/trainer.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <unistd.h>
#include <utility>
#include <vector>

namespace ts = telar::schedule;

namespace {

struct Args {
  std::size_t in = 784, hidden = 1024, batch = 128;
  int blocks = 7, microbatches = 8, chunks = 2, warmup = 5, steps = 10, rounds = 5, max_rounds = 0;
  double max_foreign = 0.05; // blocks with more foreign CPU load are dropped
  double max_wait = 900;     // seconds to wait in all for a quiet machine
  int pairs = 100;           // alternating 1F1B / ZB-H1 steps for their throughput ratio
  std::vector<std::string> schedules{"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"};
  std::string svg, dump; // dump: print measured vs simulated events of this schedule's median step
  bool json = false;
};

std::vector<std::string> split(std::string const& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty())
      out.push_back(item);
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string const f = argv[i];
    if (f == "--json") {
      a.json = true;
      continue;
    }
    if (i + 1 >= argc)
      throw std::invalid_argument("bench_pipeline: " + f + " needs a value");
    std::string const v = argv[++i];
    if (f == "--in")
      a.in = std::stoul(v);
    else if (f == "--hidden")
      a.hidden = std::stoul(v);
    else if (f == "--batch")
      a.batch = std::stoul(v);
    else if (f == "--blocks")
      a.blocks = std::stoi(v);
    else if (f == "--microbatches")
      a.microbatches = std::stoi(v);
    else if (f == "--chunks")
      a.chunks = std::stoi(v);
    else if (f == "--warmup")
      a.warmup = std::stoi(v);
    else if (f == "--steps")
      a.steps = std::stoi(v);
    else if (f == "--rounds")
      a.rounds = std::stoi(v);
    else if (f == "--max-rounds")
      a.max_rounds = std::stoi(v);
    else if (f == "--max-foreign")
      a.max_foreign = std::stod(v);
    else if (f == "--max-wait")
      a.max_wait = std::stod(v);
    else if (f == "--pairs")
      a.pairs = std::stoi(v);
    else if (f == "--schedules")
      a.schedules = split(v);
    else if (f == "--svg")
      a.svg = v;
    else if (f == "--dump")
      a.dump = v;
    else
      throw std::invalid_argument("bench_pipeline: unknown flag " + f);
  }
  return a;
}

using D = telar::Dense<float>;
using R = telar::ReLU<float>;

template <class Tuple>
struct SequentialOf;
template <class... L>
struct SequentialOf<std::tuple<L...>> {
  using type = telar::Sequential<L...>;
};

template <std::size_t>
std::tuple<D, R> block(std::size_t h) {
  return {D(h, h), R{}};
}

// D(in, h) R, K x [D(h, h) R], D(h, 10).
template <std::size_t... I>
auto mlp_layers(std::size_t in, std::size_t h, std::index_sequence<I...>) {
  return std::tuple_cat(std::make_tuple(D(in, h), R{}), block<I>(h)..., std::make_tuple(D(h, 10)));
}

double median(std::vector<double> v) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  std::size_t const n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
std::string pct(double f) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", 100 * f);
  return b;
}
double mean(std::vector<double> const& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
}

// alpha (s) and beta (s/byte) of the pipeline communicator, rank 0 <-> rank 1, from the half
// round trip of a 1-float and an activation-sized message.
std::pair<double, double> ping_pong(telar::Communicator const& pp, std::size_t floats) {
  if (pp.size() < 2)
    return {0, 0};
  std::vector<float> buf(floats, 1.f);
  auto half_rtt = [&](std::size_t n) {
    int const reps = 200;
    std::vector<double> t;
    for (int i = 0; i < reps + 10; ++i) {
      pp.barrier();
      double const t0 = MPI_Wtime();
      if (pp.rank() == 0) {
        pp.send(buf.data(), n, 1, 7);
        pp.recv(buf.data(), n, 1, 7);
      } else if (pp.rank() == 1) {
        pp.recv(buf.data(), n, 0, 7);
        pp.send(buf.data(), n, 0, 7);
      }
      if (i >= 10)
        t.push_back((MPI_Wtime() - t0) / 2);
    }
    double m = median(t);
    pp.broadcast(&m, 1, 0);
    return m;
  };
  double const small = half_rtt(1), big = half_rtt(floats);
  double const beta = std::max(0.0, (big - small) / double((floats - 1) * sizeof(float)));
  return {small, beta};
}

// CPU time used on this machine by other processes than the benchmark's ranks (Linux /proc), as a
// fraction of all CPUs: a shared machine's other jobs distort a pipeline far more than they slow
// a single process (one stalled rank stalls the other), so rounds during which something else
// ran are measured but not used.
struct CpuClock {
  double busy = 0, ours = 0, wall = 0; // seconds
};
CpuClock cpu_clock() {
  CpuClock c;
  double const hz = double(sysconf(_SC_CLK_TCK));
  if (FILE* f = std::fopen("/proc/stat", "r")) {
    unsigned long long v[8] = {};
    if (std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                    &v[4], &v[5], &v[6], &v[7]) == 8)
      c.busy = double(v[0] + v[1] + v[2] + v[5] + v[6]) / hz; // user nice system irq softirq
    std::fclose(f);
  }
  if (FILE* f = std::fopen("/proc/self/stat", "r")) {
    char buf[1024];
    std::size_t const n = std::fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    std::fclose(f);
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    if (char const* q = std::strrchr(buf, ')')) {
      unsigned long long ut = 0, st = 0;
      if (std::sscanf(q + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) ==
          2)
        c.ours = double(ut + st) / hz;
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, &c.ours, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Bcast(&c.busy, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  c.wall = MPI_Wtime();
  return c;
}
double foreign_load(CpuClock const& a, CpuClock const& b) {
  long const cpus = sysconf(_SC_NPROCESSORS_ONLN);
  double const wall = b.wall - a.wall;
  if (wall <= 0 || cpus <= 0 || b.busy == 0)
    return 0;
  return std::max(0.0, (b.busy - a.busy) - (b.ours - a.ours)) / (wall * double(cpus));
}

// Waits (collectively) until other processes leave the machine quiet for a moment, at most
// `budget` seconds in all over the run; returns the seconds waited.
double wait_quiet(double max_foreign, double& budget) {
  double waited = 0;
  while (budget > 0) {
    CpuClock const a = cpu_clock();
    usleep(300000);
    CpuClock const b = cpu_clock();
    if (foreign_load(a, b) <= max_foreign)
      break;
    waited += b.wall - a.wall;
    budget -= b.wall - a.wall;
  }
  return waited;
}

using OpTimes = std::map<std::pair<int, int>, std::vector<double>>; // (virtual stage, op)

// Message costs of the pipeline communicator and the size of one message.
struct Messages {
  double alpha = 0, beta = 0, bytes = 0;
  bool overheads = true; // use the measured per-message overheads (posting a Send / Recv)
};

// The simulator's cost model from measured op times: per virtual stage the mean Forward, the
// mean fused Backward (as backward_input, backward_weight = 0: the simulator only uses their
// sum for a fused Backward) or the mean BackwardInput and BackwardWeight, the mean optimizer
// step, and the messages: alpha and beta from the ping-pong; as send_overhead the mean time a
// rank spends posting a Send, as recv_overhead the mean time a receive takes when its data is
// already there (see receives()).
ts::CostModel cost_model(OpTimes const& ops, ts::Schedule const& sched, Messages const& msg) {
  auto avg = [&](int vs, ts::Op op) {
    auto it = ops.find({vs, int(op)});
    return it == ops.end() ? 0.0 : mean(it->second);
  };
  int const V = sched.virtual_stages();
  ts::CostModel c;
  c.forward.assign(std::size_t(V), 0);
  c.backward_input.assign(std::size_t(V), 0);
  c.backward_weight.assign(std::size_t(V), 0);
  for (int vs = 0; vs < V; ++vs) {
    c.forward[vs] = avg(vs, ts::Op::Forward);
    c.backward_input[vs] = avg(vs, ts::Op::Backward) + avg(vs, ts::Op::BackwardInput);
    c.backward_weight[vs] = avg(vs, ts::Op::BackwardWeight);
  }
  c.optimizer_step = avg(-1, ts::Op::OptimizerStep);
  if (msg.overheads) {
    c.send_overhead = avg(-2, ts::Op::SendActivation);
    c.recv_overhead = avg(-2, ts::Op::RecvActivation);
  }
  c.alpha = msg.alpha;
  c.beta = msg.beta;
  c.activation_bytes = c.grad_bytes = msg.bytes;
  return c;
}

// The receives of a measured step: each Recv has two events, its posting (MPI_Irecv) and, where
// the data is used, its wait. When the matching send had been posted before the receive was,
// the data was there and both events are the receive's own work (matching, copying the
// message: CostModel::recv_overhead); otherwise the wait also holds real waiting.
using RecvKey = std::tuple<int, int, int, int>; // rank, op, micro-batch, chunk
struct Receive {
  double posted = 0, post = 0, wait = 0;
  bool data_there = false;
};
std::map<RecvKey, Receive> receives(ts::Schedule const& s, ts::Timeline const& tl) {
  auto key_of = [&](ts::Event const& e) {
    ts::MessageKey const k = ts::message_key(s, e.rank, {e.op, e.microbatch, e.chunk, -1});
    return std::make_tuple(int(k.channel), k.microbatch, k.boundary);
  };
  std::map<std::tuple<int, int, int>, double> sent; // message -> end of its send's posting
  for (auto const& e : tl.events)
    if (ts::is_send(e.op))
      sent[key_of(e)] = e.end;
  std::map<RecvKey, Receive> out;
  std::map<RecvKey, int> seen;
  for (auto const& e : tl.events) {
    if (!ts::is_recv(e.op))
      continue;
    RecvKey const k{e.rank, int(e.op), e.microbatch, e.chunk};
    Receive& r = out[k];
    if (seen[k]++ == 0) {
      r.posted = e.start;
      r.post = e.duration();
      auto it = sent.find(key_of(e));
      r.data_there = it != sent.end() && it->second <= e.start;
    } else {
      r.wait += e.duration();
    }
  }
  return out;
}

// Replays one measured step: the simulator's rules (each rank runs its list in order, a Recv
// waits for its message) with every instruction taking the time it took in that step (compute
// ops, postings of sends and receives) instead of per-stage means. Its bubble differs from the
// measured one only by what no event records (bookkeeping between instructions); the gap
// between the replay and the mean-cost prediction is the cost of op times varying within a
// step (and with what the other rank does at the same time).
double replay_bubble(ts::Schedule const& s, ts::Timeline const& tl, Messages const& msg,
                     double recv_overhead) {
  std::map<std::tuple<int, int, int, int>, std::vector<double>> took; // (rank, op, mb, chunk)
  for (auto const& e : tl.events)
    took[{e.rank, int(e.op), e.microbatch, e.chunk}].push_back(e.duration());
  auto const recv = receives(s, tl);
  auto const partner = ts::detail::match_messages(
      s, [](int, int) { return true; }, [](ts::detail::Site) {});
  int const p = s.stages;
  std::vector<double> now(static_cast<std::size_t>(p), 0.0);
  std::vector<std::vector<double>> arrival(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r)
    arrival[r].assign(s.ranks[r].size(), 0.0);
  ts::Timeline out;
  out.ranks = p;
  ts::detail::execute(s, partner, false, [&](int r, int i) {
    ts::Instruction const& in = s.ranks[r][i];
    auto const& d = took[{r, int(in.op), in.microbatch, in.chunk}];
    double const t = now[r];
    double end = t + (d.empty() ? 0.0 : d.front());
    if (ts::is_send(in.op)) {
      arrival[r][i] = end + msg.alpha + msg.beta * msg.bytes;
    } else if (ts::is_recv(in.op)) {
      // Its own work where the data was there, else the step's typical receive overhead.
      auto it = recv.find({r, int(in.op), in.microbatch, in.chunk});
      double const own = it != recv.end() && it->second.data_there
                             ? it->second.post + it->second.wait
                             : recv_overhead;
      ts::detail::Site const from = partner[r][i];
      end = std::max(t, arrival[from.rank][from.index]) + own;
    }
    out.events.push_back({r, in.op, in.microbatch, in.chunk, t, end});
    now[r] = end;
  });
  return ts::analyze(out).bubble_fraction;
}

// What one schedule measured over its traced steps.
struct Record {
  std::string name;
  std::vector<double> step_s, bubble, makespan, busy;
  std::vector<std::vector<double>> rank_busy; // per step
  std::vector<double> step_pred; // per step: the bubble predicted from that step's own op times
  std::vector<double> replay;    // per step: replay_bubble()
  std::vector<ts::Timeline> timelines;
  OpTimes ops;                   // op durations over all steps
  std::vector<OpTimes> step_ops; // per step
  // per rank and step: receive waits, posting of sends and receives, time between events
  std::vector<std::vector<double>> waits, posts, gaps;
};

void record_step(Record& rec, ts::Schedule const& s, ts::Timeline const& tl, double step_s,
                 Messages const& msg) {
  auto const st = ts::analyze(tl);
  rec.step_s.push_back(step_s);
  rec.bubble.push_back(st.bubble_fraction);
  rec.makespan.push_back(st.makespan);
  rec.busy.push_back(std::accumulate(st.busy.begin(), st.busy.end(), 0.0));
  rec.rank_busy.push_back(st.busy);
  int const p = s.stages;
  rec.waits.resize(std::size_t(p));
  rec.gaps.resize(std::size_t(p));
  struct PerRank {
    double wait = 0, post = 0, busy = 0, lo = 1e300, hi = -1e300;
  };
  std::vector<PerRank> pr(static_cast<std::size_t>(p));
  OpTimes ops;
  for (auto const& e : tl.events) {
    PerRank& q = pr[static_cast<std::size_t>(e.rank)];
    q.lo = std::min(q.lo, e.start);
    q.hi = std::max(q.hi, e.end);
    if (ts::is_compute(e.op)) {
      q.busy += e.duration();
      int const vs = e.op == ts::Op::OptimizerStep ? -1 : s.virtual_stage(e.rank, e.chunk);
      ops[{vs, int(e.op)}].push_back(e.duration());
    } else if (ts::is_send(e.op)) {
      ops[{-2, int(ts::Op::SendActivation)}].push_back(e.duration()); // posting
      q.post += e.duration();
    }
  }
  // Receive overhead: the whole receive (posting and "wait") where the data was there; the
  // posting alone where it was not (the wait then mixes waiting and copying).
  std::vector<double> there, not_there;
  for (auto const& [k, r] : receives(s, tl)) {
    PerRank& q = pr[static_cast<std::size_t>(std::get<0>(k))];
    if (r.data_there) {
      there.push_back(r.post + r.wait);
      q.post += r.post + r.wait;
    } else {
      not_there.push_back(r.post);
      q.post += r.post;
      q.wait += r.wait;
    }
  }
  ops[{-2, int(ts::Op::RecvActivation)}] = there.empty() ? not_there : there;
  rec.posts.resize(std::size_t(p));
  for (int r = 0; r < p; ++r) {
    PerRank const& q = pr[static_cast<std::size_t>(r)];
    rec.waits[r].push_back(q.wait);
    rec.posts[r].push_back(q.post);
    rec.gaps[r].push_back(q.hi > q.lo ? q.hi - q.lo - q.busy - q.wait - q.post : 0);
  }
  rec.step_pred.push_back(ts::simulate(s, cost_model(ops, s, msg)).bubble_fraction);
  rec.step_ops.push_back(ops);
  rec.replay.push_back(replay_bubble(s, tl, msg, mean(ops[{-2, int(ts::Op::RecvActivation)}])));
  for (auto const& [key, v] : ops)
    rec.ops[key].insert(rec.ops[key].end(), v.begin(), v.end());
  rec.timelines.push_back(tl);
}

void merge(Record& to, Record const& from) {
  auto app = [](std::vector<double>& a, std::vector<double> const& b) {
    a.insert(a.end(), b.begin(), b.end());
  };
  app(to.step_s, from.step_s);
  app(to.bubble, from.bubble);
  app(to.makespan, from.makespan);
  app(to.busy, from.busy);
  to.rank_busy.insert(to.rank_busy.end(), from.rank_busy.begin(), from.rank_busy.end());
  app(to.step_pred, from.step_pred);
  app(to.replay, from.replay);
  to.timelines.insert(to.timelines.end(), from.timelines.begin(), from.timelines.end());
  to.step_ops.insert(to.step_ops.end(), from.step_ops.begin(), from.step_ops.end());
  for (auto const& [key, v] : from.ops)
    app(to.ops[key], v);
  to.waits.resize(from.waits.size());
  to.posts.resize(from.posts.size());
  to.gaps.resize(from.gaps.size());
  for (std::size_t r = 0; r < from.waits.size(); ++r) {
    app(to.waits[r], from.waits[r]);
    app(to.posts[r], from.posts[r]);
    app(to.gaps[r], from.gaps[r]);
  }
}

// Op times of a typical step: for each (virtual stage, op), the median over steps of the step's
// mean (robust against steps a busy machine slowed down, like the median bubble it is compared
// with).
OpTimes typical(Record const& rec) {
  OpTimes out;
  std::map<std::pair<int, int>, std::vector<double>> per_step;
  for (auto const& ops : rec.step_ops)
    for (auto const& [key, v] : ops)
      per_step[key].push_back(mean(v));
  for (auto const& [key, v] : per_step)
    out[key] = {median(v)};
  return out;
}

template <std::size_t K>
int run(Args const& a) {
  using Layers = decltype(mlp_layers(0, 0, std::make_index_sequence<K>{}));
  using Model = typename SequentialOf<Layers>::type;
  using Strategy = telar::Strategy<telar::PipelineParallel<>>;
  using Trainer = telar::Trainer<Model, Strategy, telar::SGD<float>>;
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  bool const root = rank == 0;

  std::vector<std::unique_ptr<Trainer>> trainers;
  std::vector<Record> recs;
  for (auto const& name : a.schedules) {
    telar::TrainerOptions opts;
    opts.seed = 1;
    opts.grid = {1, world, 1};
    opts.microbatches = a.microbatches;
    opts.schedule = name;
    opts.chunks = a.chunks;
    opts.trace = true;
    opts.lr = telar::constant_lr(1e-3);
    trainers.push_back(std::make_unique<Trainer>(
        MPI_COMM_WORLD,
        std::make_from_tuple<Model>(mlp_layers(a.in, a.hidden, std::make_index_sequence<K>{})),
        telar::SGD<float>{}, opts, a.in));
    recs.emplace_back();
    recs.back().name = name;
  }

  telar::Matrix<float> x("x", a.batch, a.in);
  telar::Labels<> y("y", a.batch);
  auto hx = Kokkos::create_mirror_view(x);
  auto hy = Kokkos::create_mirror_view(y);
  for (std::size_t i = 0; i < a.batch; ++i) {
    hy(i) = int(i % 10);
    for (std::size_t j = 0; j < a.in; ++j)
      hx(i, j) = float((i * a.in + j) % 97) / 97.f - 0.5f;
  }
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(y, hy);

  auto timed_step = [&](Trainer& tr) {
    MPI_Barrier(MPI_COMM_WORLD); // steps start together; the slowest rank sets the time
    double const t0 = MPI_Wtime();
    tr.step(x, y);
    double dt = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return dt;
  };

  // Configuration: boundaries and forward FLOPs per virtual stage.
  if (root) {
    char const* threads = std::getenv("OMP_NUM_THREADS");
    std::printf("# bench_pipeline: MLP %zu-%zu x%zu-10 (%zu layers), fp32, SGD, gemm %s, "
                "batch %zu in %d micro-batches of %zu, pp = %d ranks, OMP_NUM_THREADS=%s, "
                "%d warm-up steps, then %d rounds x %d traced steps per schedule\n",
                a.in, a.hidden, K + 1, Model::size,
                telar::gemm_backend_name<float, telar::DefaultMemorySpace>(), a.batch,
                a.microbatches, a.batch / std::size_t(a.microbatches), world,
                threads ? threads : "unset", a.warmup, a.rounds, a.steps);
    std::vector<std::string> seen;
    for (auto const& t : trainers) {
      auto const& b = t->stage_boundaries();
      std::string key;
      for (auto v : b)
        key += std::to_string(v) + " ";
      if (std::find(seen.begin(), seen.end(), key) != seen.end())
        continue;
      seen.push_back(key);
      std::vector<double> lf;
      auto const& feats = t->feature_sizes();
      t->model().for_each_layer([&](auto index, auto const& layer) {
        using L = std::decay_t<decltype(layer)>;
        double f = 0;
        if constexpr (telar::detail::is_detected_v<telar::detail::flops_t, L>)
          f = layer.flops(a.batch, feats[index]);
        lf.push_back(f);
      });
      std::printf("# %d virtual stages, layer boundaries [%s]; forward GFLOP per batch by "
                  "virtual stage:",
                  int(b.size()) - 1, key.c_str());
      for (std::size_t v = 0; v + 1 < b.size(); ++v)
        std::printf(" %.3f",
                    std::accumulate(lf.begin() + long(b[v]), lf.begin() + long(b[v + 1]), 0.0) *
                        1e-9);
      std::printf("\n");
    }
  }

  for (int s = 0; s < a.warmup; ++s)
    for (auto& t : trainers)
      timed_step(*t);
  for (auto& t : trainers)
    t->clear_trace();

  // Message costs over the pipeline communicator (all boundaries carry H features).
  std::size_t const mb_rows = a.batch / std::size_t(a.microbatches);
  Messages msg;
  std::tie(msg.alpha, msg.beta) = ping_pong(trainers.front()->grid()->pp(), mb_rows * a.hidden);
  msg.bytes = double(mb_rows * a.hidden * sizeof(float));
  if (root)
    std::printf("# ping-pong over the pipeline communicator: alpha %.1f us, beta %.3f us/KiB "
                "(one %.0f KiB activation message: %.1f us)\n",
                msg.alpha * 1e6, msg.beta * 1e6 * 1024, msg.bytes / 1024,
                (msg.alpha + msg.beta * msg.bytes) * 1e6);

  std::size_t const n = trainers.size();
  std::vector<std::vector<double>> round_median(n); // -1: block dropped
  // A block (one schedule's steps in one round) during which other processes used more than
  // --max-foreign of the machine is dropped; a round counts once all its blocks were clean.
  std::vector<double> loads; // foreign load of every block run
  int const max_rounds = a.max_rounds > 0 ? a.max_rounds : 4 * a.rounds;
  int clean = 0, round = 0;
  std::size_t dropped = 0;
  double budget = a.max_wait, waited = 0;
  for (; round < max_rounds && clean < a.rounds; ++round) {
    bool all_clean = true;
    for (std::size_t k = 0; k < n; ++k) {
      std::size_t const i = (k + std::size_t(round)) % n;
      Record got;
      std::vector<double> mine;
      waited += wait_quiet(a.max_foreign, budget);
      CpuClock const c0 = cpu_clock();
      for (int s = 0; s < a.steps; ++s) {
        double const dt = timed_step(*trainers[i]);
        auto const tl = trainers[i]->pipeline_timeline(true);
        trainers[i]->clear_trace();
        record_step(got, trainers[i]->pipeline_schedule(), tl, dt, msg);
        mine.push_back(dt);
      }
      double const load = foreign_load(c0, cpu_clock());
      loads.push_back(load);
      bool const ok = load <= a.max_foreign;
      round_median[i].push_back(ok ? median(mine) : -1.0);
      if (ok)
        merge(recs[i], got);
      else
        ++dropped;
      all_clean &= ok;
    }
    clean += all_clean;
  }
  if (root) {
    std::sort(loads.begin(), loads.end());
    std::printf("# %d rounds run, %d without foreign CPU load on any block; %zu of %zu blocks "
                "dropped (other processes above %.0f%% of the machine); foreign load median "
                "%.1f%%, max %.1f%%; %.0f s waited for a quiet machine\n",
                round, clean, dropped, loads.size(), 100 * a.max_foreign, 100 * median(loads),
                100 * loads.back(), waited);
  }
  // ZB-H1 against 1F1B: the two trainers alternate step by step (which goes first alternates
  // too), so both see the same machine; chunks of 10 pairs under foreign load are dropped.
  int zb = -1, ofob = -1;
  for (std::size_t i = 0; i < n; ++i) {
    if (recs[i].name == "zb-h1")
      zb = int(i);
    if (recs[i].name == "1f1b")
      ofob = int(i);
  }
  std::vector<double> pair_ratio, pair_1f1b, pair_zb;
  std::size_t pairs_dropped = 0;
  if (zb >= 0 && ofob >= 0 && a.pairs > 0) {
    Trainer& tz = *trainers[std::size_t(zb)];
    Trainer& to = *trainers[std::size_t(ofob)];
    for (int tries = 0; int(pair_ratio.size()) < a.pairs && tries < 10 * a.pairs; tries += 10) {
      waited += wait_quiet(a.max_foreign, budget);
      CpuClock const c0 = cpu_clock();
      std::vector<double> r, o, z;
      for (int k = 0; k < 10; ++k) {
        double const first = timed_step(k % 2 ? tz : to);
        double const second = timed_step(k % 2 ? to : tz);
        o.push_back(k % 2 ? second : first);
        z.push_back(k % 2 ? first : second);
        r.push_back(o.back() / z.back());
        tz.clear_trace();
        to.clear_trace();
      }
      if (foreign_load(c0, cpu_clock()) > a.max_foreign) {
        pairs_dropped += r.size();
        continue;
      }
      pair_ratio.insert(pair_ratio.end(), r.begin(), r.end());
      pair_1f1b.insert(pair_1f1b.end(), o.begin(), o.end());
      pair_zb.insert(pair_zb.end(), z.begin(), z.end());
    }
  }

  for (auto const& r : recs)
    if (r.step_s.empty()) {
      if (root)
        std::printf("bench_pipeline: every block of %s ran under foreign load; nothing to "
                    "report (raise --max-foreign or --max-rounds)\n",
                    r.name.c_str());
      return 2;
    }
  if (!root)
    return 0;

  // B and W as split by the zb-h1 run, for a cross-prediction of the fused schedules.
  Record const* split_ref = nullptr;
  for (auto const& r : recs)
    if (r.name == "zb-h1")
      split_ref = &r;

  // Predicted: per step, the simulator with that step's mean op times (CostModel as in
  // cost_model()); the median over steps, next to the median measured bubble. "Paired" is the
  // median of the per-step differences.
  std::printf("\n| schedule | measured bubble | predicted | difference | paired difference | "
              "step ms | samples/s |\n|---|---:|---:|---:|---:|---:|---:|\n");
  std::string json = "{\"bench\":\"pipeline\",\"schedules\":[";
  std::vector<ts::SimulationResult> preds; // for the step with the median bubble
  std::vector<std::size_t> median_step;
  for (std::size_t i = 0; i < n; ++i) {
    Record const& rec = recs[i];
    auto const& sched = trainers[i]->pipeline_schedule();
    double const mb = median(rec.bubble), step = median(rec.step_s);
    // The step whose bubble is the median one: its prediction is drawn next to it.
    std::size_t best = 0;
    for (std::size_t k = 0; k < rec.bubble.size(); ++k)
      if (std::abs(rec.bubble[k] - mb) < std::abs(rec.bubble[best] - mb))
        best = k;
    preds.push_back(ts::simulate(sched, cost_model(rec.step_ops[best], sched, msg)));
    median_step.push_back(best);
    double const predicted = median(rec.step_pred);
    std::vector<double> paired;
    for (std::size_t k = 0; k < rec.bubble.size(); ++k)
      paired.push_back(rec.bubble[k] - rec.step_pred[k]);
    std::printf("| %s | %s | %s | %+.1f pp | %+.1f pp | %.2f | %.0f |\n", rec.name.c_str(),
                pct(mb).c_str(), pct(predicted).c_str(), 100 * (mb - predicted),
                100 * median(paired), 1e3 * step, double(a.batch) / step);
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "%s{\"name\":\"%s\",\"bubble\":%.4f,\"predicted\":%.4f,\"step_ms\":%.3f,"
                  "\"samples_per_s\":%.1f,\"steps\":%zu}",
                  i ? "," : "", rec.name.c_str(), mb, predicted, 1e3 * step, double(a.batch) / step,
                  rec.step_s.size());
    json += buf;
    if (!a.svg.empty()) {
      std::string const what =
          " (p=" + std::to_string(sched.stages) + ", m=" + std::to_string(sched.microbatches) +
          (sched.chunks > 1 ? ", v=" + std::to_string(sched.chunks) : "") + ")";
      ts::SvgOptions o;
      o.title = rec.name + what + " measured, bubble " + pct(rec.bubble[best]);
      ts::write_svg(rec.timelines[best], a.svg + "/" + rec.name + "_measured.svg", o);
      o.title = rec.name + what + " predicted from the same step's op times, bubble " +
                pct(preds.back().bubble_fraction);
      ts::write_svg(preds.back().timeline, a.svg + "/" + rec.name + "_predicted.svg", o);
    }
  }

  // The same prediction taken apart.
  std::printf("\nModel checks, measured minus predicted bubble (median over steps): replay = "
              "every instruction with its own measured time; one model for the whole run "
              "(mean op times of the run, or a typical step's: per-op median of step means); "
              "per step without the message overheads; a fused schedule with zb-h1's B and W "
              "(typical step):\n\n"
              "| schedule | replay | run mean | run typical | no overheads | zb-h1's B, W | "
              "pipeline ms measured / predicted (median step) |\n"
              "|---|---:|---:|---:|---:|---:|---:|\n");
  for (std::size_t i = 0; i < n; ++i) {
    Record const& rec = recs[i];
    auto const& sched = trainers[i]->pipeline_schedule();
    double const mb = median(rec.bubble);
    std::vector<double> replay, bare;
    Messages plain = msg;
    plain.overheads = false;
    for (std::size_t k = 0; k < rec.bubble.size(); ++k) {
      replay.push_back(rec.bubble[k] - rec.replay[k]);
      bare.push_back(
          rec.bubble[k] -
          ts::simulate(sched, cost_model(rec.step_ops[k], sched, plain)).bubble_fraction);
    }
    auto pp = [](double d) {
      char b[32];
      std::snprintf(b, sizeof b, "%+.1f pp", 100 * d);
      return std::string(b);
    };
    ts::CostModel const typ = cost_model(typical(rec), sched, msg);
    double const run_mean = ts::simulate(sched, cost_model(rec.ops, sched, msg)).bubble_fraction;
    double const run_typ = ts::simulate(sched, typ).bubble_fraction;
    // A fused schedule predicted with B and W as measured by zb-h1 (same stages).
    std::string cross = "-";
    if (split_ref && split_ref != &rec && sched.chunks == 1) {
      ts::CostModel c2 = typ;
      ts::CostModel const zb = cost_model(typical(*split_ref), sched, msg);
      c2.backward_input = zb.backward_input;
      c2.backward_weight = zb.backward_weight;
      cross = pp(mb - ts::simulate(sched, c2).bubble_fraction);
    }
    std::printf("| %s | %s | %s | %s | %s | %s | %.2f / %.2f |\n", rec.name.c_str(),
                pp(median(replay)).c_str(), pp(mb - run_mean).c_str(), pp(mb - run_typ).c_str(),
                pp(median(bare)).c_str(), cross.c_str(), 1e3 * rec.makespan[median_step[i]],
                1e3 * preds[i].makespan);
  }
  json += "]";

  for (std::size_t i = 0; i < n; ++i) {
    Record const& rec = recs[i];
    if (rec.name != a.dump)
      continue;
    auto const& sched = trainers[i]->pipeline_schedule();
    double const mb = median(rec.bubble);
    std::size_t best = 0;
    for (std::size_t k = 0; k < rec.bubble.size(); ++k)
      if (std::abs(rec.bubble[k] - mb) < std::abs(rec.bubble[best] - mb))
        best = k;
    for (std::size_t k = 0; k < rec.bubble.size(); ++k) {
      std::printf("  step %2zu: makespan %.2f ms, busy", k, 1e3 * rec.makespan[k]);
      for (double b : rec.rank_busy[k])
        std::printf(" %.2f", 1e3 * b);
      std::printf(" ms, bubble %s, predicted from its mean op times %s, replayed %s\n",
                  pct(rec.bubble[k]).c_str(), pct(rec.step_pred[k]).c_str(),
                  pct(rec.replay[k]).c_str());
    }
    ts::Timeline const& tl = rec.timelines[best];
    auto const sim = ts::simulate(sched, cost_model(rec.step_ops[best], sched, msg));
    double const t0 = ts::analyze(tl).start;
    std::printf("\n%s, step with the median bubble: measured vs simulated with its own op times "
                "(ms from the first event)\n",
                rec.name.c_str());
    for (int r = 0; r < sched.stages; ++r) {
      std::vector<ts::Event> me, se;
      for (auto const& e : tl.events)
        if (e.rank == r)
          me.push_back(e);
      for (auto const& e : sim.timeline.events)
        if (e.rank == r && (ts::is_compute(e.op) || e.duration() > 0))
          se.push_back(e);
      for (auto const& e : me) {
        double ss = -1, se_end = -1;
        for (auto const& f : se)
          if (f.op == e.op && f.microbatch == e.microbatch && f.chunk == e.chunk) {
            ss = f.start;
            se_end = f.end;
          }
        std::printf("  r%d %-14s mb %d c %d  measured %8.3f - %8.3f  simulated %8.3f - %8.3f  "
                    "lag %+.3f\n",
                    r, ts::to_string(e.op).c_str(), e.microbatch, e.chunk, 1e3 * (e.start - t0),
                    1e3 * (e.end - t0), 1e3 * ss, 1e3 * se_end, 1e3 * (e.start - t0 - ss));
      }
    }
  }

  // Where the time goes.
  std::printf("\nOp times of a typical step (ms; per virtual stage, median over steps of the "
              "step's mean), optimizer step, send and receive overheads (us); per rank and step "
              "(median, ms): waiting for messages, message overheads, and time between "
              "recorded events:\n");
  for (std::size_t i = 0; i < n; ++i) {
    Record const& rec = recs[i];
    auto const& sched = trainers[i]->pipeline_schedule();
    OpTimes const t = typical(rec);
    auto get = [&](int vs, ts::Op op) {
      auto it = t.find({vs, int(op)});
      return it == t.end() ? 0.0 : it->second.front();
    };
    std::printf("  %-12s", rec.name.c_str());
    for (int vs = 0; vs < sched.virtual_stages(); ++vs) {
      double const f = get(vs, ts::Op::Forward), b = get(vs, ts::Op::Backward);
      if (b > 0)
        std::printf(" vs%d F %.3f B+W %.3f |", vs, 1e3 * f, 1e3 * b);
      else
        std::printf(" vs%d F %.3f B %.3f W %.3f |", vs, 1e3 * f,
                    1e3 * get(vs, ts::Op::BackwardInput), 1e3 * get(vs, ts::Op::BackwardWeight));
    }
    std::printf(" opt %.3f | send %.1f recv %.1f |", 1e3 * get(-1, ts::Op::OptimizerStep),
                1e6 * get(-2, ts::Op::SendActivation), 1e6 * get(-2, ts::Op::RecvActivation));
    for (std::size_t r = 0; r < rec.waits.size(); ++r)
      std::printf(" r%zu wait %.3f post %.3f gaps %.3f", r, 1e3 * median(rec.waits[r]),
                  1e3 * median(rec.posts[r]), 1e3 * median(rec.gaps[r]));
    std::printf("\n");
  }

  // ZB-H1 against 1F1B: step-time medians of the two blocks of one round, and the alternating
  // pairs.
  if (zb >= 0 && ofob >= 0) {
    std::vector<double> ratios;
    std::printf("\nZB-H1 / 1F1B throughput per round:");
    for (std::size_t r = 0; r < round_median[zb].size(); ++r)
      if (round_median[zb][r] > 0 && round_median[ofob][r] > 0) {
        ratios.push_back(round_median[ofob][r] / round_median[zb][r]);
        std::printf(" %.3f", ratios.back());
      }
    std::printf("; median %.3f over %zu rounds\n", median(ratios), ratios.size());
    if (!pair_ratio.empty()) {
      std::vector<double> sorted = pair_ratio;
      std::sort(sorted.begin(), sorted.end());
      double const q1 = sorted[sorted.size() / 4], q3 = sorted[3 * sorted.size() / 4];
      std::printf("ZB-H1 / 1F1B throughput, %zu alternating pairs (%zu dropped under foreign "
                  "load): median of the pair ratios %.3f (quartiles %.3f .. %.3f); median step "
                  "1F1B %.2f ms, ZB-H1 %.2f ms, ratio %.3f\n",
                  pair_ratio.size(), pairs_dropped, median(pair_ratio), q1, q3,
                  1e3 * median(pair_1f1b), 1e3 * median(pair_zb),
                  median(pair_1f1b) / median(pair_zb));
      char buf[64];
      std::snprintf(buf, sizeof buf, ",\"zb_h1_over_1f1b\":%.4f", median(pair_ratio));
      json += buf;
    }
  }
  if (a.json)
    std::printf("%s}\n", json.c_str());
  return 0;
}

template <std::size_t... K>
int dispatch(Args const& a, std::index_sequence<K...>) {
  int rc = -1;
  ((a.blocks == int(K) ? (rc = run<K>(a), 0) : 0), ...);
  if (rc < 0)
    throw std::invalid_argument("bench_pipeline: --blocks must be one of 1, 3, 5, 7, 11, 15");
  return rc;
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      rc = dispatch(parse(argc, argv), std::index_sequence<1, 3, 5, 7, 11, 15>{});
    } catch (std::exception const& e) {
      std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
      rc = 1;
    }
  }
  MPI_Finalize();
  return rc;
}
