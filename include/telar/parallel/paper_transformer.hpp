#pragma once
/*! \file
 *  \brief The cost model at scale, on paper, for a GPT trained with tensor,
 *  pipeline and data parallelism as Megatron-LM trains it (Narayanan et
 *  al., SC'21): the iteration time and the FLOP rate per GPU of a model
 *  given by its shape (layers, hidden size, heads, sequence, vocabulary) at
 *  a layout (tp x pp x dp, micro-batches, recomputation) on a hardware
 *  profile written from published figures. GEMMs at the profile's GEMM
 *  rate, element-wise passes at its element-wise bandwidth, tensor-parallel
 *  and data-parallel allreduces with the same link classes and group
 *  placement as telar::predict_step (detail::comm_group,
 *  detail::allreduce_seconds), the pipeline from the schedule simulator.
 *  docs/planner.md ("At scale, on paper") lists what it reproduces and what
 *  it assumed. */
#include <telar/comm/process_grid.hpp>
#include <telar/core/error.hpp>
#include <telar/parallel/detail/step_cost_detail.hpp>
#include <telar/parallel/machine_profile.hpp>
#include <telar/schedule/cost_model.hpp>
#include <telar/schedule/simulate.hpp>
#include <telar/schedule/tags.hpp>

#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace telar {

/*! \brief A GPT by its shape, and the layout it trains under (every GPU
 *  holds 1/tp of each of its stage's layers). */
struct PaperTransformer {
  std::string name;                 //!< e.g. "GPT 1.0 T"
  int layers = 0;                   //!< transformer layers
  double hidden = 0;                //!< hidden size h (MLP 4h)
  double heads = 0;                 //!< attention heads
  double sequence = 2048;           //!< tokens per sample s
  double vocabulary = 51200;        //!< V (the logits GEMM and the embedding)
  double global_batch = 0;          //!< samples per iteration, all ranks
  double micro_batch = 1;           //!< samples per micro-batch
  int tp = 1;                       //!< tensor-parallel degree (inside a server)
  int pp = 1;                       //!< pipeline stages
  int gpus = 1;                     //!< all ranks: dp = gpus / (tp pp)
  int chunks = 1;                   //!< model chunks per pipeline rank (interleaved 1F1B)
  bool recompute = true;            //!< every layer's forward runs again before its backward
  double element_bytes = 2;         //!< activations and their messages (fp16 / bf16)
  double gradient_bytes = 2;        //!< the data-parallel allreduce's bytes per parameter
  double elementwise_passes = 11.0; //!< element-wise reads + writes of [b, s, h] per layer forward,
                                    //!< replicated on every tensor-parallel rank (layer norms,
                                    //!< dropouts, residual adds, bias adds)
  double split_passes = 8.0;        //!< those of [b, s, h] split by tp (bias + GeLU on the 4h MLP)
  double score_passes = 4.5;        //!< those of the scores [b, heads, s, s] (softmax, dropout)
};

/*! \brief One iteration of a PaperTransformer (seconds, FLOP/s per GPU). */
struct TransformerIteration {
  double seconds = 0;           //!< pipeline makespan + data-parallel reduction + optimizer
  double layer_gemm = 0;        //!< one layer's forward GEMMs for one micro-batch
  double layer_elementwise = 0; //!< one layer's forward element-wise passes
  double layer_tp = 0;          //!< one layer's forward tensor-parallel allreduces
  double pipeline = 0;          //!< the simulated schedule's makespan
  double bubble = 0;            //!< makespan over its busiest stage's compute, less 1
  double dp_reduction = 0;      //!< the gradient allreduce after the last backward
  double hardware_flops = 0;    //!< per GPU per second, recomputation counted (Megatron's count)
  double model_flops = 0;       //!< per GPU per second, recomputation not counted
};

