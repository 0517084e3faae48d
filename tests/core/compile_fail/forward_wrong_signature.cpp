// Must not compile: forward has no saved-state argument.
#include <telar/core/sequential.hpp>

struct NoSavedArgument {
  using value_type = float;
  using memory_space = telar::DefaultMemorySpace;
  telar::Shape output_shape(telar::Shape const& in) const { return in; }
  template <class E>
  void forward(E const&, telar::ConstMatrix<float>, telar::Matrix<float>) const {}
  template <class E>
  void backward_input(E const&, telar::ConstMatrix<float>, telar::Matrix<float>,
                      telar::NoSaved const&) const {}
};

int main() {
  telar::Sequential<NoSavedArgument> model;
}
