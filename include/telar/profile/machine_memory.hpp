#pragma once
/*! \file
 *  \brief telar::machine_memory: the memory this process may still take on
 *  its host, for a default memory budget.
 *
 *  A run whose plan needs more than the host has dies in the allocator with
 *  nothing tying it to the flag that made it large; given this as its
 *  budget (TrainerOptions::memory_budget, shared among the ranks of the
 *  host), the memory plan refuses it first with a message that names the
 *  layout, the largest category and the sizes.
 */
#include <cstdio>
#include <cstring>
#include <string>

namespace telar {

/*! \brief What machine_memory() found. */
struct MachineMemory {
  unsigned long long bytes = 0; //!< available bytes (0: unknown)
  std::string source;           //!< where they come from, e.g. "MemAvailable" or "cgroup limit"
};

namespace detail {

// The first number after `key` in a file of "key value" lines (/proc/meminfo),
// or in a file holding only a number (key ""), or -1.
inline long double number_in_file(char const* path, char const* key) {
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr)
    return -1;
  char line[256];
  long double value = -1;
  std::size_t const klen = std::strlen(key);
  while (value < 0 && std::fgets(line, sizeof line, f) != nullptr)
    if (std::strncmp(line, key, klen) == 0) {
      long double v = 0;
      if (std::sscanf(line + klen, " %Lf", &v) == 1)
        value = v;
    }
  std::fclose(f);
  return value;
}

// A cgroup's memory left (limit - usage) in bytes, or -1 without a limit:
// cgroup v2 (memory.max, "max" when unlimited) or v1 (limit_in_bytes, a
// huge number when unlimited).
inline long double cgroup_memory_left() {
  long double limit = number_in_file("/sys/fs/cgroup/memory.max", "");
  long double used = number_in_file("/sys/fs/cgroup/memory.current", "");
  if (limit < 0) {
    limit = number_in_file("/sys/fs/cgroup/memory/memory.limit_in_bytes", "");
    used = number_in_file("/sys/fs/cgroup/memory/memory.usage_in_bytes", "");
  }
  if (limit < 0 || limit >= 1e18L) // none, or "unlimited"
    return -1;
  return used >= 0 && used < limit ? limit - used : limit;
}

} // namespace detail

/*! \brief The memory still available to this process on its host: the
 *  smaller of the kernel's MemAvailable (Linux /proc/meminfo) and what its
 *  cgroup's limit leaves (a container or a Slurm job's allocation).
 *  Unknown (bytes 0) elsewhere. It changes as other processes allocate: a
 *  job takes one reading on one rank (or the minimum over ranks) so that
 *  every rank budgets alike. */
inline MachineMemory machine_memory() {
  MachineMemory m;
  long double const avail = detail::number_in_file("/proc/meminfo", "MemAvailable:") * 1024;
  long double const cgroup = detail::cgroup_memory_left();
  if (avail > 0) {
    m.bytes = (unsigned long long)avail;
    m.source = "MemAvailable";
  }
  if (cgroup > 0 && (avail <= 0 || cgroup < avail)) {
    m.bytes = (unsigned long long)cgroup;
    m.source = "cgroup limit";
  }
  return m;
}

} // namespace telar
