#pragma once
/*! \file
 *  \brief Progress display for long runs: a bar on a terminal, plain lines
 *  otherwise (logs, CI, batch jobs). */
#include <chrono>
#include <cstdio>
#include <string>

#include <unistd.h>

namespace telar {

/*! \brief Shows how far a loop of \p total steps has come.
 *
 *  On a terminal it redraws one line with a bar, the percentage, the latest
 *  metrics and the rate; elsewhere it prints a plain line at every tenth of
 *  the way (and at the end), so logs stay readable. Disabled instances print
 *  nothing (ranks other than 0).
 */
class ProgressBar {
public:
  /*! \brief \param label what is progressing (e.g. "epoch 1/3")
   *  \param total number of steps \param enabled print at all
   *  \param out stream (stderr by default) */
  ProgressBar(std::string label, long long total, bool enabled = true, std::FILE* out = stderr)
      : label_(std::move(label)), total_(total > 0 ? total : 1), enabled_(enabled), out_(out),
        tty_(enabled && isatty(fileno(out))), start_(std::chrono::steady_clock::now()) {}

  /*! \brief Reports \p done steps finished. \param done steps so far
   *  \param metrics short text after the bar, e.g. "loss 0.41 acc 0.86"
   *  \param items_per_step samples per step, for the rate */
  void update(long long done, std::string const& metrics = "", double items_per_step = 0) {
    if (!enabled_)
      return;
    double const elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    double const frac = double(done) / double(total_);
    std::string rate;
    if (items_per_step > 0 && elapsed > 0) {
      char buf[64];
      std::snprintf(buf, sizeof buf, " %.0f samples/s", done * items_per_step / elapsed);
      rate = buf;
    }
    if (tty_) {
      int const width = 30, fill = int(frac * width + 0.5);
      std::string bar(std::size_t(fill), '#');
      bar.resize(width, '.');
      std::fprintf(out_, "\r%s [%s] %3.0f%% %s%s\033[K", label_.c_str(), bar.c_str(), 100 * frac,
                   metrics.c_str(), rate.c_str());
      if (done >= total_)
        std::fputc('\n', out_);
      std::fflush(out_);
    } else {
      int const tenth = int(frac * 10);
      if (tenth > last_tenth_ || done >= total_) {
        last_tenth_ = tenth;
        std::fprintf(out_, "%s %lld/%lld (%.0f%%) %s%s\n", label_.c_str(), done, total_, 100 * frac,
                     metrics.c_str(), rate.c_str());
        std::fflush(out_);
      }
    }
  }

  /*! \brief Whether output goes to a terminal. */
  bool is_tty() const { return tty_; }

private:
  std::string label_;
  long long total_;
  bool enabled_;
  std::FILE* out_;
  bool tty_;
  int last_tenth_ = 0;
  std::chrono::steady_clock::time_point start_;
};

} // namespace telar