namespace detail {
// A layer's forward parts for one micro-batch on one GPU: the GEMMs' FLOPs
// with weights (QKV, projection, the MLP's two: 24 b s h^2 / tp) and
// without (scores and their product with V: 4 b s^2 h / tp).
struct LayerForward {
  double weighted = 0, unweighted = 0, elementwise = 0, tp_allreduce = 0;
};

inline LayerForward paper_layer_forward(PaperTransformer const& m, MachineProfile const& hw,
                                        CommGroup const& tp) {
  double const b = m.micro_batch, s = m.sequence, h = m.hidden, t = m.tp;
  double const rate = hw.gemm_gflops(24 * b * s * h * h / t) * 1e9;
  double const tokens = b * s * h * m.element_bytes;
  double const bytes = tokens * (m.elementwise_passes + m.split_passes / t) +
                       b * m.heads * s * s / t * m.element_bytes * m.score_passes;
  LayerForward f;
  f.weighted = 24 * b * s * h * h / t / rate;
  f.unweighted = 4 * b * s * s * h / t / rate;
  f.elementwise = bytes / (hw.elementwise_gbs * 1e9);
  f.tp_allreduce = 2 * allreduce_seconds(hw, tp, tokens, false); // attention's, the MLP's
  return f;
}
} // namespace detail

namespace detail {
// The schedule simulated with each (virtual) stage's share of the layers,
// the logits on the last, and [b, s, h] / tp per message between stages
// (Megatron's scatter/gather) on the link the pipeline group spans.
inline schedule::SimulationResult paper_pipeline(PaperTransformer const& m,
                                                 MachineProfile const& hw, LayerForward const& f,
                                                 CommGroup const& pp, int micro_batches) {
  double const forward = f.weighted + f.unweighted + f.elementwise + f.tp_allreduce;
  double const input = (m.recompute ? forward : 0) + f.weighted + 2 * f.unweighted +
                       2 * f.elementwise + f.tp_allreduce;
  double const head_flops = 2 * m.micro_batch * m.sequence * m.hidden * m.vocabulary / m.tp;
  double const logits = head_flops / (hw.gemm_gflops(head_flops) * 1e9);
  int const stages = m.pp * m.chunks;
  double const per_chunk = double(m.layers) / stages;
  schedule::CostModel cost;
  cost.forward.assign(stages, per_chunk * forward);
  cost.backward_input.assign(stages, per_chunk * input);
  cost.backward_weight.assign(stages, per_chunk * f.weighted);
  cost.forward.back() += logits;
  cost.backward_input.back() += logits;
  cost.backward_weight.back() += logits;
  LinkCost const hop = hw.link_class(pp.spans).send_recv;
  cost.alpha = hop.alpha;
  cost.beta = hop.beta;
  cost.activation_bytes = cost.grad_bytes =
      m.micro_batch * m.sequence * m.hidden * m.element_bytes / m.tp;
  char const* const name = m.pp > 1 && m.chunks > 1 ? "interleaved" : "1f1b";
  return schedule::simulate(schedule::generate(name, m.pp, micro_batches, m.chunks), cost);
}

// Micro-batches per pipeline, after checking that the layout divides.
inline int paper_micro_batches(PaperTransformer const& m) {
  int const stages = m.pp * m.chunks;
  int const dp = m.tp * m.pp > 0 ? m.gpus / (m.tp * m.pp) : 0;
  double const micro = dp > 0 ? m.global_batch / (dp * m.micro_batch) : 0;
  if (dp < 1 || dp * m.tp * m.pp != m.gpus || stages < 1 || m.layers % stages != 0 || micro < 1 ||
      micro != double(long(micro)))
    throw Error("telar::predict_transformer: " + m.name + ": " + std::to_string(m.gpus) +
                " GPUs at tp " + std::to_string(m.tp) + ", pp " + std::to_string(m.pp) + ", " +
                std::to_string(m.layers) + " layers in " + std::to_string(stages) +
                " chunks, a batch of " + std::to_string(long(m.global_batch)) +
                ": the GPUs must be a multiple of tp x pp, the layers of pp x chunks and the "
                "batch of dp x micro_batch");
  return int(micro);
}
} // namespace detail

