// The Trainer types of --zero 3 --recompute none (fashion_mnist.hpp says why each
// ZeRO stage and model has its own translation unit).
#include "train.hpp"

namespace fashion_mnist {
template int train_stage<3, false>(MPI_Comm, Args const&, std::optional<telar::LayoutPlan> const&);
} // namespace fashion_mnist
