// Transformer layers: Embedding, PositionalEmbedding, RMSNorm, GELUTanh,
// Dropout, CausalSelfAttention and the pre-norm TransformerBlock. Values
// against direct host computations, gradients by finite differences in
// double (telar::check_gradients), error messages, the dropout mask's
// independence of the batch layout and its replay under Recompute, and the
// attention's causality.
#include "support.hpp"

#include <telar/core/recompute.hpp>
#include <telar/core/sequential.hpp>
#include <telar/layers/activation.hpp>
#include <telar/layers/attention.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/dropout.hpp>
#include <telar/layers/embedding.hpp>
#include <telar/layers/normalization.hpp>
#include <telar/layers/transformer.hpp>
#include <telar/testing/check_gradients.hpp>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <string>
#include <vector>

using Catch::Approx;
using Catch::Matchers::ContainsSubstring;
using telar::test::Exec;
using telar::test::random_matrix;
using telar::test::to_host;
using Mat = telar::Matrix<double>;

namespace {

template <class L>
void check_fd(L& layer, telar::Shape const& in, std::size_t samples, double tol = 1e-6) {
  telar::GradientCheckOptions o;
  o.input_scale = 1.5;
  auto const report = telar::check_gradients(layer, in, samples, o);
  INFO(report.str());
  CHECK(report.passed(tol));
  CHECK(report.tensors.size() >= 1);
}

Mat ids_matrix(std::vector<std::vector<double>> const& rows) {
  Mat m("ids", rows.size(), rows[0].size());
  auto h = Kokkos::create_mirror_view(m);
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (std::size_t j = 0; j < rows[i].size(); ++j)
      h(i, j) = rows[i][j];
  Kokkos::deep_copy(m, h);
  return m;
}

// Inverted dropout that re-keys itself before every forward, so repeated
// forwards (finite differences) see one mask.
struct FixedDropout : telar::Dropout<double> {
  using telar::Dropout<double>::Dropout;
  template <class E>
  void forward(E const& exec, telar::ConstMatrix<double> x, telar::Matrix<double> y,
               saved_type& saved) {
    set_random_position(3, 0);
    telar::Dropout<double>::forward(exec, x, y, saved);
  }
};

// Direct host attention for one head set: the layer's own parameters.
std::vector<double> reference_attention(telar::CausalSelfAttention<double>& a, Mat x,
                                        std::size_t seq) {
  std::size_t const n = x.extent(0), h = a.hidden(), heads = a.heads(), d = h / heads;
  std::vector<std::vector<double>> W, B;
  a.parameters([&](char const*, auto& v, auto&) {
    auto hv = to_host(v);
    std::vector<double> flat(hv.data(), hv.data() + hv.size());
    if (v.rank == 2)
      W.push_back(flat);
    else
      B.push_back(flat);
  });
  auto hx = to_host(x);
  auto lin = [&](int m, std::vector<double> const& in) { // [seq, h] -> [seq, h]
    std::vector<double> out(seq * h);
    for (std::size_t s = 0; s < seq; ++s)
      for (std::size_t o = 0; o < h; ++o) {
        double acc = B[std::size_t(m)][o];
        for (std::size_t i = 0; i < h; ++i)
          acc += W[std::size_t(m)][o * h + i] * in[s * h + i];
        out[s * h + o] = acc;
      }
    return out;
  };
  std::vector<double> y(n * seq * h);
  for (std::size_t b = 0; b < n; ++b) {
    std::vector<double> xs(hx.data() + b * seq * h, hx.data() + (b + 1) * seq * h);
    auto q = lin(0, xs), k = lin(1, xs), v = lin(2, xs);
    std::vector<double> o(seq * h, 0.0);
    for (std::size_t hd = 0; hd < heads; ++hd)
      for (std::size_t i = 0; i < seq; ++i) {
        std::vector<double> p(i + 1);
        double m = -1e300, sum = 0;
        for (std::size_t j = 0; j <= i; ++j) {
          double s = 0;
          for (std::size_t c = 0; c < d; ++c)
            s += q[i * h + hd * d + c] * k[j * h + hd * d + c];
          p[j] = s / std::sqrt(double(d));
          m = std::max(m, p[j]);
        }
        for (std::size_t j = 0; j <= i; ++j)
          sum += (p[j] = std::exp(p[j] - m));
        for (std::size_t j = 0; j <= i; ++j)
          for (std::size_t c = 0; c < d; ++c)
            o[i * h + hd * d + c] += p[j] / sum * v[j * h + hd * d + c];
      }
    auto yo = lin(3, o);
    std::copy(yo.begin(), yo.end(), y.begin() + std::ptrdiff_t(b * seq * h));
  }
  return y;
}

} // namespace

