// Must not compile: a float layer followed by a double layer.
#include <telar/core/sequential.hpp>
#include <telar/layers/dense.hpp>

int main() {
  telar::Sequential<telar::Dense<float>, telar::Dense<double>> model;
}
