// Must not compile: the Trainer's models take whole samples, so a strategy
// that splits them (SpatialParallel) is refused at compile time.
#include <telar/layers/dense.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/train/trainer.hpp>

int main() {
  using Model = telar::Sequential<telar::Dense<float>>;
  using S = telar::Strategy<telar::DataParallel<>, telar::SpatialParallel>;
  telar::Trainer<Model, S, telar::SGD<float>> t(MPI_COMM_WORLD, Model(telar::Dense<float>(4, 2)),
                                                {}, {}, 4);
}
