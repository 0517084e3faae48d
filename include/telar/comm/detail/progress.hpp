#pragma once
// The one bounded wait of the library, and the progress registry it drives.
//
// Telar's own allreduce algorithms are state machines that only advance when
// someone calls into them. A rank blocked in any wait must still advance
// every operation it has in flight, or a peer waiting on one of them (rather
// than on the one this rank waits for) would deadlock. So every wait polls the
// whole registry, as an MPI library's progress engine does. The registry is
// per process and not thread-safe: Telar communicates from one thread.

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

namespace telar::detail {

// An operation that advances when polled. Host-only orchestration, so a
// virtual interface is fine here.
class Progressable {
public:
  Progressable() = default;
  Progressable(Progressable const&) = delete;
  Progressable& operator=(Progressable const&) = delete;
  virtual ~Progressable() = default;
  // Posts what can be posted, completes what has arrived; returns true when
  // something changed. Never calls back into the registry.
  virtual bool advance() = 0;
  // True once the operation has completed.
  virtual bool finished() const = 0;

  static constexpr std::size_t unregistered = static_cast<std::size_t>(-1);
  std::size_t registry_index = unregistered; // O(1) removal
};

inline std::vector<Progressable*>& progress_registry() {
  static std::vector<Progressable*> registry;
  return registry;
}

inline void register_progress(Progressable* p) {
  auto& r = progress_registry();
  if (p->registry_index != Progressable::unregistered)
    return;
  p->registry_index = r.size();
  r.push_back(p);
}

inline void unregister_progress(Progressable* p) {
  if (p == nullptr || p->registry_index == Progressable::unregistered)
    return;
  auto& r = progress_registry();
  std::size_t const i = p->registry_index;
  r[i] = r.back();
  r[i]->registry_index = i;
  r.pop_back();
  p->registry_index = Progressable::unregistered;
}

// Advances `focus` (the operation being waited on, if any) and a rotating
// window of the other registered operations; drops finished ones. The window
// keeps a poll cheap when many operations are in flight (every advance is an
// MPI call that runs MPI's progress engine), while every operation is still
// advanced every few polls, which is all that freedom from deadlock needs.
inline bool progress_all(Progressable* focus = nullptr) {
  constexpr std::size_t window = 8;
  static std::size_t cursor = 0;
  auto& r = progress_registry();
  bool changed = false;
  Progressable* done[window + 1];
  std::size_t ndone = 0;
  if (focus != nullptr && !focus->finished()) {
    changed |= focus->advance();
    if (focus->finished())
      done[ndone++] = focus;
  }
  std::size_t const n = r.size();
  std::size_t const budget = n < window ? n : window;
  for (std::size_t k = 0; k < budget; ++k) {
    Progressable* p = r[(cursor + k) % n];
    if (p == focus)
      continue;
    changed |= p->advance();
    if (p->finished())
      done[ndone++] = p;
  }
  cursor = n > 0 ? (cursor + budget) % n : 0;
  for (std::size_t k = 0; k < ndone; ++k)
    unregister_progress(done[k]);
  return changed;
}

// Default bound of every wait, from TELAR_COMM_TIMEOUT (seconds; 0 = none).
inline constexpr double default_timeout_seconds = 300.0;

// A wait's periodic check (see wait_until): none.
struct NoWatch {
  void operator()(double) const {}
};
// Seconds a wait lasts before its first watch call, and between calls.
inline constexpr double watch_interval_seconds = 1.0;

// Polls done() until it returns true or timeout_s seconds have passed
// (timeout_s <= 0: no bound), then calls on_timeout(seconds_waited), which
// must throw. Once a second while it waits, watch(seconds_waited) may throw
// too (a lost peer: see liveness.hpp). Each poll advances `focus` and some other in-flight
// operations. Backoff: spin first (latency of short waits), then yield (ranks sharing cores, as
// under oversubscription), and only after a long idle stretch sleep, because a sleeping rank stops
// driving MPI's progress.
template <class Done, class OnTimeout, class Watch = NoWatch>
void wait_until(Done&& done, double timeout_s, OnTimeout&& on_timeout,
                Progressable* focus = nullptr, Watch&& watch = Watch{}) {
  using clock = std::chrono::steady_clock;
  auto const start = clock::now();
  auto last_change = start;
  double next_watch = watch_interval_seconds;
  for (;;) {
    bool const changed = progress_all(focus);
    if (done())
      return;
    auto const now = clock::now();
    if (changed)
      last_change = now;
    double const waited = std::chrono::duration<double>(now - start).count();
    if (timeout_s > 0 && waited >= timeout_s) {
      on_timeout(waited);
      return; // on_timeout is expected to throw
    }
    if (waited >= next_watch) {
      watch(waited);
      next_watch = waited + watch_interval_seconds;
    }
    // Spin while the operation is moving (a pipelined transfer completes a
    // segment every few microseconds: yielding there can cost a whole time
    // slice on a busy machine); yield once idle, so ranks sharing a core can
    // run; sleep only after a long idle stretch.
    auto const idle = now - last_change;
    if (idle < std::chrono::microseconds(200))
      continue;
    if (idle < std::chrono::milliseconds(100))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

} // namespace telar::detail