TEST_CASE("Embedding looks rows up and accumulates the table's gradient deterministically",
          "[transformer]") {
  telar::Embedding<double> emb(7, 3);
  CHECK(emb.output_shape(telar::Shape(4)) == (telar::Shape{4, 3}));
  CHECK_THROWS_WITH(emb.output_shape(telar::Shape{4, 2}), ContainsSubstring("token ids [seq]"));
  emb.initialize(5);
  Mat ids = ids_matrix({{1, 6, 1, 0}, {6, 6, 2, 1}});
  Mat y("y", 2, 12);
  telar::Embedding<double>::saved_type saved;
  emb.forward(Exec{}, ids, y, saved);
  auto hy = to_host(y);
  auto hw = to_host(emb.weight);
  double const ref[2][4] = {{1, 6, 1, 0}, {6, 6, 2, 1}};
  for (int i = 0; i < 2; ++i)
    for (int s = 0; s < 4; ++s)
      for (int c = 0; c < 3; ++c)
        CHECK(hy(i, s * 3 + c) == hw(std::size_t(ref[i][s]), c));
  // GPT-2's scale: std 0.02.
  double sq = 0;
  for (std::size_t i = 0; i < hw.size(); ++i)
    sq += hw.data()[i] * hw.data()[i];
  CHECK(std::sqrt(sq / double(hw.size())) < 0.04);
  CHECK(std::sqrt(sq / double(hw.size())) > 0.005);

  // dW[id] = sum of dy over the positions holding id; twice accumulates.
  Mat dy = random_matrix<double>(2, 12, 3);
  Kokkos::deep_copy(emb.weight_grad, 0.0);
  emb.backward_weight(Exec{}, dy, saved);
  emb.backward_weight(Exec{}, dy, saved);
  auto hg = to_host(emb.weight_grad);
  auto hdy = to_host(dy);
  for (std::size_t v = 0; v < 7; ++v)
    for (std::size_t c = 0; c < 3; ++c) {
      double acc = 0;
      for (int i = 0; i < 2; ++i)
        for (int s = 0; s < 4; ++s)
          if (std::size_t(ref[i][s]) == v)
            acc += hdy(i, std::size_t(s) * 3 + c);
      CHECK(hg(v, c) == Approx(2 * acc).margin(1e-14));
    }
  Mat dx("dx", 2, 4);
  Kokkos::deep_copy(dx, 1.0);
  emb.backward_input(Exec{}, dy, dx, saved);
  CHECK(to_host(dx)(1, 3) == 0.0);
}

TEST_CASE("Embedding refuses ids that are out of range or not integers", "[transformer]") {
  telar::Embedding<double> emb(5, 2);
  emb.initialize(1);
  Mat y("y", 1, 6);
  telar::Embedding<double>::saved_type saved;
  CHECK_THROWS_WITH(emb.forward(Exec{}, ids_matrix({{0, 5, 1}}), y, saved),
                    ContainsSubstring("token id 5") && ContainsSubstring("position 1") &&
                        ContainsSubstring("[0, 5)"));
  CHECK_THROWS_WITH(emb.forward(Exec{}, ids_matrix({{0, 1, -1}}), y, saved),
                    ContainsSubstring("position 2"));
  CHECK_THROWS_WITH(emb.forward(Exec{}, ids_matrix({{2.5, 1, 1}}), y, saved),
                    ContainsSubstring("position 0"));
  CHECK_THROWS_AS(emb.forward(Exec{}, ids_matrix({{0, 1, 1}}), Mat("bad", 1, 5), saved),
                  telar::ShapeError);
}

TEST_CASE("PositionalEmbedding: gradients, and seq beyond the context is refused",
          "[transformer]") {
  telar::PositionalEmbedding<double> pos(6, 3);
  check_fd(pos, telar::Shape{4, 3}, 3);
  CHECK_THROWS_WITH(pos.output_shape(telar::Shape{7, 3}),
                    ContainsSubstring("sequence length 7") && ContainsSubstring("context of 6"));
  CHECK_THROWS_AS(pos.output_shape(telar::Shape{4, 2}), telar::ShapeError);
  // y = x + table[:seq]
  Mat x = random_matrix<double>(2, 12, 4);
  Mat y("y", 2, 12);
  telar::NoSaved none;
  pos.forward(Exec{}, x, y, none);
  auto hx = to_host(x), hy = to_host(y), hw = to_host(pos.weight);
  CHECK(hy(1, 7) == hx(1, 7) + hw(2, 1));
}

