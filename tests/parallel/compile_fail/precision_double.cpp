// Must not compile: bf16 compute asked of a double layer (the bf16 policies
// multiply float layers in host memory).
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>
#include <telar/parallel/precision.hpp>

int main() {
  using Model = telar::Sequential<telar::Dense<double>, telar::ReLU<double>>;
  telar::WithPrecision<Model, telar::Precision<telar::bf16, float>> m;
}
