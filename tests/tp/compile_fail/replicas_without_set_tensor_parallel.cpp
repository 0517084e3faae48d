// Must not compile: parameter_replicas without set_tensor_parallel cannot
// know the size of the group it answers for.
#include <telar/core/sequential.hpp>

struct Replicated {
  using value_type = float;
  using memory_space = telar::DefaultMemorySpace;
  telar::Shape output_shape(telar::Shape const& in) const { return in; }
  template <class Exec>
  void forward(Exec const&, telar::ConstMatrix<float>, telar::Matrix<float>,
               telar::NoSaved&) const {}
  template <class Exec>
  void backward_input(Exec const&, telar::ConstMatrix<float>, telar::Matrix<float>,
                      telar::NoSaved const&) const {}
  int parameter_replicas(std::string const&) const { return 2; }
};

int main() {
  telar::Sequential<Replicated> model;
}
