// telar::HostBuffer: host views are used in place; the staging path copies
// in and back.
#include <telar/comm/allreduce.hpp>
#include <telar/comm/device_buffer.hpp>

#include <catch2/catch_test_macros.hpp>

#include <Kokkos_Core.hpp>

TEST_CASE("HostBuffer exposes host views without copying", "[comm]") {
  Kokkos::View<float*, Kokkos::HostSpace> v("v", 10);
  for (int i = 0; i < 10; ++i)
    v(i) = float(i);
  telar::HostBuffer<decltype(v)> buf(v);
  static_assert(telar::HostBuffer<decltype(v)>::direct);
  REQUIRE(buf.data() == v.data());
  REQUIRE(buf.size() == 10);
  telar::Communicator comm(MPI_COMM_WORLD, "world");
  telar::RingAllreduce::allreduce(comm, buf.data(), buf.size());
  buf.copy_back();
  REQUIRE(v(3) == 3.f * comm.size());
}

TEST_CASE("HostBuffer rejects non-contiguous views", "[comm]") {
  Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> m("m", 4, 4);
  auto col = Kokkos::subview(m, Kokkos::ALL, 1);
  REQUIRE_THROWS_AS(telar::HostBuffer<decltype(col)>(col), std::invalid_argument);
}
