#pragma once
/*! \file
 *  \brief Per-rank timeline of training phases, written as Chrome trace JSON
 *  (open it in https://ui.perfetto.dev or chrome://tracing). */
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace telar {

/*! \brief One timed interval on a rank. */
struct TraceEvent {
  std::string name;     //!< e.g. "F3", "allreduce bucket 0"
  std::string category; //!< "forward", "backward", "comm", "optimizer", ...
  double start = 0;     //!< seconds since the recorder's origin
  double end = 0;       //!< seconds since the recorder's origin
  int lane = 0;         //!< row within the rank (0: compute, 1: communication)
};

/*! \brief Records intervals on one rank. Disabled recorders cost a branch. */
class TraceRecorder {
public:
  /*! \brief \param enabled record at all */
  explicit TraceRecorder(bool enabled = false)
      : enabled_(enabled), origin_(std::chrono::steady_clock::now()) {}

  /*! \brief Restarts the clock (call it right after a barrier so that every
   *  rank's times share an origin). */
  void reset_origin() { origin_ = std::chrono::steady_clock::now(); }
  /*! \brief Whether events are recorded. */
  bool enabled() const { return enabled_; }
  /*! \brief Seconds since the origin. */
  double now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - origin_).count();
  }
  /*! \brief Records [start, end). \param name label \param category kind
   *  \param start seconds \param end seconds \param lane row */
  void add(std::string name, std::string category, double start, double end, int lane = 0) {
    if (enabled_)
      events_.push_back({std::move(name), std::move(category), start, end, lane});
  }
  /*! \brief The events so far. */
  std::vector<TraceEvent> const& events() const { return events_; }
  /*! \brief Forgets the events so far. */
  void clear() { events_.clear(); }

  /*! \brief The events as Chrome trace "X" events of process \p pid (no
   *  surrounding brackets), for merging several ranks into one file.
   *  \param pid process id to show (the rank) */
  std::string json_events(int pid) const {
    std::string out;
    char buf[512];
    for (auto const& e : events_) {
      std::snprintf(buf, sizeof buf,
                    "%s{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,"
                    "\"ts\":%.3f,\"dur\":%.3f}",
                    out.empty() ? "" : ",\n", e.name.c_str(), e.category.c_str(), pid, e.lane,
                    e.start * 1e6, (e.end - e.start) * 1e6);
      out += buf;
    }
    return out;
  }

private:
  bool enabled_;
  std::chrono::steady_clock::time_point origin_;
  std::vector<TraceEvent> events_;
};

/*! \brief Writes Chrome trace JSON made of already-encoded event lists.
 *  \param path output file \param event_lists one json_events() string per rank
 *  \return false if the file could not be written */
inline bool write_chrome_trace(std::string const& path,
                               std::vector<std::string> const& event_lists) {
  std::ofstream f(path);
  if (!f)
    return false;
  f << "{\"traceEvents\":[\n";
  bool first = true;
  for (auto const& l : event_lists) {
    if (l.empty())
      continue;
    f << (first ? "" : ",\n") << l;
    first = false;
  }
  f << "\n],\"displayTimeUnit\":\"ms\"}\n";
  return bool(f);
}

} // namespace telar
