// Must not compile: GELU has no weight matrix to split by rows.
#include <telar/layers/activation.hpp>
#include <telar/parallel/tensor_parallel.hpp>

int main() {
  telar::RowParallel<telar::GELU<double>> layer;
}
