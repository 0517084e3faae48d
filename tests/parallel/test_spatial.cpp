// Spatial parallelism, first slice: the split of an extent, the halo
// exchange, and Conv2D/Conv3D on slabs against the unsplit layer. Every rank
// of the world is one spatial group (sp = 1, 2, 4); each rank computes the
// whole sample with the plain layer too and compares its own rows: forward
// output, input gradient (through the reverse halo exchange) and the weight
// and bias gradients (summed over the group), in double within 1e-11. Cases
// cover stride, dilation, groups, per-axis kernels, no padding along the
// split axis, pointwise kernels and uneven slabs; the refusals are checked
// for their text.
#include "support.hpp"

#include <telar/comm/halo_exchange.hpp>
#include <telar/layers/conv.hpp>
#include <telar/parallel/spatial_conv.hpp>
#include <telar/parallel/spatial_decomposition.hpp>

#include <catch2/catch_test_macros.hpp>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

namespace {

using T = double;
using M = telar::DefaultMemorySpace;
using Exec = Kokkos::DefaultExecutionSpace;

telar::Communicator world() {
  return telar::Communicator(MPI_COMM_WORLD, "sp");
}

// Rows `slab` of the split axis of x [n, C * rows * plane].
telar::Matrix<T, M> rows_of(telar::Matrix<T, M> const& x, std::size_t C, std::size_t rows,
                            std::size_t plane, telar::Slab slab) {
  telar::Matrix<T, M> out("test::slab", x.extent(0), C * slab.size() * plane);
  telar::detail::copy_rows<T>(Exec{}, {x.data(), rows, slab.begin}, {out.data(), slab.size(), 0},
                              slab.size(), x.extent(0) * C, plane, false);
  Exec{}.fence();
  return out;
}

// max |a - b| / max(1, max |b|) over two views of the same size.
template <class A, class B>
double max_diff(A const& a, B const& b) {
  auto ha = telar::test::to_host(a);
  auto hb = telar::test::to_host(b);
  REQUIRE(ha.span() == hb.span());
  double d = 0, s = 1;
  for (std::size_t i = 0; i < ha.span(); ++i) {
    d = std::max(d, std::abs(double(ha.data()[i]) - double(hb.data()[i])));
    s = std::max(s, std::abs(double(hb.data()[i])));
  }
  return d / s;
}

std::string message_of(std::size_t in, telar::ConvAxis a, int parts) {
  try {
    for (int p = 0; p < parts; ++p)
      telar::conv_slab("Conv3D", in, a, parts, p);
  } catch (telar::ShapeError const& e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST_CASE("split_extent: even and uneven parts cover the extent in order", "[spatial]") {
  std::array<std::size_t, 4> const sizes{3, 3, 2, 2};
  std::size_t next = 0;
  for (int p = 0; p < 4; ++p) {
    telar::Slab const s = telar::split_extent(10, 4, p);
    CHECK(s.begin == next);
    CHECK(s.size() == sizes[std::size_t(p)]);
    next = s.end;
  }
  CHECK(next == 10);
  CHECK(telar::split_extent(8, 2, 1).begin == 4);
}

TEST_CASE("conv_slab: windows, face padding and halo counts", "[spatial]") {
  // k3 s1 p1 over 8 rows, sp 2: rank 0 reads [0, 5) with one zero row before.
  auto const r0 = telar::conv_slab("Conv3D", 8, {3, 1, 1, 1}, 2, 0);
  auto const r1 = telar::conv_slab("Conv3D", 8, {3, 1, 1, 1}, 2, 1);
  CHECK((r0.window.begin == 0 && r0.window.end == 5 && r0.window.pad_front == 1));
  CHECK((r0.window.pad_back == 0 && r1.window.pad_back == 1 && r1.window.pad_front == 0));
  CHECK((r0.halo.recv_hi == 1 && r0.halo.send_hi == 1 && r0.halo.recv_lo == 0));
  CHECK((r1.halo.recv_lo == 1 && r1.halo.send_lo == 1 && r1.halo.recv_hi == 0));
  CHECK(r1.halo.extended_rows() == 5);
  // k3 s2 p0 over 13 rows, sp 4: rank 2 (rows [7, 10)) reads from row 8 only.
  auto const s2 = telar::conv_slab("Conv2D", 13, {3, 2, 0, 1}, 4, 2);
  CHECK((s2.out.begin == 4 && s2.out.end == 5 && s2.window.begin == 8 && s2.window.end == 11));
  CHECK((s2.halo.own_begin == 1 && s2.halo.recv_lo == 0 && s2.halo.recv_hi == 1));
}

TEST_CASE("conv_slab: refusals name the layer, the extent, sp and the rank", "[spatial]") {
  CHECK(message_of(3, {3, 1, 1, 1}, 4) ==
        "telar::SpatialParallel: Conv3D with split extent 3 over sp = 4: the input (3 rows) "
        "leaves rank 3 an empty slab (every rank needs at least one row: sp <= 3)");
  CHECK(message_of(8, {4, 4, 0, 1}, 4) ==
        "telar::SpatialParallel: Conv3D with split extent 8 over sp = 4: the output (2 rows) "
        "leaves rank 3 an empty slab (every rank needs at least one row: sp <= 2)");
  CHECK(message_of(8, {7, 1, 3, 1}, 4) ==
        "telar::SpatialParallel: Conv3D with split extent 8 over sp = 4: rank 0 needs 3 halo "
        "rows from rank 1, whose slab has 2 (a slab thinner than the halo: use a smaller sp)");
}

TEST_CASE("HaloExchange: halo rows arrive, halo gradients return to their owners",
          "[spatial][mpi]") {
  auto comm = world();
  int const P = comm.size(), r = comm.rank();
  std::size_t const n = 2, C = 3, rows = 11, plane = 4, outer = n * C;
  telar::ConvAxis const axis{5, 1, 2, 1};
  auto const s = telar::conv_slab("Conv2D", rows, axis, P, r);
  // x(global row g of block b, element e) = 1000 b + 10 g + e, so every row
  // says where it came from.
  telar::Matrix<T, M> whole("test::whole", n, C * rows * plane);
  auto hw = Kokkos::create_mirror_view(whole);
  for (std::size_t i = 0; i < hw.span(); ++i)
    hw.data()[i] = T(1000 * (i / (rows * plane)) + 10 * ((i / plane) % rows) + i % plane);
  Kokkos::deep_copy(whole, hw);
  auto const x = rows_of(whole, C, rows, plane, s.in);
  std::size_t const E = s.halo.extended_rows();
  REQUIRE(E == s.window.end - s.window.begin);
  telar::Matrix<T, M> ext("test::ext", n, C * E * plane);
  telar::HaloExchange<T, M> halo(comm);
  halo.post(Exec{}, s.halo, x.data(), outer, plane, ext.data());
  halo.finish(Exec{});
  CHECK(max_diff(ext, rows_of(whole, C, rows, plane, {s.window.begin, s.window.end})) == 0);
  // Reverse: dext = 1 everywhere, so each local row's gradient is the
  // number of ranks whose window reads it.
  Kokkos::deep_copy(ext, T(1));
  telar::Matrix<T, M> dx("test::dx", n, C * s.in.size() * plane);
  halo.post_reverse(Exec{}, s.halo, ext.data(), outer, plane, dx.data());
  halo.finish_reverse(Exec{});
  auto hdx = telar::test::to_host(dx);
  bool ok = true;
  for (std::size_t i = 0; i < hdx.span(); ++i) {
    std::size_t const g = s.in.begin + (i / plane) % s.in.size();
    int readers = 0;
    for (int p = 0; p < P; ++p) {
      auto const w = telar::conv_slab("Conv2D", rows, axis, P, p).window;
      readers += g >= w.begin && g < w.end;
    }
    ok = ok && hdx.data()[i] == T(readers);
  }
  CHECK(ok);
}

namespace {

// One convolution: Dims, channels, groups, the whole sample's spatial
// extents, and per-axis kernel, stride, padding and dilation.
struct Case {
  char const* what;
  int dims;
  std::size_t in, out, groups;
  std::array<std::size_t, 3> extent, kernel, stride, padding, dilation;
  bool bias;
};

template <int Dims>
void check_case(Case const& c) {
  using Conv = telar::Convolution<T, Dims, M>;
  using Ext = typename Conv::Extents;
  auto pick = [](std::array<std::size_t, 3> const& a) {
    Ext e{};
    for (int i = 0; i < Dims; ++i)
      e[std::size_t(i)] = a[std::size_t(i)];
    return e;
  };
  Conv const proto(c.in, c.out, pick(c.kernel), pick(c.stride), pick(c.padding), c.bias,
                   pick(c.dilation), c.groups);
  telar::Shape const shape = Dims == 3 ? telar::Shape{c.in, c.extent[0], c.extent[1], c.extent[2]}
                                       : telar::Shape{c.in, c.extent[0], c.extent[1]};
  std::size_t const n = 2, plane = shape.size() / (c.in * c.extent[0]);
  auto comm = world();
  INFO(c.what << ", sp = " << comm.size() << ", rank " << comm.rank());

  Conv whole = proto;
  whole.build(shape);
  whole.initialize(11);
  telar::Shape const oshape = whole.output_shape(shape);
  std::size_t const orows = oshape[1], oplane = oshape.size() / (c.out * orows);
  auto const x = telar::test::random_matrix<T>(n, shape.size(), 5);
  auto const dy = telar::test::random_matrix<T>(n, oshape.size(), 6);
  telar::Matrix<T, M> y("test::y", n, oshape.size()), dx("test::dx", n, shape.size());
  typename Conv::saved_type saved;
  whole.forward(Exec{}, x, y, saved);
  whole.backward_input(Exec{}, dy, dx, saved);
  whole.backward_weight(Exec{}, dy, saved);

  telar::SpatialConv<Conv> split(comm, proto);
  split.build(shape);
  split.initialize(11);
  auto const& s = split.slab();
  CHECK(split.input_shape().size() == c.in * s.in.size() * plane);
  auto const xs = rows_of(x, c.in, c.extent[0], plane, s.in);
  auto const dys = rows_of(dy, c.out, orows, oplane, s.out);
  telar::Matrix<T, M> ys("test::ys", n, split.output_shape().size());
  telar::Matrix<T, M> dxs("test::dxs", n, xs.extent(1));
  typename telar::SpatialConv<Conv>::saved_type ssaved;
  split.forward(Exec{}, xs, ys, ssaved);
  split.backward_input(Exec{}, dys, dxs, ssaved);
  split.backward_weight(Exec{}, dys, ssaved);

  CHECK(max_diff(ys, rows_of(y, c.out, orows, oplane, s.out)) < 1e-11);
  CHECK(max_diff(dxs, rows_of(dx, c.in, c.extent[0], plane, s.in)) < 1e-11);
  CHECK(max_diff(split.layer.weight_grad, whole.weight_grad) < 1e-11);
  if (c.bias)
    CHECK(max_diff(split.layer.bias_grad, whole.bias_grad) < 1e-11);
}

} // namespace

TEST_CASE("SpatialConv equals the unsplit Conv3D and Conv2D on every slab", "[spatial][mpi]") {
  std::vector<Case> const cases{
      {"3-D k3 s1 p1", 3, 2, 3, 1, {8, 4, 3}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, true},
      {"3-D k3 s2 p1, uneven",
       3,
       2,
       3,
       1,
       {9, 3, 4},
       {3, 3, 3},
       {2, 2, 1},
       {1, 1, 1},
       {1, 1, 1},
       true},
      {"3-D k2 s2 p0", 3, 3, 2, 1, {8, 3, 3}, {2, 2, 2}, {2, 2, 2}, {0, 0, 0}, {1, 1, 1}, false},
      {"3-D k3 p2 dilation 2, groups 2, uneven",
       3,
       2,
       4,
       2,
       {10, 3, 3},
       {3, 3, 3},
       {1, 1, 1},
       {2, 1, 1},
       {2, 1, 1},
       true},
      {"3-D pointwise, uneven",
       3,
       3,
       2,
       1,
       {5, 2, 3},
       {1, 1, 1},
       {1, 1, 1},
       {0, 0, 0},
       {1, 1, 1},
       true},
      {"3-D kernel 3x1x3, no depth padding, uneven",
       3,
       2,
       2,
       1,
       {11, 3, 4},
       {3, 1, 3},
       {1, 1, 1},
       {0, 0, 1},
       {1, 1, 1},
       true},
      {"2-D k3 s1 p1, uneven",
       2,
       2,
       3,
       1,
       {7, 5, 0},
       {3, 3, 0},
       {1, 1, 0},
       {1, 1, 0},
       {1, 1, 0},
       true},
      {"2-D k5 p2", 2, 2, 2, 1, {12, 4, 0}, {5, 3, 0}, {1, 1, 0}, {2, 1, 0}, {1, 1, 0}, true},
      {"2-D k3 s2 p0, uneven, a rank skipping its first row",
       2,
       3,
       2,
       1,
       {13, 6, 0},
       {3, 3, 0},
       {2, 1, 0},
       {0, 1, 0},
       {1, 1, 0},
       true},
  };
  for (auto const& c : cases) {
    if (c.dims == 3)
      check_case<3>(c);
    else
      check_case<2>(c);
  }
}

TEST_CASE("SpatialConv refuses a split on every rank before any message", "[spatial][mpi]") {
  auto comm = world();
  int const P = comm.size();
  if (P < 2)
    return; // sp = 1 splits nothing
  auto refusal = [&](std::size_t depth) {
    telar::SpatialConv<telar::Conv3D<T>> conv(comm, telar::Conv3D<T>(1, 1, 7, 1, 3));
    try {
      conv.build({1, depth, 3, 3});
    } catch (telar::ShapeError const& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string const where = "telar::SpatialParallel: Conv3D with split extent ";
  CHECK(refusal(std::size_t(P - 1)) ==
        where + std::to_string(P - 1) + " over sp = " + std::to_string(P) + ": the input (" +
            std::to_string(P - 1) + " rows) leaves rank " + std::to_string(P - 1) +
            " an empty slab (every rank needs at least one row: "
            "sp <= " +
            std::to_string(P - 1) + ")");
  if (P == 4) // two ranks: the neighbour holds every other row
    CHECK(refusal(8) == where + "8 over sp = 4: rank 0 needs 3 halo rows from rank 1, whose "
                                "slab has 2 (a slab thinner than the halo: use a smaller sp)");
}
