// telar_scaling_curves: one JSON line per published scaling result
// (telar::published_scaling()), with the cost model's step time, throughput
// and scaling efficiency at 1, 2, 4, ... 1024 GPUs on its hardware profile,
// under plain data parallelism ("points") and under ZeRO-1 ("zero1_points");
// then one line per published Megatron-LM layout (telar::published_megatron(),
// "kind":"transformer") with the model's FLOP rate per GPU and its parts,
// and one per published comparison of layouts
// (telar::published_megatron_layout_studies(), "kind":"layouts") with the
// model's FLOP rate per GPU for each layout and batch.
//   telar_scaling_curves PROFILES_DIR      (bench/planner/profiles)
// Arithmetic only (parallel/paper_scaling.hpp, paper_transformer.hpp): no
// MPI, no timing.
#include <telar/parallel/paper_scaling.hpp>
#include <telar/parallel/paper_transformer.hpp>

#include <cstdio>
#include <exception>
#include <string>

namespace {
// "key":[...] of the model's step, throughput and efficiency at 1 to 1024 GPUs.
void print_points(char const* key, telar::PaperModel const& m, telar::MachineProfile const& hw,
                  int baseline) {
  std::printf("\"%s\":[", key);
  for (int r = 1; r <= 1024; r *= 2) {
    auto const p = telar::predict_data_parallel(m, hw, r);
    std::printf("%s{\"ranks\":%d,\"step_ms\":%.4g,\"exposed_ms\":%.4g,\"samples_per_s\":%.6g,"
                "\"efficiency\":%.4f}",
                r == 1 ? "" : ",", r, p.step_ms, p.dp_exposed_ms + p.publish_ms, p.samples_per_s,
                r >= baseline ? telar::scaling_efficiency(m, hw, r, baseline) : 0.0);
  }
  std::printf("]");
}

telar::MachineProfile published_profile(std::string const& dir, std::string const& file) {
  std::string const path = dir + "/" + file;
  auto hw = telar::load_machine_profile(path);
  if (hw.name.rfind("default", 0) == 0)
    throw telar::Error("no profile at " + path);
  return hw;
}

void print_transformer(telar::PublishedTransformer const& a, telar::MachineProfile const& hw) {
  auto const& m = a.model;
  auto const it = telar::predict_transformer(m, hw);
  std::printf("{\"kind\":\"transformer\",\"source\":\"%s\",\"model\":\"%s\",\"profile\":\"%s\","
              "\"tp\":%d,\"pp\":%d,\"gpus\":%d,\"batch\":%.0f,\"published_tflops\":%.1f,"
              "\"peak_tflops\":%.0f,\"tflops\":%.2f,\"model_tflops\":%.2f,\"iteration_s\":%.4g,"
              "\"bubble\":%.4f,\"dp_s\":%.4g,\"layer_gemm_ms\":%.4g,\"layer_elementwise_ms\":%.4g,"
              "\"layer_tp_ms\":%.4g}\n",
              a.source.c_str(), m.name.c_str(), a.profile.c_str(), m.tp, m.pp, m.gpus,
              m.global_batch, a.tflops, a.peak_tflops, it.hardware_flops / 1e12,
              it.model_flops / 1e12, it.seconds, it.bubble, it.dp_reduction, 1e3 * it.layer_gemm,
              1e3 * it.layer_elementwise, 1e3 * it.layer_tp);
}

// One comparison of layouts: the model's TFLOP/s per GPU (their count) for
// each layout and batch, beside the published fastest layout.
void print_layouts(telar::PublishedLayoutStudy const& st, telar::MachineProfile const& hw) {
  std::printf("{\"kind\":\"layouts\",\"source\":\"%s\",\"question\":\"%s\",\"model\":\"%s\","
              "\"profile\":\"%s\",\"gpus\":%d,\"published_best\":[%d,%d],\"batches\":[",
              st.source.c_str(), st.question.c_str(), st.model.name.c_str(), st.profile.c_str(),
              st.model.gpus, st.published_best[0], st.published_best[1]);
  for (std::size_t b = 0; b < st.batches.size(); ++b)
    std::printf("%s%.0f", b ? "," : "", st.batches[b]);
  std::printf("],\"layouts\":[");
  for (std::size_t k = 0; k < st.tp_pp.size(); ++k) {
    std::printf("%s{\"tp\":%d,\"pp\":%d,\"tflops\":[", k ? "," : "", st.tp_pp[k][0],
                st.tp_pp[k][1]);
    for (std::size_t b = 0; b < st.batches.size(); ++b)
      std::printf("%s%.2f", b ? "," : "",
                  telar::predict_layout(st, k, st.batches[b], hw).hardware_flops / 1e12);
    std::printf("]}");
  }
  std::printf("]}\n");
}
} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s PROFILES_DIR\n", argv[0]);
    return 2;
  }
  try {
    for (auto const& a : telar::published_scaling()) {
      auto const hw = published_profile(argv[1], a.profile);
      std::printf("{\"source\":\"%s\",\"model\":\"%s\",\"profile\":\"%s\",\"batch_per_gpu\":%zu,"
                  "\"ranks\":%d,\"baseline\":%d,\"published\":%.3f,",
                  a.source.c_str(), a.model.name.c_str(), a.profile.c_str(), a.model.batch_per_rank,
                  a.ranks, a.baseline, a.efficiency);
      print_points("points", a.model, hw, a.baseline);
      telar::PaperModel zero1 = a.model; // the same setting under ZeRO-1
      zero1.zero_stage = 1;
      std::printf(",");
      print_points("zero1_points", zero1, hw, a.baseline);
      std::printf("}\n");
    }
    for (auto const& a : telar::published_megatron())
      print_transformer(a, published_profile(argv[1], a.profile));
    for (auto const& st : telar::published_megatron_layout_studies())
      print_layouts(st, published_profile(argv[1], st.profile));
  } catch (std::exception const& e) {
    std::fprintf(stderr, "telar_scaling_curves: %s\n", e.what());
    return 1;
  }
  return 0;
}
