#pragma once
/*! \file
 *  \brief telar::LaunchCounter: kernel launches and library calls (GEMM,
 *  convolution primitives) counted while it lives.
 *
 *  On a GPU every launch costs microseconds of latency; on the host it is
 *  nearly free, so host timings hide a layer whose launches grow with the
 *  batch or the head count. Counting shows it without a device: Kokkos
 *  parallel_for, parallel_reduce and parallel_scan through Kokkos Tools
 *  callbacks, and the calls Telar's GEMM and convolution policies make into a
 *  library (oneDNN, Kokkos Kernels), which Kokkos never sees.
 *  \code
 *  telar::LaunchCounter count;
 *  layer.forward(exec, x, y, saved);
 *  exec.fence();
 *  std::size_t const launches = count.total();
 *  \endcode
 */
#include <telar/profile/detail/launches.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace telar {

/*! \brief Counts kernel launches and policy library calls made while it
 *  lives, on every thread. Counters nest: each one sees the launches since
 *  its own construction. Other Kokkos Tools callbacks (a loaded tool, the
 *  memory meter) keep theirs; the launch callbacks it replaces still see
 *  every launch and come back when the last counter goes. */
class LaunchCounter {
public:
  /*! \brief Starts counting. */
  LaunchCounter() {
    auto& s = detail::launch_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.counters++ == 0) {
      namespace KT = Kokkos::Tools::Experimental;
      s.previous = KT::get_callbacks();
      KT::set_begin_parallel_for_callback(&LaunchCounter::on_for);
      KT::set_begin_parallel_reduce_callback(&LaunchCounter::on_reduce);
      KT::set_begin_parallel_scan_callback(&LaunchCounter::on_scan);
      s.active = true;
    }
    kernels0_ = s.kernels.load();
    library0_ = s.library_calls.load();
    names0_ = s.names;
    device_types0_ = s.device_types;
  }
  /*! \brief Stops counting (the last counter restores the callbacks). */
  ~LaunchCounter() {
    auto& s = detail::launch_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (--s.counters == 0) {
      s.active = false;
      namespace KT = Kokkos::Tools::Experimental;
      KT::set_begin_parallel_for_callback(s.previous.begin_parallel_for);
      KT::set_begin_parallel_reduce_callback(s.previous.begin_parallel_reduce);
      KT::set_begin_parallel_scan_callback(s.previous.begin_parallel_scan);
    }
  }
  LaunchCounter(LaunchCounter const&) = delete;
  LaunchCounter& operator=(LaunchCounter const&) = delete;

  /*! \brief Kokkos parallel_for, parallel_reduce and parallel_scan launches
   *  so far (deep copies and fences are not counted). */
  std::uint64_t kernels() const { return detail::launch_state().kernels.load() - kernels0_; }
  /*! \brief Library calls of Telar's GEMM and convolution policies so far
   *  (oneDNN, Kokkos Kernels; the reference kernels count as kernels). */
  std::uint64_t library_calls() const {
    return detail::launch_state().library_calls.load() - library0_;
  }
  /*! \brief kernels() + library_calls(): what a device would launch. */
  std::uint64_t total() const { return kernels() + library_calls(); }
  /*! \brief Launches so far per kernel name (library calls under
   *  "telar::gemm::<policy>" and "telar::conv::<policy>"), for finding the
   *  one that grows. */
  std::map<std::string, std::uint64_t> by_name() const {
    auto& s = detail::launch_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    std::map<std::string, std::uint64_t> out;
    for (auto const& [name, n] : s.names) {
      auto const it = names0_.find(name);
      std::uint64_t const d = n - (it == names0_.end() ? 0 : it->second);
      if (d > 0)
        out[name] = d;
    }
    return out;
  }

  /*! \brief Kernels so far that ran on an execution space of type \p Exec
   *  (the device type Kokkos Tools reports with each launch): a layer given
   *  an `Exec` instance launches every kernel there. */
  template <class Exec>
  std::uint64_t kernels_on() const {
    auto& s = detail::launch_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    auto const count = [](auto const& by_type, std::uint32_t type) -> std::uint64_t {
      auto const it = by_type.find(type);
      return it == by_type.end() ? 0 : it->second;
    };
    std::uint32_t const type = detail::device_type_v<Exec>();
    return count(s.device_types, type) - count(device_types0_, type);
  }

private:
  using Begin = Kokkos_Profiling_beginFunction;
  // Counts, then hands the event to the callback it replaced (a loaded
  // tool's, which then sets the kernel id its end callback expects).
  static void count(Begin previous, char const* name, std::uint32_t dev, std::uint64_t* id) {
    auto& s = detail::launch_state();
    *id = ++s.kernels;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      ++s.names[name ? name : ""];
      ++s.device_types[detail::device_type_of(dev)];
    }
    if (previous)
      previous(name, dev, id);
  }
  static void on_for(char const* name, std::uint32_t dev, std::uint64_t* id) {
    count(detail::launch_state().previous.begin_parallel_for, name, dev, id);
  }
  static void on_reduce(char const* name, std::uint32_t dev, std::uint64_t* id) {
    count(detail::launch_state().previous.begin_parallel_reduce, name, dev, id);
  }
  static void on_scan(char const* name, std::uint32_t dev, std::uint64_t* id) {
    count(detail::launch_state().previous.begin_parallel_scan, name, dev, id);
  }

  std::uint64_t kernels0_ = 0, library0_ = 0;
  std::map<std::string, std::uint64_t> names0_;
  std::map<std::uint32_t, std::uint64_t> device_types0_;
};

} // namespace telar
