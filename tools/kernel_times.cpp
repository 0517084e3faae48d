// A Kokkos Tools library that says where a run's time goes: the wall time of
// every Kokkos kernel (parallel_for, parallel_reduce, parallel_scan) and of
// every profiling region, summed by name, and the kernels summed again by
// the component that launched them ("telar::BatchNorm", "telar::activation",
// ...). Telar runs each oneDNN convolution and GEMM inside a region
// ("telar::conv::onednn::forward", ...), so the convolutions, which are no
// Kokkos kernels, are counted too.
//
//   KOKKOS_PROFILE_LIBRARY=build/tools/libtelar_kernel_times.so \
//   TELAR_KERNEL_TIMES=times.txt build/examples/06_resnet/resnet ...
//
// Writes TELAR_KERNEL_TIMES (stderr without it; ".<rank>" appended under
// mpirun) when Kokkos finalizes. Kernels run one after another on a host
// backend, so their times are theirs; on a device a kernel's time is its
// launch unless the code fences. Regions nest: a region's time includes the
// kernels and regions inside it.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace {

struct Total {
  double seconds = 0;
  long calls = 0;
};

struct Open {
  std::string name;
  double start;
};

std::vector<Open> kernels_open; // by the id handed to Kokkos
std::vector<Open> regions_open; // a stack
std::map<std::string, Total> kernels, regions;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void add(std::map<std::string, Total>& to, std::string const& name, double seconds) {
  Total& t = to[name];
  t.seconds += seconds;
  ++t.calls;
}

void begin_kernel(char const* name, std::uint64_t* id) {
  *id = kernels_open.size();
  kernels_open.push_back({name, now()});
}

void end_kernel(std::uint64_t id) {
  if (id >= kernels_open.size())
    return;
  add(kernels, kernels_open[id].name, now() - kernels_open[id].start);
  if (id + 1 == kernels_open.size()) // ids are handed out in order: reuse
    kernels_open.pop_back();
}

// "telar::BatchNorm::apply" -> "telar::BatchNorm"; a name without "::" stays.
std::string component(std::string const& name) {
  std::size_t const first = name.find("::");
  if (first == std::string::npos)
    return name;
  std::size_t const second = name.find("::", first + 2);
  return second == std::string::npos ? name : name.substr(0, second);
}

void print(std::FILE* f, char const* title, std::map<std::string, Total> const& totals) {
  std::vector<std::pair<std::string, Total>> rows(totals.begin(), totals.end());
  std::sort(rows.begin(), rows.end(),
            [](auto const& a, auto const& b) { return a.second.seconds > b.second.seconds; });
  std::fprintf(f, "# %s: total ms, calls, name\n", title);
  for (auto const& [name, t] : rows)
    std::fprintf(f, "%12.3f %8ld %s\n", 1e3 * t.seconds, t.calls, name.c_str());
}

std::string output_path() {
  char const* path = std::getenv("TELAR_KERNEL_TIMES");
  if (!path || !*path)
    return "";
  for (char const* rank : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (char const* r = std::getenv(rank))
      return std::string(path) + "." + r;
  return path;
}

} // namespace

extern "C" {

void kokkosp_init_library(int, std::uint64_t, std::uint32_t, void*) {}

void kokkosp_finalize_library() {
  std::map<std::string, Total> components;
  for (auto const& [name, t] : kernels) {
    Total& c = components[component(name)];
    c.seconds += t.seconds;
    c.calls += t.calls;
  }
  std::string const path = output_path();
  std::FILE* f = path.empty() ? stderr : std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "telar_kernel_times: cannot write %s\n", path.c_str());
    return;
  }
  print(f, "kernels by component", components);
  print(f, "regions (inclusive)", regions);
  print(f, "kernels", kernels);
  if (f != stderr)
    std::fclose(f);
}

void kokkosp_begin_parallel_for(char const* name, std::uint32_t, std::uint64_t* id) {
  begin_kernel(name, id);
}
void kokkosp_end_parallel_for(std::uint64_t id) {
  end_kernel(id);
}
void kokkosp_begin_parallel_reduce(char const* name, std::uint32_t, std::uint64_t* id) {
  begin_kernel(name, id);
}
void kokkosp_end_parallel_reduce(std::uint64_t id) {
  end_kernel(id);
}
void kokkosp_begin_parallel_scan(char const* name, std::uint32_t, std::uint64_t* id) {
  begin_kernel(name, id);
}
void kokkosp_end_parallel_scan(std::uint64_t id) {
  end_kernel(id);
}

void kokkosp_push_profile_region(char const* name) {
  regions_open.push_back({name, now()});
}
void kokkosp_pop_profile_region() {
  if (regions_open.empty())
    return;
  add(regions, regions_open.back().name, now() - regions_open.back().start);
  regions_open.pop_back();
}

} // extern "C"
