#include "support.hpp"

#include <telar/core/parameters.hpp>
#include <telar/core/sequential.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/dense.hpp>

#include <catch2/catch_test_macros.hpp>

using Model = telar::Sequential<telar::Dense<float>, telar::ReLU<float>, telar::Dense<float>>;

TEST_CASE("ParameterStore binds layer parameters to aligned flat buffers", "[parameters]") {
  Model m(telar::Dense<float>(5, 3), {}, telar::Dense<float>(3, 2));
  m.initialize(1);
  auto w0 = telar::test::to_host(m.layer<0>().weight);
  auto before = Kokkos::create_mirror(w0);
  Kokkos::deep_copy(before, w0);

  telar::ParameterStore<float, telar::DefaultMemorySpace> store;
  store.bind(m, 0, Model::size);
  auto const& e = store.entries();
  REQUIRE(e.size() == 4);
  CHECK(e[0].name == "layer0.weight");
  CHECK(e[1].name == "layer0.bias");
  CHECK(e[2].name == "layer2.weight");
  CHECK(e[3].name == "layer2.bias");
  CHECK(e[0].size == 15);
  for (auto const& p : e)
    CHECK(p.offset % store.alignment == 0);
  CHECK(store.layer_range(0) == std::make_pair(e[0].offset, e[1].offset + e[1].size));
  CHECK(store.layer_range(1) == std::make_pair(std::size_t{0}, std::size_t{0}));

  // The layer now reads and writes the flat buffers.
  CHECK(m.layer<0>().weight.data() == store.values().data() + e[0].offset);
  CHECK(m.layer<2>().bias_grad.data() == store.grads().data() + e[3].offset);
  auto after = telar::test::to_host(m.layer<0>().weight);
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 5; ++j)
      CHECK(after(i, j) == before(i, j));
  auto v = telar::test::to_host(store.values());
  CHECK(v(e[0].offset + 1 * 5 + 2) == before(1, 2));

  // Only the layers asked for.
  Model m2(telar::Dense<float>(5, 3), {}, telar::Dense<float>(3, 2));
  m2.initialize(1, 2, 3);
  telar::ParameterStore<float, telar::DefaultMemorySpace> stage;
  stage.bind(m2, 2, 3);
  CHECK(stage.entries().size() == 2);
  CHECK(stage.entries()[0].name == "layer2.weight");
  CHECK(m2.layer<0>().weight.size() == 0); // never allocated on this "rank"
}
