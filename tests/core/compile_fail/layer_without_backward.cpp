// Must not compile: the layer has forward but no backward of either kind.
#include <telar/core/sequential.hpp>

struct NoBackward {
  using value_type = float;
  using memory_space = telar::DefaultMemorySpace;
  telar::Shape output_shape(telar::Shape const& in) const { return in; }
  template <class E>
  void forward(E const&, telar::ConstMatrix<float>, telar::Matrix<float>, telar::NoSaved&) const {}
};

int main() {
  telar::Sequential<NoBackward> model;
}
