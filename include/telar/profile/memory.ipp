// What telar/profile/memory.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/profile/memory.hpp>

namespace telar {

TELAR_DECL std::size_t MemoryBytes::total() const {
  std::size_t t = 0;
  for (std::size_t b : bytes)
    t += b;
  return t;
}

TELAR_DECL MemoryCategory MemoryBytes::largest() const {
  int best = 0;
  for (int i = 1; i < count; ++i)
    if (bytes[std::size_t(i)] > bytes[std::size_t(best)])
      best = i;
  return MemoryCategory(best);
}

TELAR_DECL char const* MemoryBytes::key(MemoryCategory c) {
  static char const* const names[count] = {"parameters",  "gradients",     "optimizer_state",
                                           "activations", "communication", "workspace"};
  return names[int(c)];
}

TELAR_DECL std::string MemoryBytes::human(std::size_t b) {
  char const* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.3g %s", v, units[u]);
  return buf;
}

TELAR_DECL std::string MemoryBytes::str() const {
  std::string s;
  for (int i = 0; i < count; ++i)
    s += std::string(key(MemoryCategory(i))) + " " + human(bytes[std::size_t(i)]) + ", ";
  return s + "total " + human(total());
}

TELAR_DECL std::string MemoryBytes::json() const {
  std::string s = "{";
  for (int i = 0; i < count; ++i)
    s += "\"" + std::string(key(MemoryCategory(i))) +
         "\":" + std::to_string(bytes[std::size_t(i)]) + ",";
  return s + "\"total\":" + std::to_string(total()) + "}";
}

TELAR_DECL void MemoryMeter::install() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (installs_++ > 0)
    return;
  namespace KT = Kokkos::Tools::Experimental;
  previous_ = KT::get_callbacks();
  KT::set_allocate_data_callback(&MemoryMeter::on_allocate);
  KT::set_deallocate_data_callback(&MemoryMeter::on_deallocate);
}

TELAR_DECL void MemoryMeter::uninstall() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (installs_ == 0 || --installs_ > 0)
    return;
  namespace KT = Kokkos::Tools::Experimental;
  KT::set_allocate_data_callback(previous_.allocate_data);
  KT::set_deallocate_data_callback(previous_.deallocate_data);
}

TELAR_DECL int MemoryMeter::start_tracking() {
  std::lock_guard<std::mutex> lock(mutex_);
  int const id = next_tracker_++;
  trackers_[id] = Peaks{current_, current_.total(), false};
  return id;
}

TELAR_DECL MemoryBytes MemoryMeter::peaks(int id, std::size_t* total_peak) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = trackers_.find(id);
  if (it == trackers_.end())
    return {};
  if (total_peak)
    *total_peak = it->second.total;
  return it->second.bytes;
}

TELAR_DECL void MemoryMeter::set_tracking(int id, bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = trackers_.find(id);
  if (it != trackers_.end())
    it->second.paused = !on;
}

TELAR_DECL void MemoryMeter::on_allocate(Kokkos_Profiling_SpaceHandle handle, char const* label,
                                         void const* ptr, std::uint64_t size) {
  MemoryMeter& m = instance();
  {
    std::lock_guard<std::mutex> lock(m.mutex_);
    if (detail::counts_label(label, current_scope() >= 0))
      m.add(label, ptr, std::size_t(size));
  }
  if (m.previous_.allocate_data)
    m.previous_.allocate_data(handle, label, ptr, size);
}

TELAR_DECL void MemoryMeter::on_deallocate(Kokkos_Profiling_SpaceHandle handle, char const* label,
                                           void const* ptr, std::uint64_t size) {
  MemoryMeter& m = instance();
  {
    std::lock_guard<std::mutex> lock(m.mutex_);
    m.remove(ptr);
  }
  if (m.previous_.deallocate_data)
    m.previous_.deallocate_data(handle, label, ptr, size);
}

TELAR_DECL void MemoryMeter::add(std::string const& label, void const* ptr, std::size_t bytes) {
  ++allocations_;
  int const scope = current_scope();
  MemoryCategory const c = detail::memory_category_of(
      label, scope >= 0 ? MemoryCategory(scope) : MemoryCategory::workspace);
  live_[ptr] = Record{c, bytes};
  current_[c] += bytes;
  std::size_t const total = current_.total();
  for (auto& [id, p] : trackers_) {
    if (p.paused)
      continue;
    p.bytes[c] = std::max(p.bytes[c], current_[c]);
    p.total = std::max(p.total, total);
  }
}

TELAR_DECL void MemoryMeter::remove(void const* ptr) {
  auto it = live_.find(ptr);
  if (it == live_.end())
    return;
  current_[it->second.category] -= it->second.bytes;
  live_.erase(it);
}

} // namespace telar

namespace telar {
namespace detail {

TELAR_DECL void MemoryRecord::reset() {
  if (ptr_)
    MemoryMeter::instance().record_deallocation(ptr_);
  ptr_ = nullptr;
}

} // namespace detail
} // namespace telar
