#pragma once
/*! \file
 *  \brief telar::MemoryMeter: bytes per category measured from the real
 *  allocations (Kokkos Tools allocation callbacks and Telar's own non-Kokkos
 *  allocation points), and telar::MemoryBytes, a count per category. */
#include <telar/core/detail/decl.hpp>
#include <telar/core/error.hpp>
#include <telar/profile/detail/memory_labels.hpp>
#include <telar/profile/memory_category.hpp>

#include <Kokkos_Core.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>

namespace telar {

/*! \brief Thrown when a memory plan exceeds TrainerOptions::memory_budget
 *  (identically on every rank, before anything is allocated). */
class MemoryError : public Error {
public:
  /*! \brief \param what the message */
  explicit MemoryError(std::string const& what) : Error(what) {}
};

/*! \brief One byte count per telar::MemoryCategory. */
struct MemoryBytes {
  /*! \brief Number of categories. */
  static constexpr int count = 6;
  /*! \brief Bytes per category, indexed by MemoryCategory. */
  std::array<std::size_t, count> bytes{};

  /*! \brief Bytes of category \p c. \param c category */
  std::size_t& operator[](MemoryCategory c) { return bytes[std::size_t(c)]; }
  /*! \brief Bytes of category \p c. \param c category */
  std::size_t operator[](MemoryCategory c) const { return bytes[std::size_t(c)]; }
  /*! \brief Sum over the categories (a peak of the total may be lower than
   *  this sum of per-category peaks). */
  TELAR_DECL std::size_t total() const;
  /*! \brief Adds \p o category by category. \param o bytes to add */
  MemoryBytes& operator+=(MemoryBytes const& o) {
    for (int i = 0; i < count; ++i)
      bytes[std::size_t(i)] += o.bytes[std::size_t(i)];
    return *this;
  }
  /*! \brief The category with the most bytes. */
  TELAR_DECL MemoryCategory largest() const;

  /*! \brief JSON key / text name of \p c ("optimizer_state", ...). \param c category */
  TELAR_DECL static char const* key(MemoryCategory c);
  /*! \brief "1.23 GiB", "512 KiB", "17 B". \param b bytes */
  TELAR_DECL static std::string human(std::size_t b);
  /*! \brief "parameters 1.2 MiB, gradients ..., total 5 MiB". */
  TELAR_DECL std::string str() const;
  /*! \brief {"parameters":N,...,"total":N}. */
  TELAR_DECL std::string json() const;
};

/*! \brief Process-wide meter of the bytes Telar allocates, per category:
 *  current and peak values, fed by Kokkos Tools' allocation callbacks and by
 *  Telar's own non-Kokkos allocation points (record_allocation()).
 *
 *  Installed while any telar::Trainer lives (install() / uninstall() count);
 *  a profiling tool loaded before keeps receiving its callbacks (the meter
 *  calls the previous ones). An allocation is counted when it happens inside
 *  a Scope (a Trainer's construction, step or evaluation), except the Kokkos
 *  runtime's own ("Kokkos::" labels: process-wide, made once, not the
 *  trainer's); it is categorised by label
 * first (detail/memory_labels.hpp), else by the innermost Scope's category. Thread-safe. Peaks are
 * kept per tracker (start_tracking()), so several trainers each see the peaks since their own
 * start. */
class MemoryMeter {
public:
  /*! \brief The process's meter. */
  static MemoryMeter& instance() {
    static MemoryMeter meter;
    return meter;
  }

  /*! \brief Starts receiving Kokkos allocations (counted: the first call installs). */
  TELAR_DECL void install();
  /*! \brief Stops receiving them after the last install() is undone. */
  TELAR_DECL void uninstall();
  /*! \brief Whether Kokkos allocations reach the meter now. */
  bool installed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return installs_ > 0;
  }

  /*! \brief Records an allocation made outside Kokkos (e.g. an MPI shared
   *  window). \param label Telar label \param ptr address \param bytes size */
  void record_allocation(std::string const& label, void const* ptr, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    add(label, ptr, bytes); // Telar's own points: always recorded
  }
  /*! \brief Records the release of \p ptr (ignored if it was never recorded).
   *  \param ptr address */
  void record_deallocation(void const* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    remove(ptr);
  }

