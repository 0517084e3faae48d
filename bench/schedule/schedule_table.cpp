// Prints, as Markdown, the simulated bubble and peak activations of Telar's pipeline schedules
// for p = 8..64 ranks and m = 8..256 micro-batches; writes example charts with --svg DIR.
//
//   schedule_table [--cost F,B,W] [--chunks V] [--svg DIR] [--svg-p P] [--svg-m M]
#include <telar/schedule.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace ts = telar::schedule;

namespace {

struct Options {
  double f = 1, b = 1, w = 1;
  int chunks = 2;
  std::string svg_dir;
  int svg_p = 4, svg_m = 8;
};

[[noreturn]] void usage(char const* why) {
  if (why)
    std::cerr << "schedule_table: " << why << "\n";
  std::cerr << "usage: schedule_table [--cost F,B,W] [--chunks V] [--svg DIR] [--svg-p P] "
               "[--svg-m M]\n"
               "  --cost F,B,W  time of Forward, BackwardInput, BackwardWeight per stage "
               "(default 1,1,1)\n"
               "  --chunks V    model chunks per rank of interleaved 1F1B (default 2)\n"
               "  --svg DIR     also write one Gantt chart per schedule to DIR/<name>.svg\n"
               "  --svg-p P, --svg-m M  size of those charts (default 4 ranks, 8 micro-batches)\n";
  std::exit(why ? 2 : 0);
}

int to_int(char const* s) {
  char* end = nullptr;
  long const v = std::strtol(s, &end, 10);
  if (!*s || *end || v < 1 || v > 1 << 20)
    usage("expected a positive integer");
  return static_cast<int>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto value = [&]() -> char const* {
      if (i + 1 >= argc)
        usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--help" || a == "-h")
      usage(nullptr);
    else if (a == "--cost") {
      if (std::sscanf(value(), "%lf,%lf,%lf", &o.f, &o.b, &o.w) != 3 || o.f < 0 || o.b < 0 ||
          o.w < 0)
        usage("--cost wants three non-negative numbers F,B,W");
    } else if (a == "--chunks")
      o.chunks = to_int(value());
    else if (a == "--svg")
      o.svg_dir = value();
    else if (a == "--svg-p")
      o.svg_p = to_int(value());
    else if (a == "--svg-m")
      o.svg_m = to_int(value());
    else
      usage(("unknown argument " + a).c_str());
  }
  return o;
}

std::string percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * x + 0.0); // + 0.0: no "-0.0%"
  return buf;
}

std::string label(ts::Schedule const& s) {
  return s.chunks > 1 ? s.name + " (v=" + std::to_string(s.chunks) + ")" : s.name;
}

} // namespace

int main(int argc, char** argv) {
  Options const o = parse(argc, argv);
  auto const cost = ts::CostModel::uniform(o.f, o.b, o.w);

  std::cout << "Simulated with T_F=" << o.f << ", T_B=" << o.b << ", T_W=" << o.w
            << " per stage (fused backward " << o.b + o.w
            << "), free messages; interleaved 1F1B with v=" << o.chunks
            << " chunks per rank, each chunk 1/v of a stage's cost.\n\n"
            << "- bubble: 1 - busy / (p * makespan) for one iteration;\n"
            << "- overlapped: the same with iterations back to back and no barrier at the "
               "optimizer step (period = longest rank span);\n"
            << "- peak activations: micro-batch activations alive at once on rank 0 / rank p-1 "
               "(interleaved: chunk activations, each 1/v of a stage's);\n"
            << "- memory: rank 0's peak in units of one micro-batch's activations of a whole "
               "stage.\n";
  for (int p : {8, 16, 32, 64}) {
    std::cout << "\n### p = " << p << "\n\n"
              << "| m | schedule | bubble | overlapped | peak activations (rank 0 / p-1) | "
                 "memory |\n"
              << "|---:|---|---:|---:|---:|---:|\n";
    for (int m : {8, 32, 128, 256}) {
      for (auto const& name : ts::schedule_names()) {
        ts::Schedule const s = ts::generate(name, p, m, o.chunks);
        ts::SimulationResult const r = ts::simulate(s, cost);
        std::ostringstream memory;
        memory << static_cast<double>(r.peak_activations.front()) / s.chunks;
        std::cout << "| " << m << " | " << label(s) << " | " << percent(r.bubble_fraction) << " | "
                  << percent(r.period_bubble_fraction) << " | " << r.peak_activations.front()
                  << " / " << r.peak_activations.back() << " | " << memory.str() << " |\n";
      }
    }
  }

  if (!o.svg_dir.empty()) {
    std::cout << "\n";
    for (auto const& name : ts::schedule_names()) {
      ts::Schedule const s = ts::generate(name, o.svg_p, o.svg_m, o.chunks);
      std::string const path = o.svg_dir + "/" + name + ".svg";
      ts::write_svg(ts::simulate(s, cost).timeline, path);
      std::cout << "wrote " << path << "\n";
    }
  }
  return 0;
}
