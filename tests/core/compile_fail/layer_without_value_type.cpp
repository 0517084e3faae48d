// Must not compile: the layer does not say its value type.
#include <telar/core/sequential.hpp>

struct NoValueType {
  using memory_space = telar::DefaultMemorySpace;
};

int main() {
  telar::Sequential<NoValueType> model;
}
