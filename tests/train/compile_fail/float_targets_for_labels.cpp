// Must not compile: floating-point targets given to a loss of class labels
// (SoftmaxCrossEntropy's target_type is telar::Labels<>).
#include <telar/layers/dense.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/train/trainer.hpp>

int main() {
  using Model = telar::Sequential<telar::Dense<float>>;
  telar::Trainer<Model, telar::Serial, telar::SGD<float>> trainer(Model(telar::Dense<float>(4, 2)),
                                                                  {}, {}, 4);
  telar::Matrix<float> x("x", 8, 4), y("y", 8, 2);
  trainer.step(x, y);
}