TEST_CASE("RMSNorm: values and gradients over the hidden dimension", "[transformer]") {
  telar::RMSNorm<double> norm(4, 1e-5);
  norm.initialize(0);
  Kokkos::deep_copy(norm.weight, 1.5);
  Mat x = random_matrix<double>(2, 12, 8, 2.0);
  Mat y("y", 2, 12);
  telar::RMSNorm<double>::saved_type saved;
  norm.forward(Exec{}, x, y, saved);
  auto hx = to_host(x), hy = to_host(y);
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t p = 0; p < 3; ++p) {
      double ms = 0;
      for (std::size_t j = 0; j < 4; ++j)
        ms += hx(i, p * 4 + j) * hx(i, p * 4 + j) / 4;
      for (std::size_t j = 0; j < 4; ++j)
        CHECK(hy(i, p * 4 + j) == Approx(1.5 * hx(i, p * 4 + j) / std::sqrt(ms + 1e-5)));
    }
  telar::RMSNorm<double> fresh(4);
  check_fd(fresh, telar::Shape{3, 4}, 2);
  CHECK_THROWS_AS(fresh.output_shape(telar::Shape{3, 5}), telar::ShapeError);
}

TEST_CASE("GELUTanh matches GPT-2's formula; both GELUs pass the gradient check", "[transformer]") {
  telar::GELUTanh<double> g;
  Mat x = random_matrix<double>(2, 5, 2, 3.0);
  Mat y("y", 2, 5);
  telar::GELUTanh<double>::saved_type saved;
  g.forward(Exec{}, x, y, saved);
  auto hx = to_host(x), hy = to_host(y);
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 5; ++j) {
      double const v = hx(i, j);
      double const ref =
          0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      CHECK(hy(i, j) == Approx(ref).epsilon(1e-14));
    }
  check_fd(g, telar::Shape{3, 4}, 2);
  telar::GELU<double> exact;
  check_fd(exact, telar::Shape{3, 4}, 2);
}

TEST_CASE("Dropout: mask keyed by (seed, step, global sample, element)", "[transformer]") {
  CHECK_THROWS_WITH(telar::Dropout<double>(1.0), ContainsSubstring("not in [0, 1)"));
  std::size_t const n = 8, k = 50;
  Mat x = random_matrix<double>(n, k, 6);
  auto run = [&](std::size_t lo, std::size_t hi, std::uint64_t step, std::size_t parts) {
    telar::Dropout<double> d(0.3);
    d.initialize(42);
    d.set_random_position(step, lo);
    Mat y("y", hi - lo, k);
    std::size_t const per = (hi - lo) / parts;
    for (std::size_t p = 0; p < parts; ++p) {
      auto xs =
          Kokkos::subview(x, Kokkos::make_pair(lo + p * per, lo + (p + 1) * per), Kokkos::ALL);
      Mat ys("ys", per, k);
      telar::Dropout<double>::saved_type saved;
      d.forward(Exec{}, Mat(xs.data(), per, k), ys, saved);
      Kokkos::deep_copy(Kokkos::subview(y, Kokkos::make_pair(p * per, (p + 1) * per), Kokkos::ALL),
                        ys);
    }
    CHECK(d.random_counter() == hi);
    return to_host(y);
  };
  auto whole = run(0, n, 7, 1);
  auto micro = run(0, n, 7, 4); // four micro-batches of 2
  auto rank1 = run(4, n, 7, 1); // the second half, as data-parallel rank 1 sees it
  auto other = run(0, n, 8, 1); // next step
  auto hx = to_host(x);
  std::size_t dropped = 0, differ = 0;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < k; ++j) {
      CHECK(micro(i, j) == whole(i, j));
      if (i >= 4)
        CHECK(rank1(i - 4, j) == whole(i, j));
      bool const kept = whole(i, j) != 0.0;
      dropped += kept ? 0 : 1;
      if (kept)
        CHECK(whole(i, j) == Approx(hx(i, j) / 0.7).epsilon(1e-15));
      differ += (other(i, j) == 0.0) != !kept ? 1 : 0;
    }
  CHECK(dropped > n * k * 2 / 10); // p = 0.3 of 400 values
  CHECK(dropped < n * k * 4 / 10);
  CHECK(differ > 0); // another step, another mask

  // Evaluation is the identity and does not move the cursor.
  telar::Dropout<double> d(0.5);
  d.set_training(false);
  Mat y("y", n, k);
  telar::Dropout<double>::saved_type saved;
  d.forward(Exec{}, x, y, saved);
  auto hy = to_host(y);
  CHECK(hy(3, 7) == hx(3, 7));
  CHECK(d.random_counter() == 0);

  FixedDropout fixed(0.4);
  check_fd(fixed, telar::Shape{3, 4}, 3);
}

