// Must not compile: the layer has no forward.
#include <telar/core/sequential.hpp>

struct NoForward {
  using value_type = float;
  using memory_space = telar::DefaultMemorySpace;
  std::size_t output_features(std::size_t in) const { return in; }
};

int main() {
  telar::Sequential<NoForward> model;
}
