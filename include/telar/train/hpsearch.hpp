#pragma once
/*! \file
 *  \brief telar::successive_halving: a hyper-parameter search that trains
 *  configurations side by side on groups of ranks. */
#include <telar/comm/communicator.hpp>
#include <telar/core/error.hpp>
#include <telar/train/detail/hpsearch_exchange.hpp>
#include <telar/train/detail/hpsearch_queue.hpp>
#include <telar/train/detail/hpsearch_report.hpp>
#include <telar/train/json.hpp>
#include <telar/train/search_space.hpp>
#include <telar/train/trial.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace telar {

/*! \brief One round of a search, as every rank saw it at the round's end. */
struct RoundSummary {
  int round = 0;          //!< 0-based
  int rounds = 0;         //!< rounds planned
  int configurations = 0; //!< configurations trained this round
  long long budget = 0;   //!< steps each trained
  int failed = 0;         //!< of which diverged or failed
  double seconds = 0;     //!< wall time of the round (this rank, waiting for the others included)
};

/*! \brief Settings of telar::successive_halving. */
struct HalvingOptions {
  int groups =
      1;       //!< equal groups of world / groups ranks, each training one configuration at a time
  int eta = 2; //!< each round keeps the best 1/eta and trains them eta times longer
  int rounds = 0;         //!< rounds (0: until one configuration is left)
  long long budget = 100; //!< steps per configuration in the first round
  std::uint64_t seed = 0; //!< handed to every configuration's training (Trial::seed())
  /*! \brief Seconds a group may wait for the others at a round's end (0: no
   *  bound). Rounds last as long as their slowest group, which may be far
   *  longer than TELAR_COMM_TIMEOUT, so unbounded by default. */
  double round_timeout = 0;
  /*! \brief How a round's configurations reach the groups. Dynamic (the
   *  default): a group that finishes one takes the next that nobody has
   *  started (a shared counter, MPI-3 fetch-and-add on rank 0), so no group
   *  idles while another has several left; which group trains what then
   *  depends on timing, the results do not. Static: round-robin by id. */
  bool dynamic = true;
  /*! \brief Called on every rank after each round (progress output). */
  std::function<void(RoundSummary const&)> on_round;
};

/*! \brief What a search found: the leaderboard, best first, on every rank. */
struct SearchResult {
  std::vector<TrialRecord> leaderboard; //!< survivors of the last round first, then by round
                                        //!< reached and validation loss; diverged and failed last
  std::vector<RoundSummary> rounds;     //!< one per round run
  HalvingOptions options;               //!< the settings (on_round dropped)
  int group_size = 1;                   //!< ranks per group
  double wall_seconds = 0;              //!< wall time of the whole search (this rank)

  /*! \brief Wall time of every configuration in every round, summed: about
   *  the search run one configuration after another on one group, where the
   *  groups do not slow each other down (they share no cores). */
  double trial_seconds() const {
    double s = 0;
    for (auto const& r : leaderboard)
      s += r.seconds;
    return s;
  }
  /*! \brief The leaderboard as a text table (rank, config, val loss, val
   *  accuracy, steps, seconds, status). */
  std::string table() const { return detail::leaderboard_table(leaderboard); }
  /*! \brief Settings, rounds and leaderboard as one JSON object. */
  std::string json() const {
    JsonObject search;
    search.add("configurations", (long long)leaderboard.size())
        .add("groups", options.groups)
        .add("group_size", group_size)
        .add("eta", options.eta)
        .add("assignment", options.dynamic && options.groups > 1 ? "dynamic" : "static")
        .add("first_budget", options.budget)
        .add("seed", (long long)options.seed)
        .add("wall_seconds", wall_seconds)
        .add("trial_seconds", trial_seconds());
    std::vector<std::string> rs, board;
    for (auto const& r : rounds)
      rs.push_back(JsonObject()
                       .add("round", r.round + 1)
                       .add("configurations", r.configurations)
                       .add("budget", r.budget)
                       .add("failed", r.failed)
                       .add("seconds", r.seconds)
                       .str());
    for (std::size_t i = 0; i < leaderboard.size(); ++i)
      board.push_back(detail::json_record(leaderboard[i], i + 1));
    return JsonObject()
        .add("search", search)
        .raw("rounds", detail::json_array(rs))
        .raw("leaderboard", detail::json_array(board))
        .str();
  }
  /*! \brief Writes json() to \p path. \param path output file
   *  \throws Error naming the file when it cannot be written */
  void write_json(std::string const& path) const {
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::string const text = json() + "\n";
    bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (f != nullptr)
      ok = std::fclose(f) == 0 && ok;
    if (!ok)
      throw Error("telar::SearchResult::write_json: cannot write " + path);
  }
};