  /*! \brief Bytes held now. */
  MemoryBytes current() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return current_;
  }
  /*! \brief Count of Kokkos / recorded allocations seen since the process
   *  started (tests check that a plan allocates nothing). */
  std::uint64_t allocations() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return allocations_;
  }

  /*! \brief A new peak tracker starting at the current bytes. \return its id */
  TELAR_DECL int start_tracking();
  /*! \brief Per-category peaks of tracker \p id since it started.
   *  \param id tracker \param total_peak receives the peak of the total */
  TELAR_DECL MemoryBytes peaks(int id, std::size_t* total_peak = nullptr) const;
  /*! \brief Stops (false) or resumes (true) updating tracker \p id's peaks.
   *  \param id tracker \param on whether it follows allocations */
  TELAR_DECL void set_tracking(int id, bool on);
  /*! \brief Forgets tracker \p id. \param id tracker */
  void stop_tracking(int id) {
    std::lock_guard<std::mutex> lock(mutex_);
    trackers_.erase(id);
  }

  /*! \brief While it lives, allocations are counted and (when unlabelled)
   *  fall into \p category. Scopes nest; the innermost decides. */
  class Scope {
  public:
    /*! \brief \param category category of unlabelled allocations */
    explicit Scope(MemoryCategory category) : previous_(current_scope()) {
      current_scope() = previous_ == uncounted ? uncounted : int(category);
    }
    /*! \brief Restores the enclosing scope's category. */
    ~Scope() { current_scope() = previous_; }
    Scope(Scope const&) = delete;
    Scope& operator=(Scope const&) = delete;

  private:
    int previous_;
  };

  /*! \brief While it lives, this thread's allocations are not counted
   *  (Scopes opened within it do not count either; releases of what was
   *  counted still are): work beside the trainers, such as a cost-model
   *  calibration timing a model of its own, is not theirs. */
  class Uncounted {
  public:
    /*! \brief Stops counting this thread's allocations. */
    Uncounted() : previous_(current_scope()) { current_scope() = uncounted; }
    /*! \brief Restores the enclosing scope. */
    ~Uncounted() { current_scope() = previous_; }
    Uncounted(Uncounted const&) = delete;
    Uncounted& operator=(Uncounted const&) = delete;

  private:
    int previous_;
  };

private:
  static constexpr int uncounted = -2; // current_scope() inside an Uncounted

  struct Peaks {
    MemoryBytes bytes;
    std::size_t total = 0;
    bool paused = false;
  };
  struct Record {
    MemoryCategory category;
    std::size_t bytes;
  };

  MemoryMeter() = default;

  // -1: outside any Scope, `uncounted` inside an Uncounted. Thread-local:
  // scopes belong to the calling thread.
  static int& current_scope() {
    thread_local int scope = -1;
    return scope;
  }

  TELAR_DECL static void on_allocate(Kokkos_Profiling_SpaceHandle handle, char const* label,
                                     void const* ptr, std::uint64_t size);
  TELAR_DECL static void on_deallocate(Kokkos_Profiling_SpaceHandle handle, char const* label,
                                       void const* ptr, std::uint64_t size);

  // Callers hold mutex_.
  TELAR_DECL void add(std::string const& label, void const* ptr, std::size_t bytes);
  TELAR_DECL void remove(void const* ptr);

  mutable std::mutex mutex_;
  int installs_ = 0;
  Kokkos::Tools::Experimental::EventSet previous_{};
  std::map<void const*, Record> live_;
  MemoryBytes current_;
  std::map<int, Peaks> trackers_;
  int next_tracker_ = 0;
  std::uint64_t allocations_ = 0;
};

/*! \brief The meter installed for the lifetime of this object (a Trainer holds one). */
class MemoryMeterInstall {
public:
  /*! \brief Installs the meter (counted). */
  MemoryMeterInstall() { MemoryMeter::instance().install(); }
  /*! \brief Undoes the install. */
  ~MemoryMeterInstall() { MemoryMeter::instance().uninstall(); }
  MemoryMeterInstall(MemoryMeterInstall const&) = delete;
  MemoryMeterInstall& operator=(MemoryMeterInstall const&) = delete;
};

namespace detail {

// A non-Kokkos allocation recorded for as long as this token lives (movable).
class MemoryRecord {
public:
  MemoryRecord() = default;
  MemoryRecord(std::string const& label, void const* ptr, std::size_t bytes) : ptr_(ptr) {
    if (ptr_)
      MemoryMeter::instance().record_allocation(label, ptr_, bytes);
  }
  MemoryRecord(MemoryRecord&& o) noexcept : ptr_(o.ptr_) { o.ptr_ = nullptr; }
  MemoryRecord& operator=(MemoryRecord&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = o.ptr_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  ~MemoryRecord() { reset(); }

private:
  TELAR_DECL void reset();
  void const* ptr_ = nullptr;
};

} // namespace detail
} // namespace telar

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/profile/memory.ipp>
#endif
