// Must not compile: the layer has no forward.
#include <telar/core/sequential.hpp>

struct NoForward {
  using value_type = float;
  using memory_space = telar::DefaultMemorySpace;
  telar::Shape output_shape(telar::Shape const& in) const { return in; }
};

int main() {
  telar::Sequential<NoForward> model;
}