/*! \brief Iteration of \p m on \p hw. Per layer and micro-batch: forward =
 *  GEMMs + element-wise passes + two tensor-parallel allreduces of [b, s,
 *  h]; backward-input = the forward again when recomputing, the input
 *  gradients' GEMMs (the unweighted ones twice), element-wise passes twice
 *  and two allreduces; backward-weight = the weight GEMMs. The last stage
 *  adds the logits (2 b s h V / tp forward, twice that backward); the
 *  embedding's lookups are left out. Stages pass [b, s, h] / tp per
 *  micro-batch across nodes (Megatron's scatter/gather) at the profile's
 *  across send cost. The schedule is 1F1B (interleaved with chunks > 1),
 *  simulated; the data-parallel allreduce of the gradients runs after it,
 *  hidden behind nothing (Megatron-LM 2021's local DDP), then the optimizer
 *  updates this GPU's parameters.
 *  \throws telar::Error when gpus is not a multiple of tp x pp, layers of
 *  pp x chunks, or the batch of dp x micro_batch */
inline TransformerIteration predict_transformer(PaperTransformer const& m,
                                                MachineProfile const& hw) {
  int const micro_batches = detail::paper_micro_batches(m);
  GridShape const grid{m.gpus / (m.tp * m.pp), m.pp, m.tp};
  auto group = [&](GridAxis a) {
    return detail::comm_group(grid, default_grid_order, a, hw.ranks_per_node);
  };
  detail::LayerForward const f = detail::paper_layer_forward(m, hw, group(GridAxis::tp));
  auto const run = detail::paper_pipeline(m, hw, f, group(GridAxis::pp), micro_batches);
  TransformerIteration it;
  it.layer_gemm = f.weighted + f.unweighted;
  it.layer_elementwise = f.elementwise;
  it.layer_tp = f.tp_allreduce;
  it.pipeline = run.makespan;
  it.bubble = run.makespan / run.ideal - 1;
  double const h = m.hidden, l = m.layers, s = m.sequence;
  double const parameters = (12 * l * h * h + m.vocabulary * h) / (m.tp * m.pp);
  it.dp_reduction =
      detail::allreduce_seconds(hw, group(GridAxis::dp), parameters * m.gradient_bytes, true);
  it.seconds = it.pipeline + it.dp_reduction + parameters * hw.optimizer_ns_per_parameter * 1e-9 +
               hw.step_overhead_us * 1e-6;
  // Narayanan et al.'s count: 72 B s l h^2 (1 + s / 6h) for forward and
  // backward, a third more with recomputation, and the logits' 6 B s h V.
  double const layers = 72 * m.global_batch * s * l * h * h * (1 + s / (6 * h));
  double const head = 6 * m.global_batch * s * h * m.vocabulary;
  it.model_flops = (layers + head) / m.gpus / it.seconds;
  it.hardware_flops = (layers * (m.recompute ? 4.0 / 3.0 : 1.0) + head) / m.gpus / it.seconds;
  return it;
}

/*! \brief A published per-GPU FLOP rate at a published layout. */
struct PublishedTransformer {
  std::string source;     //!< who published it
  std::string profile;    //!< hardware profile file in bench/planner/profiles/
  PaperTransformer model; //!< the network and its layout
  double tflops = 0;      //!< published TFLOP/s per GPU (their count)
  double peak_tflops = 0; //!< the GPU's peak at the precision used
};

/*! \brief Narayanan et al. (SC'21), Table 1: GPT models from 1.7 B to 1 T
 *  parameters on up to 3,072 A100 GPUs (sequence 2048, vocabulary 51,200,
 *  mixed precision, recomputation), TFLOP/s per GPU as they count it
 *  (recomputation included) against the A100's 312 TFLOP/s. Micro-batch
 *  size and chunks are not in the table: 1 and 1 here. */
