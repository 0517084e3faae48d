// Must not compile: a join of a float branch and a double branch.
#include <telar/core/branches.hpp>
#include <telar/layers/dense.hpp>

int main() {
  telar::Concat<telar::Dense<float>, telar::Dense<double>> block;
}