TEST_CASE("Dropout replays exactly under Recompute; set_random_position reaches nested layers",
          "[transformer]") {
  using D = telar::Dense<double>;
  using Drop = telar::Dropout<double>;
  using Body = telar::Sequential<D, Drop, telar::Residual<D, telar::GELU<double>, Drop>>;
  using Plain = telar::Sequential<Body, D>;
  using Ckpt = telar::Sequential<telar::Recompute<Body>, D>;
  auto body = [](double p) {
    using Res = telar::Residual<D, telar::GELU<double>, Drop>;
    return Body(D(4, 6), Drop(p), Res(D(6, 6), {}, Drop(p)));
  };
  Plain plain(body(0.3), D(6, 3)), none(body(0.0), D(6, 3));
  Ckpt ckpt(telar::Recompute<Body>(body(0.3)), D(6, 3));
  auto grads = [](auto& model, std::uint64_t seed) {
    model.build(telar::Shape(4));
    model.initialize(seed);
    std::vector<double> out;
    Mat x = random_matrix<double>(4, 4, 9);
    for (std::uint64_t step = 0; step < 2; ++step) {
      telar::set_random_position(model, step, 100);
      model.parameters([](char const*, auto&, auto& g) { Kokkos::deep_copy(g, 0.0); });
      typename telar::layer_traits<std::decay_t<decltype(model)>>::saved_type saved;
      Mat y("y", 4, 3), dx("dx", 4, 4);
      Mat dy = random_matrix<double>(4, 3, 10 + step);
      model.forward(Exec{}, x, y, saved);
      model.backward_input(Exec{}, dy, dx, saved);
      model.backward_weight(Exec{}, dy, saved);
      model.parameters([&](char const*, auto&, auto& g) {
        auto h = to_host(g);
        out.insert(out.end(), h.data(), h.data() + h.size());
      });
      auto hdx = to_host(dx);
      out.insert(out.end(), hdx.data(), hdx.data() + hdx.size());
    }
    return out;
  };
  auto a = grads(plain, 3);
  auto b = grads(ckpt, 3);
  REQUIRE(a.size() == b.size());
  CHECK(a == b);
  CHECK(a != grads(none, 3)); // the masks did drop something
}

TEST_CASE("CausalSelfAttention: values against a host reference", "[transformer]") {
  telar::CausalSelfAttention<double> attn(6, 3);
  CHECK_THROWS_WITH(telar::CausalSelfAttention<double>(6, 4),
                    ContainsSubstring("hidden size 6") && ContainsSubstring("4 heads"));
  CHECK_THROWS_WITH(attn.output_shape(telar::Shape{5, 4}), ContainsSubstring("[seq, 6]"));
  attn.initialize(7);
  std::size_t const seq = 5;
  Mat x = random_matrix<double>(2, seq * 6, 12, 2.0);
  Mat y("y", 2, seq * 6);
  telar::CausalSelfAttention<double>::saved_type saved;
  attn.forward(Exec{}, x, y, saved);
  auto hy = to_host(y);
  auto ref = reference_attention(attn, x, seq);
  for (std::size_t i = 0; i < ref.size(); ++i)
    CHECK(hy.data()[i] == Approx(ref[i]).epsilon(1e-12).margin(1e-13));
  // Forward batches every (sample, head) pair in one score workspace.
  CHECK(attn.score_workspace_size() == 2 * 3 * seq * seq);

  // Capped at two pairs, chunks of (1 sample, 2 heads) and (1 sample, 1
  // head) give the same values and gradients, bit for bit.
  telar::CausalSelfAttention<double> capped(6, 3);
  capped.initialize(7);
  capped.set_score_workspace_limit(2 * seq * seq * sizeof(double));
  Mat yc("yc", 2, seq * 6), dx("dx", 2, seq * 6), dxc("dxc", 2, seq * 6);
  Mat dy = random_matrix<double>(2, seq * 6, 13);
  telar::CausalSelfAttention<double>::saved_type saved_c;
  capped.forward(Exec{}, x, yc, saved_c);
  attn.backward_input(Exec{}, dy, dx, saved);
  capped.backward_input(Exec{}, dy, dxc, saved_c);
  CHECK(capped.score_workspace_size() == 2 * 2 * seq * seq);
  auto hyc = to_host(yc), hdx = to_host(dx), hdxc = to_host(dxc);
  for (std::size_t i = 0; i < hy.size(); ++i) {
    CHECK(hyc.data()[i] == hy.data()[i]);
    CHECK(hdxc.data()[i] == hdx.data()[i]);
  }

  std::vector<std::string> names;
  attn.parameters([&](char const* nm, auto&, auto&) { names.emplace_back(nm); });
  CHECK(names == std::vector<std::string>{"query.weight", "query.bias", "key.weight", "key.bias",
                                          "value.weight", "value.bias", "proj.weight",
                                          "proj.bias"});
}

