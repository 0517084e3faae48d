// The Trainer types of --precision bf16: each optimizer at ZeRO stage 0
// without recomputation (fashion_mnist.hpp says why they have their own
// translation unit).
#include "train.hpp"

namespace fashion_mnist {

int train_bf16(MPI_Comm comm, Args const& a) {
  if constexpr (telar::Bf16Gemm::supports<T, telar::DefaultMemorySpace>())
    return example::with_optimizer<T>(a.optimizer, usage, [&](auto opt) {
      return train<StrategyFor<0>>(comm, a, make_model<telar::Bf16Gemm>(a.hidden), opt,
                                   std::nullopt);
    });
  else
    usage("--precision bf16 needs oneDNN and host memory (telar::Bf16Gemm)");
}

} // namespace fashion_mnist
