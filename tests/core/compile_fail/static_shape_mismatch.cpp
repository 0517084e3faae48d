// Must not compile: 784 -> 256, then a layer expecting 128 (through a ReLU).
#include <telar/core/sequential.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>

int main() {
  telar::Sequential<telar::StaticDense<float, 784, 256>, telar::ReLU<float>,
                    telar::StaticDense<float, 128, 10>>
      model;
}
