// telar_scaling_curves: one JSON line per published scaling result
// (telar::published_scaling()), with the cost model's step time, throughput
// and scaling efficiency at 1, 2, 4, ... 1024 GPUs on its hardware profile.
//   telar_scaling_curves PROFILES_DIR      (bench/planner/profiles)
// Arithmetic only (parallel/paper_scaling.hpp): no MPI, no timing.
#include <telar/parallel/paper_scaling.hpp>

#include <cstdio>
#include <exception>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s PROFILES_DIR\n", argv[0]);
    return 2;
  }
  try {
    for (auto const& a : telar::published_scaling()) {
      std::string const path = std::string(argv[1]) + "/" + a.profile;
      auto const hw = telar::load_machine_profile(path);
      if (hw.name.rfind("default", 0) == 0)
        throw telar::Error("no profile at " + path);
      std::printf("{\"source\":\"%s\",\"model\":\"%s\",\"profile\":\"%s\",\"batch_per_gpu\":%zu,"
                  "\"ranks\":%d,\"baseline\":%d,\"published\":%.3f,\"points\":[",
                  a.source.c_str(), a.model.name.c_str(), a.profile.c_str(), a.model.batch_per_rank,
                  a.ranks, a.baseline, a.efficiency);
      for (int r = 1; r <= 1024; r *= 2) {
        auto const p = telar::predict_data_parallel(a.model, hw, r);
        std::printf("%s{\"ranks\":%d,\"step_ms\":%.4g,\"exposed_ms\":%.4g,\"samples_per_s\":%.6g,"
                    "\"efficiency\":%.4f}",
                    r == 1 ? "" : ",", r, p.step_ms, p.dp_exposed_ms, p.samples_per_s,
                    r >= a.baseline ? telar::scaling_efficiency(a.model, hw, r, a.baseline) : 0.0);
      }
      std::printf("]}\n");
    }
  } catch (std::exception const& e) {
    std::fprintf(stderr, "telar_scaling_curves: %s\n", e.what());
    return 1;
  }
  return 0;
}
