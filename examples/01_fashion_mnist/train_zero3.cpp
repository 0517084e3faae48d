// The Trainer types of --zero 3 (fashion_mnist.hpp says why each
// ZeRO stage has its own translation unit).
#include "train.hpp"

namespace fashion_mnist {
template int train_stage<3>(MPI_Comm, Args const&, std::optional<telar::LayoutPlan> const&);
} // namespace fashion_mnist
