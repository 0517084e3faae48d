// The Trainer types of --optimizer adam (fashion_mnist.hpp says why each
// optimizer has its own translation unit).
#include "train.hpp"

namespace fashion_mnist {
template int train_model(MPI_Comm, Args const&, telar::Adam<T>);
} // namespace fashion_mnist
