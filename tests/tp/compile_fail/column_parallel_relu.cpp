// Must not compile: ReLU has no weight matrix to split by columns.
#include <telar/layers/activation.hpp>
#include <telar/parallel/tensor_parallel.hpp>

int main() {
  telar::ColumnParallel<telar::ReLU<float>> layer;
}