namespace detail {

// Rounds until one configuration is left: 8 with eta 2 -> 8, 4, 2, 1 = 4.
inline int halving_rounds(std::size_t n, int eta) {
  int r = 1;
  for (; n > 1; ++r)
    n = std::max<std::size_t>(1, n / std::size_t(eta));
  return r;
}

// The same arguments on every rank, so the same verdict: no message needed.
inline void check_search(int world, std::size_t n, HalvingOptions const& o) {
  std::string const api = "telar::successive_halving: ";
  if (n == 0)
    throw Error(api + "no configurations to search");
  if (o.groups < 1 || world % o.groups != 0)
    throw Error(api + std::to_string(world) + " ranks cannot be split into " +
                std::to_string(o.groups) + " equal groups; pick a divisor of " +
                std::to_string(world));
  if (o.eta < 2)
    throw Error(api + "eta must be at least 2, got " + std::to_string(o.eta));
  if (o.budget < 1 || o.rounds < 0)
    throw Error(api + "the first budget must be at least one step and rounds at least 0 (got " +
                std::to_string(o.budget) + " steps, " + std::to_string(o.rounds) + " rounds)");
  double const last = double(o.budget) * std::pow(double(o.eta), std::max(o.rounds, 1) - 1);
  if (last > 1e15)
    throw Error(api + "the last round's budget overflows: lower rounds, eta or the budget");
}

// Positions in a round's list of configurations for this group: round-robin,
// or drawn from the shared counter by the group's leader and broadcast to the
// group. Every group draws once past the end, so each round moves the
// counter by (configurations + groups) and every rank knows where it starts.
class Dealer {
public:
  // drawn: the counter's value at the round's start, moved to the next round's.
  Dealer(HalvingOptions const& o, int gid, Communicator const& group, WorkCounter* counter,
         std::size_t n, long long& drawn)
      : group_(group), counter_(counter), n_(n), stride_(std::size_t(o.groups)),
        next_(std::size_t(gid)), base_(drawn) {
    drawn += (long long)(n + stride_);
  }
  std::size_t next() {
    if (counter_ == nullptr) {
      std::size_t const i = next_;
      next_ += stride_;
      return i;
    }
    long long k = group_.rank() == 0 ? counter_->next() - base_ : 0;
    if (group_.size() > 1)
      group_.broadcast(&k, 1, 0);
    return std::size_t(std::min<long long>(k, (long long)n_));
  }

private:
  Communicator const& group_;
  WorkCounter* counter_;
  std::size_t n_, stride_, next_;
  long long base_;
};

// One configuration trained by one group; every rank of the group returns
// the same result. Errors become a status and a reason, never an exception.
template <class Train>
RoundResult run_trial(Communicator const& group, int group_id, HyperParams const& config, int id,
                      int round, long long budget, std::uint64_t seed, Train& train) {
  auto const t0 = std::chrono::steady_clock::now();
  RoundResult r;
  r.id = id;
  r.group = group_id;
  // A communicator of its own: a collective left pending by a rank that gave
  // up on a partner must not match the agreement below or the next trial's.
  Communicator const work = group.dup("telar::hpsearch/trial");
  try {
    TrialOutcome const out = train(Trial(work.native(), config, id, round, budget, seed));
    r.val_loss = out.val_loss;
    r.val_accuracy = out.val_accuracy;
    r.steps = out.steps;
    if (!std::isfinite(out.val_loss))
      throw DivergedError(0, out.val_loss);
  } catch (DivergedError const& e) {
    r.status = TrialStatus::diverged;
    r.reason = e.what();
    r.steps = e.step() > 0 ? e.step() : r.steps;
  } catch (NonFiniteError const& e) { // the Trainer's own check (NonFinite::stop)
    r.status = TrialStatus::diverged;
    r.reason = std::string("diverged: ") + e.what();
  } catch (std::exception const& e) {
    r.status = TrialStatus::failed;
    r.reason = e.what();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return agree_in_group(group, r);
}

// A round's results into the records.
inline void record_round(std::vector<TrialRecord>& recs, std::vector<RoundResult> const& results,
                         int round) {
  for (auto const& r : results) {
    TrialRecord& t = recs[std::size_t(r.id)];
    t.status = r.status;
    t.reason = r.reason;
    t.val_loss = r.val_loss;
    t.val_accuracy = r.val_accuracy;
    t.steps = r.steps;
    t.rounds = round + 1;
    t.seconds += r.seconds;
    t.group = r.group;
  }
}

// The best max(1, trained / eta) of this round's configurations go on (by
// validation loss, then id); the others that trained are stopped. Returns
// the survivors by id.
inline std::vector<int> promote(std::vector<TrialRecord>& recs, std::vector<int> const& trained,
                                int round, int eta) {
  std::vector<int> ok;
  for (int id : trained)
    if (recs[std::size_t(id)].status == TrialStatus::finished)
      ok.push_back(id);
  std::sort(ok.begin(), ok.end(), [&](int a, int b) {
    auto const &x = recs[std::size_t(a)], &y = recs[std::size_t(b)];
    return x.val_loss != y.val_loss ? x.val_loss < y.val_loss : a < b;
  });
  std::size_t const keep =
      std::min(ok.size(), std::max<std::size_t>(1, trained.size() / std::size_t(eta)));
  for (std::size_t i = keep; i < ok.size(); ++i) {
    TrialRecord& t = recs[std::size_t(ok[i])];
    t.status = TrialStatus::stopped;
    t.reason = "stopped after round " + std::to_string(round + 1);
  }
  ok.resize(keep);
  std::sort(ok.begin(), ok.end());
  return ok;
}

inline RoundSummary summarize(std::vector<RoundResult> const& results, int round, int rounds,
                              std::size_t trained, long long budget,
                              std::chrono::steady_clock::time_point start) {
  RoundSummary s;
  s.round = round;
  s.rounds = rounds;
  s.configurations = int(trained);
  s.budget = budget;
  for (auto const& r : results)
    s.failed += r.status != TrialStatus::finished;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return s;
}

// The configurations, all alive, none trained yet.
inline std::vector<TrialRecord> initial_records(std::vector<HyperParams> const& configs) {
  std::vector<TrialRecord> recs(configs.size());
  for (std::size_t i = 0; i < configs.size(); ++i) {
    recs[i].id = int(i);
    recs[i].config = configs[i];
  }
  return recs;
}

// Best first: by round reached, then validation loss; failures last, by id.
inline std::vector<TrialRecord> ranked(std::vector<TrialRecord> recs) {
  auto key = [](TrialRecord const& r) { return has_result(r) ? -r.rounds : 1; };
  std::stable_sort(recs.begin(), recs.end(), [&](TrialRecord const& a, TrialRecord const& b) {
    if (key(a) != key(b))
      return key(a) < key(b);
    if (has_result(a) && a.val_loss != b.val_loss)
      return a.val_loss < b.val_loss;
    return a.id < b.id;
  });
  return recs;
}

} // namespace detail

/*! \brief Successive halving over groups of ranks (collective over \p comm).
 *
 *  The world is split into options.groups groups of equal size (consecutive
 *  ranks). Round r trains each surviving configuration for budget * eta^r
 *  steps, from scratch, and keeps the best 1/eta by validation loss. A group
 *  done with a configuration takes the round's next one that nobody has
 *  started (HalvingOptions::dynamic; else round-robin by id), without
 *  waiting for the other groups; the round ends with one exchange over the
 *  world, where the halving needs every result. Retraining from scratch makes each result a
 * function of the configuration and the budget alone, so the leaderboard does not depend on the
 * number of groups or on timing (bit for bit at a given group size; to rounding across group sizes,
 * whose degrees differ).
 *
 *  A configuration whose loss is not finite (Trial::check(), or the returned
 *  validation loss) is recorded as diverged, one that throws (a layout that
 *  does not fit, ...) as failed with the exception's text; both rank last
 *  and the group goes on with its next configuration.
 *
 *  \code
 *  telar::SearchSpace space;
 *  space.add("lr", {"1e-3", "1e-2"}).add("optimizer", {"sgd", "adamw"});
 *  telar::HalvingOptions opts;
 *  opts.groups = 2;
 *  opts.budget = 50;
 *  auto result = telar::successive_halving(comm, space.grid(), opts,
 *      [&](telar::Trial const& trial) {
 *        Trainer trainer(trial.comm(), make_model(), make_optimizer(trial.config()), ...);
 *        for (long long s = 1; s <= trial.budget(); ++s)
 *          trial.check(s, trainer.step(x, y).loss);
 *        auto v = trainer.evaluate(val_x, val_y);
 *        return telar::TrialOutcome{v.loss, v.accuracy, trial.budget()};
 *      });
 *  if (rank == 0) std::fputs(result.table().c_str(), stdout);
 *  \endcode
 *
 *  \param comm the ranks taking part (duplicated, never used directly)
 *  \param configs the configurations (id = position)
 *  \param options groups, eta, rounds, first budget, seed
 *  \param train called by every rank of a group with a telar::Trial; returns
 *  a telar::TrialOutcome
 *  \return the leaderboard, the same on every rank
 *  \throws Error, identically on every rank, when the options do not fit the world */
template <class Train>
SearchResult successive_halving(MPI_Comm comm, std::vector<HyperParams> const& configs,
                                HalvingOptions options, Train&& train) {
  static_assert(std::is_invocable_r_v<TrialOutcome, Train&, Trial const&>,
                "telar::successive_halving: train must be callable as "
                "TrialOutcome(telar::Trial const&)");
  auto const t0 = std::chrono::steady_clock::now();
  Communicator world(comm, "telar::hpsearch");
  detail::check_search(world.size(), configs.size(), options);
  int const group_size = world.size() / options.groups, gid = world.rank() / group_size;
  Communicator group =
      world.split(gid, world.rank(), "telar::hpsearch/group" + std::to_string(gid));
  world.set_timeout(options.round_timeout); // from here on it only waits at rounds' ends
  // The group agrees after each configuration: a rank that failed alone
  // waits there for partners still in a Trainer collective until their own
  // bounded wait (TELAR_COMM_TIMEOUT) gives up, so this wait is unbounded.
  group.set_timeout(0);
  std::optional<detail::WorkCounter> counter;
  long long drawn = 0; // the counter's value at a round's start
  if (options.dynamic && options.groups > 1)
    counter.emplace(world);
  int const rounds =
      options.rounds > 0 ? options.rounds : detail::halving_rounds(configs.size(), options.eta);

  std::vector<TrialRecord> recs = detail::initial_records(configs);
  std::vector<int> alive(configs.size());
  for (std::size_t i = 0; i < alive.size(); ++i)
    alive[i] = int(i);
  SearchResult result;
  long long budget = options.budget;
  for (int round = 0; round < rounds && !alive.empty(); ++round, budget *= options.eta) {
    auto const r0 = std::chrono::steady_clock::now();
    std::vector<detail::RoundResult> mine;
    detail::Dealer deal(options, gid, group, counter ? &*counter : nullptr, alive.size(), drawn);
    for (std::size_t i; (i = deal.next()) < alive.size();) {
      int const id = alive[i];
      auto r = detail::run_trial(group, gid, configs[std::size_t(id)], id, round, budget,
                                 options.seed, train);
      if (group.rank() == 0)
        mine.push_back(std::move(r));
    }
    auto const results = detail::gather_round(world, mine);
    detail::record_round(recs, results, round);
    RoundSummary const s = detail::summarize(results, round, rounds, alive.size(), budget, r0);
    alive =
        round + 1 < rounds ? detail::promote(recs, alive, round, options.eta) : std::vector<int>{};
    result.rounds.push_back(s);
    if (options.on_round)
      options.on_round(s);
  }
  options.on_round = nullptr;
  result.leaderboard = detail::ranked(std::move(recs));
  result.options = options;
  result.group_size = group_size;
  result.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

} // namespace telar
