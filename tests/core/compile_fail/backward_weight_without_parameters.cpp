// Must not compile: the layer has backward_weight but does not expose its
// parameters, so Telar could never reduce, shard or update them.
#include <telar/core/sequential.hpp>

struct HiddenWeights {
  using value_type = float;
  using memory_space = telar::DefaultMemorySpace;
  telar::Shape output_shape(telar::Shape const& in) const { return in; }
  template <class E>
  void forward(E const&, telar::ConstMatrix<float>, telar::Matrix<float>, telar::NoSaved&) const {}
  template <class E>
  void backward_input(E const&, telar::ConstMatrix<float>, telar::Matrix<float>,
                      telar::NoSaved const&) const {}
  template <class E>
  void backward_weight(E const&, telar::ConstMatrix<float>, telar::NoSaved const&) const {}
  telar::Vector<float> weight, weight_grad;
};

int main() {
  telar::Sequential<HiddenWeights> model;
}
