// The Trainer types of --precision bf16: each optimizer at ZeRO stage 0
// without recomputation, and their plans (fashion_mnist.hpp says why they
// have their own translation unit).
#include "train.hpp"

namespace fashion_mnist {

// --layout auto / --dry-run / --memory-budget plan the bf16 model under
// the one strategy set compiled for it (stage 0, no recomputation): the
// planner chooses dp x pp x tp, the schedule and the micro-batches.
int train_bf16(MPI_Comm comm, Args a) {
  if constexpr (telar::bf16_layers_supported<T, telar::DefaultMemorySpace>())
    return example::with_optimizer<T>(a.optimizer, usage, [&](auto opt) {
      using S = StrategyFor<0>;
      auto const model = make_model<telar::Bf16Gemm>(a.hidden);
      std::optional<telar::LayoutPlan> plan;
      if (!example::plan_run(comm, a, plan, "fashion_mnist", [&] {
            return example::plan_of<ModelWith<telar::Bf16Gemm>, S, decltype(opt)>(comm, a, model,
                                                                                  784);
          }))
        return 0; // --dry-run
      return train<S>(comm, a, model, opt, plan);
    });
  else
    usage("--precision bf16 needs oneDNN (host memory) or cuBLAS (CUDA memory)");
}

} // namespace fashion_mnist
