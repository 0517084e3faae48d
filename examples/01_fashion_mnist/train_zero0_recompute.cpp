// The Trainer types of --zero 0 --recompute full (fashion_mnist.hpp says why each
// ZeRO stage and model has its own translation unit).
#include "train.hpp"

namespace fashion_mnist {
template int train_stage<0, true>(MPI_Comm, Args const&, std::optional<telar::LayoutPlan> const&);
} // namespace fashion_mnist
