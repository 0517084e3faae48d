#include "support.hpp"

#include <telar/core/sequential.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>

#include <catch2/catch_test_macros.hpp>

using Model = telar::Sequential<telar::Dense<float>, telar::ReLU<float>, telar::Dense<float>>;

TEST_CASE("Sequential computes the feature sizes along the chain", "[sequential]") {
  Model m(telar::Dense<float>(784, 256), {}, telar::Dense<float>(256, 10));
  CHECK(m.feature_sizes(784) == std::vector<std::size_t>{784, 256, 256, 10});
  CHECK(m.layer_names() == std::vector<std::string>{"Dense", "ReLU", "Dense"});
  CHECK(Model::size == 3);
}

TEST_CASE("Sequential names the layer and the shapes of a run-time mismatch", "[sequential]") {
  Model m(telar::Dense<float>(784, 256), {}, telar::Dense<float>(128, 10));
  try {
    m.feature_sizes(784);
    FAIL("no exception");
  } catch (telar::ShapeError const& e) {
    CHECK(std::string(e.what()) == "telar::Sequential: layer 2 (Dense) cannot take input [256] "
                                   "from layer 1 (ReLU): Dense expects inputs [..., 128]");
  }
  try {
    m.feature_sizes(100);
    FAIL("no exception");
  } catch (telar::ShapeError const& e) {
    CHECK(std::string(e.what()) == "telar::Sequential: layer 0 (Dense) cannot take input [100] "
                                   "from the model input: Dense expects inputs [..., 784]");
  }
}

TEST_CASE("Static shapes flow through shape-preserving layers", "[sequential]") {
  using Static = telar::Sequential<telar::StaticDense<float, 8, 4>, telar::GELU<float>,
                                   telar::StaticDense<float, 4, 2>>;
  constexpr auto flow =
      telar::detail::static_shape_flow<telar::StaticDense<float, 8, 4>, telar::GELU<float>,
                                       telar::StaticDense<float, 4, 2>>();
  STATIC_REQUIRE(flow[0] == telar::Shape(8));
  STATIC_REQUIRE(flow[2] == telar::Shape(4));
  STATIC_REQUIRE(flow[3] == telar::Shape(2));
  Static s;
  CHECK(s.feature_sizes(8).back() == 2);
}

TEST_CASE("Layers are initialised from the model seed, independent of order", "[sequential]") {
  Model a(telar::Dense<float>(6, 5), {}, telar::Dense<float>(5, 3));
  Model b(telar::Dense<float>(6, 5), {}, telar::Dense<float>(5, 3));
  a.initialize(9);
  b.initialize(9, 2, 3); // only the last layer, as a pipeline stage would
  b.initialize(9, 0, 2);
  auto wa = telar::test::to_host(a.layer<2>().weight),
       wb = telar::test::to_host(b.layer<2>().weight);
  auto va = telar::test::to_host(a.layer<0>().weight),
       vb = telar::test::to_host(b.layer<0>().weight);
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 5; ++j)
      CHECK(wa(i, j) == wb(i, j));
  for (std::size_t i = 0; i < 5; ++i)
    for (std::size_t j = 0; j < 6; ++j)
      CHECK(va(i, j) == vb(i, j));
  CHECK(wa(0, 0) != va(0, 0));
}

// A user layer with only a fused backward and its own saved state.
struct Square {
  using value_type = double;
  using memory_space = telar::DefaultMemorySpace;
  struct saved_type {
    telar::ConstMatrix<double> x;
  };
  telar::Shape output_shape(telar::Shape const& in) const { return in; }
  template <class E>
  void forward(E const& e, telar::ConstMatrix<double> x, telar::Matrix<double> y,
               saved_type& s) const {
    s.x = x;
    Kokkos::parallel_for(
        Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(e, {0, 0}, {x.extent(0), x.extent(1)}),
        KOKKOS_LAMBDA(int i, int j) { y(i, j) = x(i, j) * x(i, j); });
  }
  template <class E>
  void backward(E const& e, telar::ConstMatrix<double> dy, telar::Matrix<double> dx,
                saved_type const& s) const {
    auto x = s.x;
    Kokkos::parallel_for(
        Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(e, {0, 0}, {dy.extent(0), dy.extent(1)}),
        KOKKOS_LAMBDA(int i, int j) { dx(i, j) = 2 * x(i, j) * dy(i, j); });
  }
};

TEST_CASE("A user layer with a fused backward satisfies the concept", "[sequential]") {
  STATIC_REQUIRE(telar::is_layer_v<Square>);
  STATIC_REQUIRE(telar::layer_traits<Square>::has_fused_backward);
  STATIC_REQUIRE_FALSE(telar::layer_traits<Square>::has_split_backward);
  STATIC_REQUIRE_FALSE(telar::is_layer_v<int>);
  telar::Sequential<telar::Dense<double>, Square, telar::Dense<double>> m(
      telar::Dense<double>(3, 4), {}, telar::Dense<double>(4, 2));
  CHECK(m.feature_sizes(3) == std::vector<std::size_t>{3, 4, 4, 2});
}
