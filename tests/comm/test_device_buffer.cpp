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

// Views in the default memory space: used in place on host backends, staged
// through a host mirror on GPUs. Telar's ring adds on the host, so its buffer
// is staged even with TELAR_ENABLE_GPU_AWARE_MPI.
TEST_CASE("AllreduceBuffer reduces views of the default memory space", "[comm]") {
  using Space = Kokkos::DefaultExecutionSpace::memory_space;
  using View = Kokkos::View<float*, Space>;
  View v("v", 10);
  Kokkos::parallel_for(
      Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace>(0, 10),
      KOKKOS_LAMBDA(int i) { v(i) = float(i); });
  Kokkos::fence();
  using Buffer = telar::AllreduceBuffer<View, telar::RingAllreduce>;
  static_assert(Buffer::direct == Kokkos::SpaceAccessibility<Kokkos::HostSpace, Space>::accessible);
  static_assert(!telar::allreduce_accepts_device_pointers_v<telar::RingAllreduce>);
  static_assert(telar::allreduce_accepts_device_pointers_v<telar::MpiAllreduce> ==
                bool(TELAR_ENABLE_GPU_AWARE_MPI));
  Buffer buf(v);
  REQUIRE(buf.size() == 10);
  REQUIRE((buf.data() == v.data()) == Buffer::direct);
  telar::Communicator comm(MPI_COMM_WORLD, "world");
  telar::RingAllreduce::allreduce(comm, buf.data(), buf.size());
  buf.copy_back();
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, v);
  for (int i = 0; i < 10; ++i)
    REQUIRE(h(i) == float(i) * comm.size());
}