inline std::vector<PublishedTransformer> published_megatron() {
  struct Row {
    char const* name;
    double heads, hidden;
    int layers, tp, pp, gpus;
    double batch, tflops;
  };
  Row const rows[] = {{"1.7 B", 24, 2304, 24, 1, 1, 32, 512, 137},
                      {"3.6 B", 32, 3072, 30, 2, 1, 64, 512, 138},
                      {"7.5 B", 32, 4096, 36, 4, 1, 128, 512, 142},
                      {"18.4 B", 48, 6144, 40, 8, 1, 256, 1024, 135},
                      {"39.1 B", 64, 8192, 48, 8, 2, 512, 1536, 138},
                      {"76.1 B", 80, 10240, 60, 8, 4, 1024, 1792, 140},
                      {"145.6 B", 96, 12288, 80, 8, 8, 1536, 2304, 148},
                      {"310.1 B", 128, 16384, 96, 8, 16, 1920, 2160, 155},
                      {"529.6 B", 128, 20480, 105, 8, 35, 2520, 2520, 163},
                      {"1008.0 B", 160, 25600, 128, 8, 64, 3072, 3072, 163}};
  std::vector<PublishedTransformer> out;
  for (Row const& r : rows) {
    PaperTransformer m;
    m.name = std::string("GPT ") + r.name;
    m.heads = r.heads;
    m.hidden = r.hidden;
    m.layers = r.layers;
    m.tp = r.tp;
    m.pp = r.pp;
    m.gpus = r.gpus;
    m.global_batch = r.batch;
    out.push_back(
        {"Megatron-LM (Narayanan et al. 2021)", "a100_selene_hdr.json", m, r.tflops, 312});
  }
  return out;
}

/*! \brief A published comparison of layouts of one model on one machine:
 *  which (tp, pp, dp) gave the most throughput per GPU, at each batch. */
struct PublishedLayoutStudy {
  std::string source;                    //!< who published it, and where
  std::string profile;                   //!< hardware profile file in bench/planner/profiles/
  std::string question;                  //!< e.g. "tensor vs pipeline parallelism"
  PaperTransformer model;                //!< the network (gpus set; tp, pp, batch per point)
  std::vector<std::array<int, 2>> tp_pp; //!< the layouts compared (dp = gpus / (tp pp))
  std::vector<double> batches;           //!< the global batch sizes compared
  std::array<int, 2> published_best{};   //!< the fastest (tp, pp) at every batch
};

/*! \brief Narayanan et al. (SC'21), Figures 13-15, as we read them: on 64
 *  A100s, (1) tensor against pipeline parallelism for a ~162 B GPT: fastest
 *  at tp = 8, the server's size, then pipelines across servers; (2)
 *  pipeline against data parallelism and (3) tensor against data
 *  parallelism for a 5.9 B GPT: the least model parallelism that fits
 *  (two-way) is fastest, data parallelism the rest. The figures do not give
 *  the models' shapes: ours are GPT-3's (96 layers, hidden 12288, 175 B) for
 *  the first and 32 layers of hidden 3840 (5.9 B) for the others. */
inline std::vector<PublishedLayoutStudy> published_megatron_layout_studies() {
  auto gpt = [](char const* name, int layers, double hidden, double heads) {
    PaperTransformer m;
    m.name = name;
    m.layers = layers;
    m.hidden = hidden;
    m.heads = heads;
    m.gpus = 64;
    return m;
  };
  std::string const source = "Megatron-LM (Narayanan et al. 2021), Fig. ";
  std::string const profile = "a100_selene_hdr.json";
  PaperTransformer const big = gpt("GPT 175 B", 96, 12288, 96);
  PaperTransformer const small = gpt("GPT 5.9 B", 32, 3840, 32);
  return {{source + "13",
           profile,
           "tensor vs pipeline parallelism",
           big,
           {{{2, 32}}, {{4, 16}}, {{8, 8}}, {{16, 4}}, {{32, 2}}},
           {32, 128},
           {{8, 8}}},
          {source + "14",
           profile,
           "pipeline vs data parallelism",
           small,
           {{{1, 2}}, {{1, 4}}, {{1, 8}}, {{1, 16}}, {{1, 32}}},
           {32, 128, 512},
           {{1, 2}}},
          {source + "15",
           profile,
           "tensor vs data parallelism",
           small,
           {{{2, 1}}, {{4, 1}}, {{8, 1}}, {{16, 1}}, {{32, 1}}},
           {32, 128, 512},
           {{2, 1}}}};
}

/*! \brief The model's iteration of \p study's network at layout \p k
 *  (study.tp_pp[k]) and global batch \p batch on \p hw. */
inline TransformerIteration predict_layout(PublishedLayoutStudy const& study, std::size_t k,
                                           double batch, MachineProfile const& hw) {
  PaperTransformer m = study.model;
  m.tp = study.tp_pp.at(k)[0];
  m.pp = study.tp_pp.at(k)[1];
  m.global_batch = batch;
  return predict_transformer(m, hw);
}

} // namespace telar
