// The Trainer types of --optimizer lamb (fashion_mnist.hpp says why each
// optimizer has its own translation unit).
#include "train.hpp"

namespace fashion_mnist {
template int train_model(MPI_Comm, Args const&, telar::LAMB<T>);
} // namespace fashion_mnist