TEST_CASE("CausalSelfAttention is causal and passes the gradient check", "[transformer]") {
  telar::CausalSelfAttention<double> attn(8, 2);
  check_fd(attn, telar::Shape{5, 8}, 2);
  // Backward keeps scores and dP of every (sample, head) pair of the batch.
  CHECK(attn.score_workspace_size() == 2 * (2 * 2 * 5 * 5));

  // A change at position 3 leaves outputs 0..2 unchanged.
  Mat x = random_matrix<double>(1, 40, 3);
  Mat x2("x2", 1, 40);
  Kokkos::deep_copy(x2, x);
  auto h2 = Kokkos::create_mirror_view(x2);
  Kokkos::deep_copy(h2, x2);
  h2(0, 3 * 8 + 1) += 0.5;
  Kokkos::deep_copy(x2, h2);
  Mat y("y", 1, 40), y2("y2", 1, 40);
  telar::CausalSelfAttention<double>::saved_type s1, s2;
  attn.forward(Exec{}, x, y, s1);
  attn.forward(Exec{}, x2, y2, s2);
  auto a = to_host(y), b = to_host(y2);
  for (std::size_t f = 0; f < 24; ++f)
    CHECK(a(0, f) == b(0, f));
  bool changed = false;
  for (std::size_t f = 24; f < 40; ++f)
    changed = changed || a(0, f) != b(0, f);
  CHECK(changed);

  // backward_weight alone (the model's first unit) computes the inner gradients itself.
  telar::CausalSelfAttention<double> fresh(8, 2);
  fresh.initialize(1);
  std::vector<double> split, alone;
  for (int mode = 0; mode < 2; ++mode) {
    fresh.parameters([](char const*, auto&, auto& g) { Kokkos::deep_copy(g, 0.0); });
    telar::CausalSelfAttention<double>::saved_type s;
    Mat dy = random_matrix<double>(1, 40, 4), dx("dx", 1, 40);
    fresh.forward(Exec{}, x, y, s);
    if (mode == 0)
      fresh.backward_input(Exec{}, dy, dx, s);
    fresh.backward_weight(Exec{}, dy, s);
    auto& out = mode == 0 ? split : alone;
    fresh.parameters([&](char const*, auto&, auto& g) {
      auto h = to_host(g);
      out.insert(out.end(), h.data(), h.data() + h.size());
    });
  }
  CHECK(split == alone);
}

TEST_CASE("TransformerBlock: one unit, gradients with LayerNorm and RMSNorm", "[transformer]") {
  auto block = telar::make_transformer_block<double>(8, 2);
  CHECK(block.output_shape(telar::Shape{5, 8}) == (telar::Shape{5, 8}));
  check_fd(block, telar::Shape{5, 8}, 2);
  std::vector<std::string> names;
  block.parameters([&](char const* nm, auto&, auto&) { names.emplace_back(nm); });
  INFO(names.front() << " " << names[2] << " " << names.back());
  REQUIRE(names.size() == 2 + 8 + 2 + 4);
  CHECK(names.front() == "0.0.weight");
  CHECK(names[2] == "0.1.query.weight");
  CHECK(names.back() == "1.3.bias");

  using RmsBlock = telar::TransformerBlock<double, telar::DefaultMemorySpace,
                                           telar::RMSNorm<double>, telar::GELUTanh<double>>;
  RmsBlock rms =
      telar::make_transformer_block<double, telar::DefaultMemorySpace, telar::RMSNorm<double>,
                                    telar::GELUTanh<double>>(8, 4);
  check_fd(rms, telar::Shape{4, 8}, 2);
  CHECK_THROWS_WITH(telar::make_transformer_block<double>(8, 3), ContainsSubstring("3 heads"));
}
