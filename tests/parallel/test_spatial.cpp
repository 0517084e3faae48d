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
#include <telar/layers/activation.hpp>
#include <telar/layers/batch_norm.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/conv_transpose.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/layers/upsample.hpp>
#include <telar/layers/voxel_losses.hpp>
#include <telar/parallel/slab_step_cost.hpp>
#include <telar/parallel/spatial_conv.hpp>
#include <telar/parallel/spatial_decomposition.hpp>
#include <telar/parallel/spatial_dense.hpp>
#include <telar/parallel/spatial_global.hpp>
#include <telar/parallel/spatial_local.hpp>
#include <telar/parallel/spatial_loss.hpp>
#include <telar/parallel/spatial_norm.hpp>
#include <telar/parallel/spatial_unet.hpp>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using T = double;
// Slabs live where halos can be staged (host memory on a device build).
using M = telar::SlabMemorySpace;
using Exec = telar::SlabExecutionSpace;

telar::Communicator world() {
  return telar::Communicator(MPI_COMM_WORLD, "sp");
}

// Rows `slab` of the split axis of x [n, C * rows * plane].
template <class V = T>
telar::Matrix<V, M> rows_of(telar::Matrix<V, M> const& x, std::size_t C, std::size_t rows,
                            std::size_t plane, telar::Slab slab) {
  telar::Matrix<V, M> out("test::slab", x.extent(0), C * slab.size() * plane);
  telar::detail::copy_rows<V>(Exec{}, {x.data(), rows, slab.begin}, {out.data(), slab.size(), 0},
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

template <class V, int Dims, class Gemm = telar::AutoGemm, class Policy = telar::AutoConv>
void check_case(Case const& c, double tol = 1e-11) {
  using Conv = telar::Convolution<V, Dims, M, Gemm, Policy>;
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
  auto const x = telar::test::random_matrix<V, M>(n, shape.size(), 5);
  auto const dy = telar::test::random_matrix<V, M>(n, oshape.size(), 6);
  telar::Matrix<V, M> y("test::y", n, oshape.size()), dx("test::dx", n, shape.size());
  typename Conv::saved_type saved;
  whole.forward(Exec{}, x, y, saved);
  whole.backward_input(Exec{}, dy, dx, saved);
  whole.backward_weight(Exec{}, dy, saved);

  telar::SpatialConv<Conv> split(comm, proto);
  split.build(shape);
  split.initialize(11);
  auto const& s = split.slab();
  CHECK(split.input_shape().size() == c.in * s.in.size() * plane);
  auto const xs = rows_of<V>(x, c.in, c.extent[0], plane, s.in);
  auto const dys = rows_of<V>(dy, c.out, orows, oplane, s.out);
  telar::Matrix<V, M> ys("test::ys", n, split.output_shape().size());
  telar::Matrix<V, M> dxs("test::dxs", n, xs.extent(1));
  typename telar::SpatialConv<Conv>::saved_type ssaved;
  split.forward(Exec{}, xs, ys, ssaved);
  split.backward_input(Exec{}, dys, dxs, ssaved);
  split.backward_weight(Exec{}, dys, ssaved);
  // At sp = 2 a 3-row window over 4+ rows leaves each rank an interior,
  // computed while the halo travels (the faces after): that path ran.
  if (comm.size() == 2 && c.kernel[0] == 3 && c.stride[0] == 1 && c.dilation[0] == 1 &&
      c.extent[0] >= 8) {
    auto const inner = split.overlap_rows(1);
    CHECK(inner[1] > inner[0]);
    CHECK(split.overlap_rows(comm.rank() == 0 ? 2 : 0)[1] >
          split.overlap_rows(comm.rank() == 0 ? 2 : 0)[0]);
  }

  CHECK(max_diff(ys, rows_of<V>(y, c.out, orows, oplane, s.out)) < tol);
  CHECK(max_diff(dxs, rows_of<V>(dx, c.in, c.extent[0], plane, s.in)) < tol);
  CHECK(max_diff(split.layer.weight_grad, whole.weight_grad) < tol);
  if (c.bias)
    CHECK(max_diff(split.layer.bias_grad, whole.bias_grad) < tol);

  // The fused backward (SlabGraph's): the weight gradient computed while
  // the halo gradients travel gives the same dx and dW.
  telar::SpatialConv<Conv> fused(comm, proto);
  fused.build(shape);
  fused.initialize(11);
  telar::Matrix<V, M> yf("test::yf", n, ys.extent(1)), dxf("test::dxf", n, xs.extent(1));
  typename telar::SpatialConv<Conv>::saved_type fsaved;
  fused.forward(Exec{}, xs, yf, fsaved);
  fused.backward(Exec{}, dys, dxf, fsaved);
  CHECK(max_diff(dxf, rows_of<V>(dx, c.in, c.extent[0], plane, s.in)) < tol);
  CHECK(max_diff(fused.layer.weight_grad, whole.weight_grad) < tol);
  if (c.bias)
    CHECK(max_diff(fused.layer.bias_grad, whole.bias_grad) < tol);
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
      check_case<T, 3>(c);
    else
      check_case<T, 2>(c);
  }
  // float runs oneDNN, with asymmetric padding at the volume's faces.
  check_case<float, 3>(cases[0], 1e-5);
  // 16 channels: oneDNN's blocked layouts, into which the input is converted
  // (reordered) once per micro-batch and that copy shared by the weight
  // gradient. Under overlap the forward converts the slab before its halo
  // rows arrive: the weight gradient must convert it again (it reused the
  // stale copy: 7e-4 off at sp = 2 in example 07 at width 16).
  Case const wide{"3-D k3 s1 p1, 16 channels",
                  3,
                  16,
                  16,
                  1,
                  {8, 4, 4},
                  {3, 3, 3},
                  {1, 1, 1},
                  {1, 1, 1},
                  {1, 1, 1},
                  false};
  check_case<float, 3>(wide, 1e-5);
#if TELAR_HAVE_ONEDNN
  // And in bf16 (telar::OneDnnConvBf16: both sides round the same values).
  if (telar::bf16_available())
    check_case<float, 3, telar::Bf16Gemm, telar::OneDnnConvBf16>(wide, 1e-5);
#endif
}

TEST_CASE("SpatialConv refuses a split on every rank before any message", "[spatial][mpi]") {
  auto comm = world();
  int const P = comm.size();
  if (P < 2)
    return; // sp = 1 splits nothing
  auto refusal = [&](std::size_t depth) {
    telar::SpatialConv<telar::Conv3D<T, M>> conv(comm, telar::Conv3D<T, M>(1, 1, 7, 1, 3));
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

namespace {

using BN = telar::BatchNorm<T, M, telar::SyncStats>;

// f(value, gradient) for every parameter of l (none for an activation).
template <class L, class F>
void visit(L& l, F&& f) {
  if constexpr (telar::layer_traits<L>::has_parameters)
    l.parameters([&](char const*, auto& v, auto& g) { f(v, g); });
}

// Serial parameters a and split ones b after training from `initial`:
// equal within 1e-11, and moved (not a comparison of the seeds).
void check_trained(std::vector<double> const& a, std::vector<double> const& b,
                   std::vector<double> const& initial) {
  REQUIRE(a.size() == b.size());
  double worst = 0, moved = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
    moved = std::max(moved, std::abs(a[i] - initial[i]));
  }
  CHECK(worst < 1e-11);
  CHECK(moved > 1e-4);
}

// Every parameter of `layers` (a tuple), flattened, as a host vector.
template <class Tuple>
std::vector<double> flat_parameters(Tuple& layers) {
  std::vector<double> all;
  std::apply(
      [&](auto&... l) {
        (visit(l,
               [&](auto& v, auto&) {
                 auto h = telar::test::to_host(v);
                 all.insert(all.end(), h.data(), h.data() + h.span());
               }),
         ...);
      },
      layers);
  return all;
}

// Layer J's backward: input gradient (not for the first layer), then its
// parameter gradient.
template <std::size_t J, class Tuple, class Saved, class G>
void backward_at(Tuple& layers, Saved& saved, G& g) {
  auto& l = std::get<J>(layers);
  if constexpr (J > 0)
    l.backward_input(Exec{}, g[J], g[J - 1], std::get<J>(saved));
  if constexpr (telar::layer_traits<std::decay_t<decltype(l)>>::has_backward_weight)
    l.backward_weight(Exec{}, g[J], std::get<J>(saved));
}

// One SGD step (lr 0.05) of a chain of layers on L = 0.5 scale sum y^2 over
// this rank's outputs (scale: 1 / outputs in the whole batch); `cols` are the activations' sizes
// per sample. The same code drives the plain layers (serial) and the spatial wrappers.
template <class Tuple, std::size_t... I>
void sgd_step(Tuple& layers, telar::Matrix<T, M> const& x, std::vector<std::size_t> const& cols,
              T scale, std::index_sequence<I...>) {
  constexpr std::size_t N = sizeof...(I);
  std::size_t const n = x.extent(0);
  std::vector<telar::Matrix<T, M>> y(N), g(N);
  for (std::size_t i = 0; i < N; ++i) {
    y[i] = telar::Matrix<T, M>("test::y", n, cols[i]);
    g[i] = telar::Matrix<T, M>("test::g", n, cols[i]);
  }
  std::tuple<typename telar::layer_traits<std::tuple_element_t<I, Tuple>>::saved_type...> saved;
  (std::get<I>(layers).forward(Exec{}, I == 0 ? x : y[I - (I > 0)], y[I], std::get<I>(saved)), ...);
  for (std::size_t i = 0; i < y[N - 1].span(); ++i) // dL/dy = scale y
    g[N - 1].data()[i] = scale * y[N - 1].data()[i];
  (backward_at<N - 1 - I>(layers, saved, g), ...);
  Exec{}.fence();
  std::apply(
      [&](auto&... l) {
        (visit(l,
               [&](auto& v, auto& dv) {
                 for (std::size_t i = 0; i < v.span(); ++i) {
                   v.data()[i] -= T(0.05) * dv.data()[i];
                   dv.data()[i] = T(0);
                 }
               }),
         ...);
      },
      layers);
}

// Builds and initialises (seed 20 + i) every layer of a chain. Plain
// layers (Split false) take their input's shape, starting from whole[0];
// spatial wrappers take the whole shape of their input, whole[i]. Returns
// the whole shapes of every layer's input and of the chain's output.
template <bool Split, class Tuple, std::size_t... I>
std::vector<telar::Shape> build_chain(Tuple& layers, std::vector<telar::Shape> whole,
                                      std::index_sequence<I...>) {
  auto one = [&](auto& l, std::size_t i) {
    using L = std::decay_t<decltype(l)>;
    if constexpr (telar::layer_traits<L>::has_build)
      l.build(whole[i]);
    if constexpr (telar::layer_traits<L>::has_initialize)
      l.initialize(20 + i);
    if constexpr (!Split)
      whole.push_back(l.output_shape(whole[i]));
  };
  (one(std::get<I>(layers), I), ...);
  return whole;
}

} // namespace

namespace {

// A normalisation on slabs (split, built for `shape`) against the unsplit
// layer: outputs, input gradient, gamma and beta gradients, within 1e-11.
template <class Whole, class Split>
void check_norm(Whole& whole, Split& split, telar::Shape const& shape) {
  std::size_t const n = 2, C = shape[0], rows = shape[1], plane = shape.size() / (C * rows);
  auto const x = telar::test::random_matrix<T, M>(n, shape.size(), 8);
  auto const dy = telar::test::random_matrix<T, M>(n, shape.size(), 9);
  telar::Matrix<T, M> y("test::y", n, shape.size()), dx("test::dx", n, shape.size());
  typename Whole::saved_type saved;
  typename Split::saved_type ssaved;
  whole.forward(Exec{}, x, y, saved);
  whole.backward_input(Exec{}, dy, dx, saved);
  whole.backward_weight(Exec{}, dy, saved);
  auto const xs = rows_of(x, C, rows, plane, split.slab());
  auto const dys = rows_of(dy, C, rows, plane, split.slab());
  telar::Matrix<T, M> ys("test::ys", n, xs.extent(1)), dxs("test::dxs", n, xs.extent(1));
  split.forward(Exec{}, xs, ys, ssaved);
  split.backward_input(Exec{}, dys, dxs, ssaved);
  split.backward_weight(Exec{}, dys, ssaved);
  CHECK(split.whole_output_shape() == shape);
  CHECK(max_diff(ys, rows_of(y, C, rows, plane, split.slab())) < 1e-11);
  CHECK(max_diff(dxs, rows_of(dx, C, rows, plane, split.slab())) < 1e-11);
  CHECK(max_diff(split.layer.weight_grad, whole.weight_grad) < 1e-11);
  CHECK(max_diff(split.layer.bias_grad, whole.bias_grad) < 1e-11);
}

} // namespace

TEST_CASE("SpatialLocal BatchNorm: statistics and gradients over the group", "[spatial][mpi]") {
  auto comm = world();
  telar::Shape const shape{3, 9, 2, 3};
  BN whole(3);
  whole.initialize(1);
  telar::SpatialLocal<BN> split(comm, BN(3));
  split.build(shape);
  split.initialize(1);
  check_norm(whole, split, shape);
  CHECK(max_diff(split.layer.running_var, whole.running_var) < 1e-11);
}

TEST_CASE("SpatialGroupNorm: per-sample statistics and gradients over the group",
          "[spatial][mpi]") {
  // 6 channels in 3 groups over depth 9 (uneven at sp = 2 and 4).
  auto comm = world();
  telar::Shape const shape{6, 9, 2, 3};
  telar::GroupNorm<T, M> whole(3, 6);
  whole.initialize(1);
  telar::SpatialGroupNorm<T, M> split(comm, telar::GroupNorm<T, M>(3, 6));
  split.build(shape);
  split.initialize(1);
  for (auto* l : {&whole, &split.layer}) { // gamma and beta away from 1 and 0
    for (std::size_t c = 0; c < 6; ++c)
      l->weight(c) = T(0.5 + 0.1 * double(c)), l->bias(c) = T(0.2 * double(c));
  }
  check_norm(whole, split, shape);
}

TEST_CASE("A U-Net-like chain on slabs trains to the serial parameters", "[spatial][mpi]") {
  // Conv3D -> BatchNorm -> ReLU -> MaxPool 2 -> Conv3D -> Upsample 2 ->
  // Conv3D, three SGD steps on slabs of depth 12 (uneven slabs below).
  auto comm = world();
  telar::Shape const shape{2, 12, 4, 4};
  std::size_t const n = 2;
  telar::Conv3D<T, M> const c0(2, 4, 3, 1, 1), c1(4, 4, 3, 1, 1), c2(4, 2, 3, 1, 1);
  telar::MaxPool<3, T, M> const pool(2);
  telar::Upsample<T, M> const up({2, 2, 2});
  auto serial = std::make_tuple(c0, BN(4), telar::ReLU<T, M>{}, pool, c1, up, c2);
  auto split = std::make_tuple(telar::SpatialConv<telar::Conv3D<T, M>>(comm, c0),
                               telar::SpatialLocal<BN>(comm, BN(4)),
                               telar::SpatialLocal<telar::ReLU<T, M>>(comm, telar::ReLU<T, M>{}),
                               telar::SpatialPool<telar::MaxPool<3, T, M>>(comm, pool),
                               telar::SpatialConv<telar::Conv3D<T, M>>(comm, c1),
                               telar::SpatialUpsample<telar::Upsample<T, M>>(comm, up),
                               telar::SpatialConv<telar::Conv3D<T, M>>(comm, c2));
  auto const seq = std::make_index_sequence<7>{};
  auto const shapes = build_chain<false>(serial, {shape}, seq);
  build_chain<true>(split, shapes, seq);
  std::vector<std::size_t> whole_cols, slab_cols;
  std::apply([&](auto&... l) { (slab_cols.push_back(l.output_shape().size()), ...); }, split);
  for (std::size_t i = 1; i < shapes.size(); ++i)
    whole_cols.push_back(shapes[i].size());
  auto const& s0 = std::get<0>(split).slab();
  auto const initial = flat_parameters(serial);
  for (int step = 0; step < 3; ++step) {
    auto const x = telar::test::random_matrix<T, M>(n, shape.size(), 30 + std::uint64_t(step));
    T const scale = T(1) / T(n * whole_cols.back());
    sgd_step(serial, x, whole_cols, scale, seq);
    sgd_step(split, rows_of(x, 2, shape[1], 16, s0.in), slab_cols, scale, seq);
  }
  auto const a = flat_parameters(serial), b = flat_parameters(split);
  check_trained(a, b, initial);
  CHECK(max_diff(std::get<1>(split).layer.running_mean, std::get<1>(serial).running_mean) < 1e-11);
}

namespace {

// A layer without a halo-free footprint (pooling, upsampling, transposed
// convolution) on slabs against the unsplit one: output, input gradient,
// and parameter gradients (summed over the group) where it has parameters.
template <class Pool>
void check_pool(Pool const& proto, telar::Shape const& shape) {
  auto comm = world();
  INFO(Pool::name() << " over " << shape.str() << ", sp = " << comm.size() << ", rank "
                    << comm.rank());
  constexpr bool params = telar::layer_traits<Pool>::has_parameters;
  std::size_t const n = 2, C = shape[0], rows = shape[1], plane = shape.size() / (C * rows);
  Pool whole = proto;
  whole.build(shape);
  telar::SpatialConv<Pool> split(comm, proto);
  split.build(shape);
  if constexpr (params) {
    whole.initialize(3);
    split.initialize(3);
  }
  telar::Shape const out = whole.output_shape(shape);
  std::size_t const Co = out[0], oplane = out.size() / (Co * out[1]);
  auto const x = telar::test::random_matrix<T, M>(n, shape.size(), 12);
  auto const dy = telar::test::random_matrix<T, M>(n, out.size(), 13);
  telar::Matrix<T, M> y("test::y", n, out.size()), dx("test::dx", n, shape.size());
  typename telar::layer_traits<Pool>::saved_type saved;
  whole.forward(Exec{}, x, y, saved);
  whole.backward_input(Exec{}, dy, dx, saved);

  auto const& s = split.slab();
  telar::Matrix<T, M> ys("test::ys", n, split.output_shape().size());
  telar::Matrix<T, M> dxs("test::dxs", n, split.input_shape().size());
  typename telar::SpatialConv<Pool>::saved_type ssaved;
  auto const dys = rows_of(dy, Co, out[1], oplane, s.out);
  split.forward(Exec{}, rows_of(x, C, rows, plane, s.in), ys, ssaved);
  split.backward_input(Exec{}, dys, dxs, ssaved);
  CHECK(max_diff(ys, rows_of(y, Co, out[1], oplane, s.out)) < 1e-11);
  CHECK(max_diff(dxs, rows_of(dx, C, rows, plane, s.in)) < 1e-11);
  if constexpr (params) {
    whole.backward_weight(Exec{}, dy, saved);
    split.backward_weight(Exec{}, dys, ssaved);
    std::vector<double> a, b;
    visit(whole, [&](auto&, auto& g) { a.insert(a.end(), g.data(), g.data() + g.span()); });
    visit(split.layer, [&](auto&, auto& g) { b.insert(b.end(), g.data(), g.data() + g.span()); });
    REQUIRE(a.size() == b.size());
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
      worst = std::max(worst, std::abs(a[i] - b[i]));
    CHECK(worst < 1e-11);
  }
}

} // namespace

TEST_CASE("SpatialPool equals the unsplit MaxPool and AvgPool on every slab", "[spatial][mpi]") {
  using Max3 = telar::MaxPool<3, T, M>;
  using Avg3 = telar::AvgPool<3, T, M>;
  check_pool(Max3(2), {2, 9, 4, 3});        // tiled 2 / 2, uneven, a row no window reads
  check_pool(Max3(3, 2, 1), {2, 10, 3, 3}); // overlapping windows, padding at the faces
  check_pool(Avg3(3, 2, 1), {2, 11, 3, 2}); // padding counted in the divisor
  check_pool(Avg3(3, 1, 1, false, false), {1, 8, 2, 3}); // padding not counted
  check_pool(telar::MaxPool<2, T, M>(3, 1, 1), {2, 7, 5});
}

namespace {
// A global pool over slabs against the unsplit one: the output on every
// rank, and the input gradient of each slab. Channel 0 is constant, so the
// max pool's ties span the slabs (the unsplit layer takes the first voxel).
template <class Whole, class Split>
void check_global_pool(telar::Shape const& shape) {
  auto comm = world();
  INFO(Split::name() << " over " << shape.str() << ", sp = " << comm.size() << ", rank "
                     << comm.rank());
  std::size_t const n = 2, C = shape[0], rows = shape[1], plane = shape.size() / (C * rows);
  Whole whole;
  Split split(comm);
  split.build(shape);
  CHECK(split.output_shape() == whole.output_shape(shape));
  auto const x = telar::test::random_matrix<T, M>(n, shape.size(), 21);
  auto hx = Kokkos::create_mirror_view(x);
  Kokkos::deep_copy(hx, x);
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t i = 0; i < rows * plane; ++i)
      hx(s, i) = T(0.5);
  Kokkos::deep_copy(x, hx);
  auto const dy = telar::test::random_matrix<T, M>(n, C, 22); // the same on every rank
  telar::Matrix<T, M> y("test::y", n, C), dx("test::dx", n, shape.size());
  typename telar::layer_traits<Whole>::saved_type saved;
  whole.forward(Exec{}, x, y, saved);
  whole.backward_input(Exec{}, dy, dx, saved);
  telar::Matrix<T, M> ys("test::ys", n, C), dxs("test::dxs", n, split.input_shape().size());
  typename Split::saved_type ssaved;
  split.forward(Exec{}, rows_of(x, C, rows, plane, split.slab()), ys, ssaved);
  split.backward_input(Exec{}, dy, dxs, ssaved);
  CHECK(max_diff(ys, y) < 1e-14);
  CHECK(max_diff(dxs, rows_of(dx, C, rows, plane, split.slab())) < 1e-15);
}
} // namespace

TEST_CASE("SpatialGlobalAvgPool and SpatialGlobalMaxPool equal the unsplit pools on every rank",
          "[spatial][mpi]") {
  using Avg = telar::SpatialGlobalAvgPool<T, M>;
  using Max = telar::SpatialGlobalMaxPool<T, M>;
  for (telar::Shape const shape : {telar::Shape{3, 9, 4, 2}, telar::Shape{2, 5, 3}}) {
    check_global_pool<telar::GlobalAvgPool<T, M>, Avg>(shape);
    check_global_pool<telar::GlobalMaxPool<T, M>, Max>(shape);
  }
  // An extent that leaves a rank no row is refused, naming the layer.
  auto comm = world();
  if (comm.size() > 1) {
    Max tiny(comm);
    try {
      tiny.build({2, std::size_t(comm.size() - 1), 3});
      FAIL("no refusal");
    } catch (telar::ShapeError const& e) {
      CHECK(std::string(e.what()).find("SpatialGlobalMaxPool") != std::string::npos);
    }
  }
}

TEST_CASE("SpatialDense (Flatten -> Dense) equals the unsplit Dense on every rank",
          "[spatial][mpi]") {
  auto comm = world();
  for (telar::Shape const shape : {telar::Shape{3, 9, 4, 2}, telar::Shape{2, 5, 3}}) {
    INFO("over " << shape.str() << ", sp = " << comm.size() << ", rank " << comm.rank());
    std::size_t const n = 2, C = shape[0], rows = shape[1], plane = shape.size() / (C * rows);
    std::size_t const out = 4;
    telar::Dense<T, M> whole(shape.size(), out);
    whole.initialize(5);
    telar::SpatialDense<T, M> split(comm, telar::Dense<T, M>(shape.size(), out));
    split.build(shape);
    split.initialize(5);
    auto const x = telar::test::random_matrix<T, M>(n, shape.size(), 31);
    auto const dy = telar::test::random_matrix<T, M>(n, out, 32); // the same on every rank
    telar::Matrix<T, M> y("test::y", n, out), dx("test::dx", n, shape.size());
    typename telar::Dense<T, M>::saved_type saved;
    whole.forward(Exec{}, x, y, saved);
    whole.backward_input(Exec{}, dy, dx, saved);
    whole.backward_weight(Exec{}, dy, saved);
    telar::Matrix<T, M> ys("test::ys", n, out), dxs("test::dxs", n, split.input_shape().size());
    auto const xs = rows_of(x, C, rows, plane, split.slab());
    typename telar::SpatialDense<T, M>::saved_type ssaved;
    split.forward(Exec{}, xs, ys, ssaved);
    split.backward_input(Exec{}, dy, dxs, ssaved);
    split.backward_weight(Exec{}, dy, ssaved);
    Exec{}.fence();
    CHECK(max_diff(ys, y) < 1e-11);
    CHECK(max_diff(dxs, rows_of(dx, C, rows, plane, split.slab())) < 1e-11);
    CHECK(max_diff(split.layer.weight_grad, whole.weight_grad) < 1e-11);
    CHECK(max_diff(split.layer.bias_grad, whole.bias_grad) < 1e-11);
  }
  // A sample that is not the Dense's input is refused, naming the layer.
  telar::SpatialDense<T, M> wrong(comm, telar::Dense<T, M>(10, 2));
  try {
    wrong.build({2, 4, 3});
    FAIL("no refusal");
  } catch (telar::ShapeError const& e) {
    CHECK(std::string(e.what()) == "SpatialDense: expected a sample [C, (D,) H, W] of 10 "
                                   "features (the Dense's input), got [2, 4, 3]");
  }
}

TEST_CASE("SpatialConv of ConvTranspose equals the unsplit layer on every slab", "[spatial][mpi]") {
  using CT3 = telar::ConvTranspose3D<T, M>;
  check_pool(CT3(2, 3, 2, 2), {2, 5, 3, 2});       // k2 s2, uneven
  check_pool(CT3(2, 2, 3, 2, 1, 1), {2, 6, 2, 2}); // k3 s2 p1, output_padding 1
  check_pool(telar::ConvTranspose2D<T, M>(2, 2, 3, 1, 1), {2, 7, 4});
}

TEST_CASE("SpatialPool and ConvTranspose refusals on every rank", "[spatial][mpi]") {
  auto comm = world();
  telar::SpatialPool<telar::MaxPool<3, T, M>> pool(comm, telar::MaxPool<3, T, M>(2, 2, 0, true));
  std::string got;
  try {
    pool.build({1, 8, 3, 3});
  } catch (telar::ShapeError const& e) {
    got = e.what();
  }
  CHECK(got == "MaxPool3D: ceil_mode is not supported on slabs (spatial parallelism)");
  if (comm.size() != 2)
    return; // sp = 2 puts a slab start between the taps of a 1-tap stride-2 kernel
  telar::SpatialConv<telar::ConvTranspose3D<T, M>> up(comm,
                                                      telar::ConvTranspose3D<T, M>(1, 1, 1, 2));
  got.clear();
  try {
    up.build({1, 3, 2, 2});
  } catch (telar::ShapeError const& e) {
    got = e.what();
  }
  CHECK(got == "ConvTranspose3D: a stride (2) longer than the kernel's span is not supported on "
               "slabs (spatial parallelism)");
}

TEST_CASE("SpatialUpsample equals the unsplit Upsample on every slab", "[spatial][mpi]") {
  using Up = telar::Upsample<T, M>;
  check_pool(Up({2, 2, 2}), {2, 5, 3, 2});                              // nearest, uneven
  check_pool(Up({2, 2, 2}, telar::UpsampleMode::linear), {2, 6, 3, 2}); // trilinear
  check_pool(Up({3, 2}, telar::UpsampleMode::linear, true), {2, 7, 4}); // align_corners
}

namespace {

// Labels [n, voxels] in [0, classes), the same on every rank.
telar::VoxelLabels<M> random_labels(std::size_t n, std::size_t voxels, int classes) {
  telar::VoxelLabels<M> y("test::labels", n, voxels);
  auto h = Kokkos::create_mirror_view(y);
  for (std::size_t i = 0; i < h.span(); ++i)
    h.data()[i] = int(std::size_t(1e6 * (1 + telar::test::hash_uniform(17, i))) % classes);
  Kokkos::deep_copy(y, h);
  return y;
}

// The summed loss of logits z (scale 1) and its gradient.
template <class Loss>
double loss_and_gradient(Loss const& loss, telar::Matrix<T, M> const& z,
                         telar::VoxelLabels<M> const& y, telar::Matrix<T, M> const& dz) {
  return loss.forward_backward(Exec{}, z, y, dz, T(1)).loss;
}

// Central differences of the summed loss against its gradient, every entry.
template <class Loss>
double fd_error(Loss const& loss, std::size_t n, std::size_t k, std::size_t voxels) {
  auto z = telar::test::random_matrix<T, M>(n, k, 41, 2.0);
  auto const y = random_labels(n, voxels, int(k / voxels));
  telar::Matrix<T, M> dz("test::dz", n, k), scratch("test::scratch", n, k);
  loss_and_gradient(loss, z, y, dz);
  double worst = 0;
  for (std::size_t i = 0; i < z.span(); ++i) {
    T const keep = z.data()[i], h = 1e-6;
    z.data()[i] = keep + h;
    double const up = loss_and_gradient(loss, z, y, scratch);
    z.data()[i] = keep - h;
    double const down = loss_and_gradient(loss, z, y, scratch);
    z.data()[i] = keep;
    worst = std::max(worst, std::abs((up - down) / (2 * h) - dz.data()[i]));
  }
  return worst;
}

} // namespace

TEST_CASE("VoxelCrossEntropy and SoftDice gradients match finite differences", "[spatial]") {
  CHECK(fd_error(telar::VoxelCrossEntropy<T, M>(3), 2, 3 * 10, 10) < 1e-7);
  CHECK(fd_error(telar::SoftDice<T, M>(3), 2, 3 * 10, 10) < 1e-7);
  CHECK(fd_error(telar::SoftDice<T, M>(2, 1e-3), 1, 2 * 12, 12) < 1e-7);
}

TEST_CASE("Voxel cross entropy and soft Dice on slabs equal the unsplit loss", "[spatial][mpi]") {
  auto comm = world();
  std::size_t const n = 2, C = 3, rows = 9, plane = 4, V = rows * plane;
  auto const z = telar::test::random_matrix<T, M>(n, C * V, 51, 2.0);
  auto const y = random_labels(n, V, int(C));
  telar::Slab const s = telar::split_extent(rows, comm.size(), comm.rank());
  auto const zs = rows_of(z, C, rows, plane, s);
  auto const ys = rows_of<int>(y, 1, rows, plane, s);
  telar::Matrix<T, M> dz("test::dz", n, C * V), dzs("test::dzs", n, zs.extent(1));

  telar::VoxelCrossEntropy<T, M> const ce(C);
  double const whole_ce = ce.forward_backward(Exec{}, z, y, dz, T(1.0 / double(n * V))).loss;
  double const split_ce = telar::spatial_voxel_cross_entropy(Exec{}, ce, comm, zs, ys, dzs);
  CHECK(std::abs(split_ce - whole_ce / double(n * V)) < 1e-11);
  CHECK(max_diff(dzs, rows_of(dz, C, rows, plane, s)) < 1e-11);

  telar::SoftDice<T, M> const dice(C);
  double const whole_dice = dice.forward_backward(Exec{}, z, y, dz, T(1.0 / double(n))).loss;
  double const split_dice = telar::spatial_soft_dice(Exec{}, dice, comm, zs, ys, dzs);
  CHECK(std::abs(split_dice - whole_dice / double(n)) < 1e-11);
  CHECK(max_diff(dzs, rows_of(dz, C, rows, plane, s)) < 1e-11);
}

// Not run by ctest (hidden tag): medians of five steps of a float Conv3D
// 8 -> 8, k3 p1 on [8, 32, 32, 32] x 2 samples, unsplit on every rank, on
// slabs, and the forward halo exchange alone. Run with
// mpiexec -n P test_spatial "[.bench]".
namespace {

using UNet = telar::SpatialUNetLayers<T, M>::Graph;

// The graph's parameters, flattened, as a host vector.
std::vector<double> graph_parameters(UNet& g) {
  std::vector<double> all;
  g.parameters([&](char const*, auto& v, auto&) {
    auto h = telar::test::to_host(v);
    all.insert(all.end(), h.data(), h.data() + h.span());
  });
  return all;
}

// One SGD step (lr 0.05) on L = 0.5 scale sum y^2 over this rank's outputs;
// returns the output slab (a copy).
telar::Matrix<T, M> graph_step(UNet& g, telar::Matrix<T, M> const& x, T scale) {
  telar::Matrix<T, M> y("test::y", 0, 0);
  auto const& out = g.forward(Exec{}, x);
  Exec{}.fence();
  y = telar::Matrix<T, M>("test::y", out.extent(0), out.extent(1));
  Kokkos::deep_copy(y, out);
  telar::Matrix<T, M> dy("test::dy", out.extent(0), out.extent(1));
  for (std::size_t i = 0; i < dy.span(); ++i)
    dy.data()[i] = scale * y.data()[i];
  g.backward(Exec{}, dy);
  g.parameters([&](char const*, auto& v, auto& dv) {
    for (std::size_t i = 0; i < v.span(); ++i) {
      v.data()[i] -= T(0.05) * dv.data()[i];
      dv.data()[i] = T(0);
    }
  });
  return y;
}

// 0.5 scale sum y^2 of the graph's output on x.
double half_square(UNet& g, telar::Matrix<T, M> const& x, T scale) {
  auto const h = telar::test::to_host(g.forward(Exec{}, x));
  double s = 0;
  for (std::size_t i = 0; i < h.span(); ++i)
    s += 0.5 * double(scale) * double(h.data()[i]) * double(h.data()[i]);
  return s;
}

// The graph's backward (skips, concatenations, every wrapper) against
// central differences of its forward, for two elements of every tensor.
void check_graph_gradients(UNet& g, telar::Matrix<T, M> const& x, T scale) {
  auto const& y = g.forward(Exec{}, x);
  Exec{}.fence();
  telar::Matrix<T, M> dy("test::dy", y.extent(0), y.extent(1));
  for (std::size_t i = 0; i < dy.span(); ++i)
    dy.data()[i] = scale * y.data()[i];
  g.backward(Exec{}, dy);
  double const h = 1e-6;
  g.parameters([&](char const* name, auto& v, auto& dv) {
    for (std::size_t i : {std::size_t(0), v.span() - 1}) {
      T const w = v.data()[i];
      v.data()[i] = w + h;
      double const up = half_square(g, x, scale);
      v.data()[i] = w - h;
      double const down = half_square(g, x, scale);
      v.data()[i] = w;
      INFO(name << "[" << i << "]");
      CHECK(std::abs((up - down) / (2 * h) - dv.data()[i]) <
            1e-6 * std::max(1.0, std::abs(dv.data()[i])));
      dv.data()[i] = T(0);
    }
  });
}

} // namespace

TEST_CASE("A 3-D U-Net SlabGraph with concatenated skips trains to the serial parameters",
          "[spatial][mpi]") {
  auto const norm = GENERATE(telar::UNetOptions::Norm::batch, telar::UNetOptions::Norm::group);
  INFO((norm == telar::UNetOptions::Norm::batch ? "BatchNorm" : "GroupNorm"));
  // Depth 1, width 2: conv-BN-ReLU x2, pool, the same at 4 channels,
  // transposed convolution, concat with the first block (the skip), conv-BN-
  // ReLU x2, 1x1 head to 3 classes. Depth 12 over 4 ranks: slabs of 3, and
  // 2, 2, 1, 1 after the pool (uneven). The reference is the same graph on
  // MPI_COMM_SELF (sp = 1), whose wrappers equal the plain layers (above).
  auto comm = world();
  telar::Communicator self(MPI_COMM_SELF, "self");
  telar::UNetOptions o;
  o.in_channels = 2, o.classes = 3, o.depth = 1, o.width = 2, o.norm = norm;
  telar::Shape const shape{2, 12, 4, 4};
  UNet serial = telar::spatial_unet<T, M>(self, o), split = telar::spatial_unet<T, M>(comm, o);
  serial.build(shape);
  split.build(shape);
  serial.initialize(40);
  split.initialize(40);
  REQUIRE(split.size() == serial.size());
  CHECK(split.whole_shape(split.size() - 1) == telar::Shape{3, 12, 4, 4});
  CHECK(split.name(15) == "Concat");
  auto const initial = graph_parameters(serial);
  std::size_t const n = 2;
  T const scale = T(1) / T(n * 3 * 12 * 16);
  check_graph_gradients(serial, telar::test::random_matrix<T, M>(n, shape.size(), 49), scale);
  serial.parameters([](char const*, auto&, auto& dv) { Kokkos::deep_copy(dv, T(0)); });
  for (int step = 0; step < 3; ++step) {
    auto const x = telar::test::random_matrix<T, M>(n, shape.size(), 50 + std::uint64_t(step));
    auto const y = graph_step(serial, x, scale);
    auto const ys = graph_step(split, rows_of(x, 2, 12, 16, split.input_slab()), scale);
    CHECK(max_diff(ys, rows_of(y, 3, 12, 16, split.output_slab())) < 1e-11);
  }
  auto const a = graph_parameters(serial), b = graph_parameters(split);
  check_trained(a, b, initial);
}

TEST_CASE("The cost model counts the halo bytes and the group sums a U-Net step makes",
          "[spatial][mpi]") {
  auto const norm = GENERATE(telar::UNetOptions::Norm::batch, telar::UNetOptions::Norm::group);
  INFO((norm == telar::UNetOptions::Norm::batch ? "BatchNorm" : "GroupNorm"));
  auto comm = world();
  int const sp = comm.size();
  telar::UNetOptions o;
  o.in_channels = 2, o.classes = 3, o.depth = 1, o.width = 2, o.norm = norm;
  telar::Shape const shape{2, 12, 4, 4};
  UNet g = telar::spatial_unet<T, M>(comm, o);
  g.build(shape);
  g.initialize(40);
  telar::MachineProfile const prof; // the built-in rates: no timing involved
  telar::SlabSyncShape alone;       // the graph on its own: its wrappers sum over sp
  alone.over_world = false;
  auto const p = telar::predict_slab_step(g, 2, 1, sp, prof, alone);
  // One step, counted: what the model says this rank sends and sums.
  telar::halo_tally() = {};
  telar::group_sum_tally() = {};
  std::size_t const rows = g.input_slab().size();
  graph_step(g, telar::test::random_matrix<T, M>(2, 2 * rows * 16, 51), T(0.01));
  CHECK(p.halo_bytes == double(telar::halo_tally().bytes_sent));
  CHECK(p.sums == int(telar::group_sum_tally().sums));
  CHECK(p.exchanges <= int(telar::halo_tally().exchanges)); // the tally counts empty posts too
  CHECK(p.dp == 0);
  if (sp == 1) {
    CHECK(p.halo_bytes == 0);
    CHECK(p.group_sums == 0);
    CHECK(p.statistics == 0);
  } else {
    CHECK(p.halo_bytes > 0);
    CHECK(p.halo > 0);
    CHECK(p.statistics == 12); // six normalisations, forward and backward
  }
  // A plan as another rank (SpatialPlanAs, no messages) is that rank's own
  // prediction; and each rank of the split computes less than one rank alone.
  telar::Communicator self(MPI_COMM_SELF, "self");
  auto planned = [&](int size, int rank) { // on the same cores as this run
    telar::SpatialPlanAs as(size, rank);
    UNet h = telar::spatial_unet<T, M>(self, o);
    h.build(shape);
    h.initialize(40);
    return telar::predict_slab_step(h, 2, sp / size, size, prof, alone);
  };
  auto const mine = planned(sp, comm.rank());
  CHECK(mine.halo_bytes == p.halo_bytes);
  CHECK(mine.compute == p.compute);
  CHECK(mine.seconds() == p.seconds());
  if (sp > 1) // less, not half: each layer call has its overhead
    CHECK(p.compute < planned(1, 0).compute);
  // Calibration times each wrapper on its slab alone (no messages, also for
  // a graph planned as another rank), once per size, and the prediction
  // then reads those times.
  {
    telar::SpatialPlanAs as(2, 1);
    UNet h = telar::spatial_unet<T, M>(self, o);
    h.build(shape);
    h.initialize(40);
    telar::MachineProfile timed;
    std::size_t const n = telar::calibrate_slab_layers(h, 2, timed, 1);
    CHECK(n == timed.layer_times.size()); // layers on equal slabs share a group
    CHECK(telar::calibrate_slab_layers(h, 2, timed, 1) == 0);
    int layers = 0; // every node but the concatenation
    h.for_each_node([&](int, auto const& w, int) {
      ++layers;
      CHECK(timed.layer_timing(telar::detail::slab_group(w), 2).has_value());
    });
    CHECK(layers == h.size() - 2); // 21: the input and the concatenation are no layers
    CHECK(n < std::size_t(layers));
    for (auto const& [group, by_rows] : timed.layer_times) {
      INFO(group);
      CHECK(group.rfind("slab ", 0) == 0);
      CHECK(by_rows.at(2).forward > 0);
    }
    CHECK(telar::predict_slab_step(h, 2, 1, 2, timed).compute !=
          telar::predict_slab_step(h, 2, 1, 2, prof).compute);
  }
  // Data parallelism averages every gradient value once per step.
  auto const replicas = telar::predict_slab_step(g, 1, 2, sp, prof);
  std::size_t values = 0;
  g.parameters([&](char const*, auto& v, auto&) { values += v.span(); });
  CHECK(replicas.dp >= prof.allreduce.beta * double(values * sizeof(T)));
  // Summed over the world (telar::SlabDataParallel's default), no layer
  // sums over sp; the wrappers' sums replace a reduction over dp x sp.
  CHECK(replicas.sums == 0);
  auto const by_layer = telar::predict_slab_step(g, 1, 2, sp, prof, alone);
  CHECK(by_layer.sums == (sp > 1 ? p.sums : 0));
  if (sp > 1)
    CHECK(by_layer.group_sums > replicas.group_sums);
  // ZeRO: each rank of the sync (dp x sp) updates its share of the
  // parameters; ZeRO-2 reduce-scatters one group per bucket.
  telar::SlabSyncShape zero1{1}, zero2{2, 64};
  auto const z1 = telar::predict_slab_step(g, 1, 2, sp, prof, zero1);
  auto const z2 = telar::predict_slab_step(g, 1, 2, sp, prof, zero2);
  CHECK(z1.optimizer == Catch::Approx(replicas.optimizer / (2 * sp)));
  zero1.over_world = false; // shards over dp only
  CHECK(telar::predict_slab_step(g, 1, 2, sp, prof, zero1).optimizer ==
        Catch::Approx(replicas.optimizer / 2));
  CHECK(z1.dp > 0);
  CHECK(z2.dp > z1.dp); // one latency per group
  // ZeRO-3 gathers every group twice a step (forward, backward).
  auto const z3 = telar::predict_slab_step(g, 1, 2, sp, prof, {3, 64});
  CHECK(z3.dp > z2.dp);
  CHECK(z3.optimizer == z1.optimizer);
}

TEST_CASE("SlabGraph refuses a node no other node reads and a concat of different extents",
          "[spatial][mpi]") {
  auto comm = world();
  using L = telar::SpatialUNetLayers<T, M>;
  auto message = [&](bool dead_end) -> std::string {
    UNet g(comm);
    int const a = g.add(L::Relu(comm, telar::ReLU<T, M>{}), UNet::input);
    int const p = g.add(L::Pool(comm, telar::MaxPool<3, T, M>(2)), a);
    if (dead_end)
      g.add(L::Relu(comm, telar::ReLU<T, M>{}), a);
    else
      g.concat(a, p);
    try {
      g.build({1, 8, 4, 4});
    } catch (telar::ShapeError const& e) {
      return e.what();
    }
    return "";
  };
  CHECK(message(true) == "telar::SlabGraph: node 2 (MaxPool3D) is read by no node (only the last "
                         "node is the output)");
  CHECK(message(false) == "telar::SlabGraph: node 3 (Concat, input [1, 8, 4, 4]): node 1 "
                          "[1, 8, 4, 4] and node 2 [1, 4, 2, 2] have different spatial extents");
}

TEST_CASE("SpatialConv timing", "[.bench][spatial]") {
  using F = float;
  auto comm = world();
  telar::Shape const shape{8, 32, 32, 32};
  std::size_t const n = 2, plane = 32 * 32;
  telar::Conv3D<F, M> const proto(8, 8, 3, 1, 1);
  auto median = [&](auto&& f) {
    std::vector<double> t;
    for (int i = 0; i < 5; ++i) {
      comm.barrier();
      auto const t0 = std::chrono::steady_clock::now();
      f();
      Exec{}.fence();
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[2];
  };
  telar::Conv3D<F, M> whole = proto;
  whole.build(shape);
  whole.initialize(1);
  auto const x = telar::test::random_matrix<F, M>(n, shape.size(), 1);
  telar::Matrix<F, M> y("y", n, shape.size()), dx("dx", n, shape.size());
  telar::Conv3D<F, M>::saved_type saved;
  double const t_whole = median([&] {
    whole.forward(Exec{}, x, y, saved);
    whole.backward_input(Exec{}, y, dx, saved);
    whole.backward_weight(Exec{}, y, saved);
  });
  telar::SpatialConv<telar::Conv3D<F, M>> split(comm, proto);
  split.build(shape);
  split.initialize(1);
  auto const xs = rows_of<F>(x, 8, 32, plane, split.slab().in);
  telar::Matrix<F, M> ys("ys", n, split.output_shape().size()), dxs("dxs", n, xs.extent(1));
  telar::SpatialConv<telar::Conv3D<F, M>>::saved_type ss;
  double const t_split = median([&] {
    split.forward(Exec{}, xs, ys, ss);
    split.backward_input(Exec{}, ys, dxs, ss);
    split.backward_weight(Exec{}, ys, ss);
  });
  telar::HaloExchange<F, M> halo(comm);
  double const t_halo = median([&] {
    halo.post(Exec{}, split.slab().halo, xs.data(), n * 8, plane, ss.ext.data());
    halo.finish(Exec{});
  });
  if (comm.rank() == 0)
    std::printf("sp = %d: unsplit step %.4f s, slab step %.4f s, halo exchange %.5f s\n",
                comm.size(), t_whole, t_split, t_halo);
  CHECK(t_split > 0);
}
