#pragma once
/*! \file
 *  \brief telar::CausalSelfAttention: multi-head causal self-attention over
 *  [sequence, hidden] samples (GPT-2's attention, without dropout).
 *
 *  Per sample and head h (d = hidden / heads):
 *  Q, K, V = x Wq^T + bq, x Wk^T + bk, x Wv^T + bv (position-wise, all heads
 *  at once); S = Q_h K_h^T / sqrt(d); P = softmax(S) over keys j <= i (causal
 *  mask); O_h = P V_h; y = concat_h(O_h) Wo^T + bo.
 *
 *  Memory of the score matrix (the hot spot, seq^2 per head): forward keeps
 *  no scores. It computes a chunk of (sample, head) pairs at a time in one
 *  [samples, heads, seq, seq] workspace owned by the layer (shared by every
 *  micro-batch, at most 64 MiB unless set_score_workspace_limit says
 *  otherwise: every pair of a small model, one sample's 12 heads of GPT-2
 *  small at seq 1024) and saves, per micro-batch, Q, K, V and the
 *  concatenated heads O (4 x seq x hidden values per sample)
 *  plus each query row's log-sum-exp (heads x seq). Backward recomputes
 *  S = Q K^T of a chunk and rebuilds P from the log-sum-exp, in two such
 *  workspaces. What it saves: keeping P would cost heads x seq^2 values per
 *  sample and micro-batch in flight (GPT-2 small, seq 1024, 12 heads: 12.6 M
 *  values per sample, against 3.1 M for Q, K, V and O); the price is one
 *  extra seq x seq x d product per head in backward (7 instead of 6 such
 *  products per head and step).
 *
 *  Launches (what a device pays per call): each step of a chunk is one
 *  batched launch over its (sample, head) pairs, telar::gemm_batched reading
 *  the heads of Q, K, V and writing those of O, dQ, dK, dV in place through
 *  strides (no per-head copies); so forward and backward launch the same
 *  kernels at every batch size and head count while the scores fit in one
 *  chunk (3 launches forward, 7 backward, per chunk; before, 7 and 14 per
 *  pair). On the host, oneDNN and BLAS still multiply pair by pair inside
 *  telar::gemm_batched, where a call costs no launch.
 */
#include <telar/core/detail/fast_math.hpp>
#include <telar/core/detail/host_simd.hpp>
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/detail/math.hpp>
#include <telar/core/error.hpp>
#include <telar/core/gemm.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/dense.hpp>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

namespace telar {

namespace detail {

// Geometry of one micro-batch: n samples of seq positions; `width` columns
// (heads x d) of the Q, K, V and O matrices as [n * seq, width].
struct AttentionGeometry {
  std::size_t n = 0, seq = 0, heads = 0, d = 0;
  std::size_t width() const { return heads * d; }
};

// A block of the (sample, head) pairs that one set of batched launches
// covers: samples [s0, s0 + ns), heads [h0, h0 + nh) of `heads`.
struct AttentionChunk {
  std::size_t s0 = 0, ns = 0, h0 = 0, nh = 0, heads = 0, seq = 0;
  // Position in the log-sum-exp and row-dot vectors of row i of pair (a, b).
  KOKKOS_INLINE_FUNCTION std::size_t row(std::size_t a, std::size_t b, std::size_t i) const {
    return ((s0 + a) * heads + h0 + b) * seq + i;
  }
  std::size_t rows() const { return ns * nh * seq; }
};

// The host's softmax: a row per call of a simd_for, its maximum and sum in
// lane_reduce's order and exp vectorisable (fast_exp; its arguments are at
// most 0), so 16 wide where the CPU has AVX-512.
template <class Exec, class S, class L>
void attn_softmax_rows(Exec const& exec, S const& s, L const& lse, AttentionChunk c) {
  using T = typename S::non_const_value_type;
  static_assert(std::is_same_v<typename S::array_layout, Kokkos::LayoutRight>, "rows contiguous");
  simd_for(
      "telar::CausalSelfAttention::softmax", exec, c.rows(),
      [=](std::size_t r) {
        std::size_t const i = r % c.seq, b = r / c.seq % c.nh, a = r / (c.seq * c.nh);
        T* row = &s(a, b, i, 0);
        auto at = [&](std::size_t j) { return row[j]; };
        T const m = lane_reduce<T>(i + 1, row[0], at, [](T u, T v) { return detail::max(u, v); });
        for (std::size_t j = 0; j <= i; ++j)
          row[j] = detail::fast_exp(row[j] - m);
        T const sum = lane_sum<T>(i + 1, at), inv = T(1) / sum;
        for (std::size_t j = 0; j <= i; ++j)
          row[j] *= inv;
        for (std::size_t j = i + 1; j < c.seq; ++j)
          row[j] = T(0);
        lse(c.row(a, b, i)) = m + detail::log(sum);
      },
      1);
}

// In place on the chunk's scaled scores s [ns, nh, seq, seq]: row i becomes
// the softmax over j <= i (0 beyond); lse(row) = log sum_j exp(s(i, j)).
template <class Exec, class S, class L>
void attn_softmax(Exec const& exec, S const& s, L const& lse, AttentionChunk c) {
  using T = typename S::non_const_value_type;
  if constexpr (runs_on_host_v<Exec>)
    return attn_softmax_rows(exec, s, lse, c);
  Kokkos::parallel_for(
      "telar::CausalSelfAttention::softmax", Kokkos::RangePolicy<Exec>(exec, 0, c.rows()),
      KOKKOS_LAMBDA(std::size_t r) {
        std::size_t const i = r % c.seq, b = r / c.seq % c.nh, a = r / (c.seq * c.nh);
        T m = s(a, b, i, 0);
        for (std::size_t j = 1; j <= i; ++j)
          m = detail::max(m, s(a, b, i, j));
        T sum = 0;
        for (std::size_t j = 0; j <= i; ++j) {
          s(a, b, i, j) = detail::exp(s(a, b, i, j) - m);
          sum += s(a, b, i, j);
        }
        T const inv = T(1) / sum;
        for (std::size_t j = 0; j < c.seq; ++j)
          s(a, b, i, j) = j <= i ? s(a, b, i, j) * inv : T(0);
        lse(c.row(a, b, i)) = m + detail::log(sum);
      });
}

// In place on recomputed scaled scores: P = exp(S - lse), 0 beyond i (on
// the host with the softmax's exp, a row per call).
template <class Exec, class S, class L>
void attn_probabilities(Exec const& exec, S const& s, L const& lse, AttentionChunk c) {
  using T = typename S::non_const_value_type;
  if constexpr (runs_on_host_v<Exec>) {
    static_assert(std::is_same_v<typename S::array_layout, Kokkos::LayoutRight>, "rows contiguous");
    return simd_for(
        "telar::CausalSelfAttention::probabilities", exec, c.rows(),
        [=](std::size_t r) {
          std::size_t const i = r % c.seq, b = r / c.seq % c.nh, a = r / (c.seq * c.nh);
          T* row = &s(a, b, i, 0);
          T const l = lse(c.row(a, b, i));
          for (std::size_t j = 0; j < c.seq; ++j)
            row[j] = j <= i ? detail::fast_exp(row[j] - l) : T(0);
        },
        1);
  }
  Kokkos::parallel_for(
      "telar::CausalSelfAttention::probabilities",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<4>>(exec, {0, 0, 0, 0}, {c.ns, c.nh, c.seq, c.seq}),
      KOKKOS_LAMBDA(std::size_t a, std::size_t b, std::size_t i, std::size_t j) {
        s(a, b, i, j) = j <= i ? detail::exp(s(a, b, i, j) - lse(c.row(a, b, i))) : T(0);
      });
}

// In place: dp becomes dS = scale * P .* (dP - D_i), D_i = sum_c dO(i, c) O(i, c)
// (= sum_j P(i, j) dP(i, j)), the softmax's backward with the 1/sqrt(d) folded in.
template <class Exec, class P, class DP, class D>
void attn_dscores(Exec const& exec, P const& p, DP const& dp, D const& rowdot, AttentionChunk c,
                  typename DP::non_const_value_type scale) {
  Kokkos::parallel_for(
      "telar::CausalSelfAttention::dscores",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<4>>(exec, {0, 0, 0, 0}, {c.ns, c.nh, c.seq, c.seq}),
      KOKKOS_LAMBDA(std::size_t a, std::size_t b, std::size_t i, std::size_t j) {
        dp(a, b, i, j) = scale * p(a, b, i, j) * (dp(a, b, i, j) - rowdot(c.row(a, b, i)));
      });
}

// rowdot((s * heads + h) * seq + i) = sum_c dO(s * seq + i, h * d + c) O(...).
template <class Exec, class A, class B, class D>
void attn_rowdot(Exec const& exec, A const& dout, B const& out, D const& rowdot,
                 AttentionGeometry g) {
  using T = typename D::non_const_value_type;
  Kokkos::parallel_for(
      "telar::CausalSelfAttention::rowdot",
      Kokkos::RangePolicy<Exec>(exec, 0, g.n * g.heads * g.seq), KOKKOS_LAMBDA(std::size_t r) {
        std::size_t const i = r % g.seq, h = r / g.seq % g.heads, s = r / (g.seq * g.heads);
        T acc = 0;
        for (std::size_t c = 0; c < g.d; ++c)
          acc += dout(s * g.seq + i, h * g.d + c) * out(s * g.seq + i, h * g.d + c);
        rowdot(r) = acc;
      });
}

// v sized ext... (allocated anew, labelled "telar::CausalSelfAttention::<name>",
// when its extents differ).
template <class V, class... Ext>
void attn_ensure(V& v, char const* name, Ext... ext) {
  bool same = true;
  std::size_t const e[] = {std::size_t(ext)...};
  for (std::size_t i = 0; i < sizeof...(Ext); ++i)
    same = same && v.extent(i) == e[i];
  if (!same)
    v = V(Kokkos::view_alloc(Kokkos::WithoutInitializing,
                             std::string("telar::CausalSelfAttention::") + name),
          ext...);
}
// The buffers of one pass: matrices [n, k] and one value per (sample, head,
// position) in `rows`.
template <class M, class R>
void attn_ensure_pass(std::initializer_list<std::pair<M*, char const*>> matrices, std::size_t n,
                      std::size_t k, R& rows, char const* rows_name, std::size_t r) {
  for (auto const& [m, name] : matrices)
    attn_ensure(*m, name, n, k);
  attn_ensure(rows, rows_name, r);
}

} // namespace detail

/*! \brief Multi-head causal self-attention on [seq, hidden] samples (GPT-2's
 *  `CausalSelfAttention`, dropout left out): query, key and value
 *  projections, per head softmax(Q K^T / sqrt(d)) with a causal mask times
 *  V, and an output projection. See the file's notes for what is saved and
 *  what is recomputed.
 *
 *  Parameters, all initialised like telar::Dense (PyTorch's nn.Linear):
 *  "query.weight" [hidden, hidden], "query.bias", "key.weight", "key.bias",
 *  "value.weight", "value.bias", "proj.weight", "proj.bias". Row
 *  h * d + c of the query, key and value weights belongs to head h.
 *  backward_input and backward_weight are split; backward_input computes
 *  every inner gradient, which backward_weight then uses.
 *  \code
 *  telar::CausalSelfAttention<float> attn(768, 12);  // on [1024, 768]
 *  \endcode
 *  \tparam T value type \tparam MemorySpace memory space \tparam Gemm GEMM policy */
template <class T = float, class MemorySpace = DefaultMemorySpace, class Gemm = AutoGemm>
class CausalSelfAttention : public detail::ShapePreservingLayerTypes<T, MemorySpace> {
  using Proj = Dense<T, MemorySpace, Gemm>;
  using Mat = Matrix<T, MemorySpace>;
  using Vec = Vector<T, MemorySpace>;

public:
  /*! \brief Run together, the input part goes first: it makes the inner
   *  gradients the weight part needs. */
  static constexpr bool backward_input_first = true;
  /*! \brief Backward reads the input (the saved view), never the output. */
  static constexpr BackwardReads backward_reads = BackwardReads::input;
  /*! \brief What backward needs from forward (reused between steps), and the
   *  inner gradients backward_input leaves for backward_weight. */
  struct saved_type {
    ConstMatrix<T, MemorySpace> x;    //!< the input [n, seq * hidden]
    Mat q;                            //!< queries [n, seq * heads d]
    Mat k;                            //!< keys, as q
    Mat v;                            //!< values, as q
    Mat out;                          //!< concatenated heads, as q
    Vec lse;                          //!< log-sum-exp per (sample, head, query)
    mutable Mat dq;                   //!< dL/dq
    mutable Mat dk;                   //!< dL/dk
    mutable Mat dv;                   //!< dL/dv
    mutable Mat dout;                 //!< dL/dout
    mutable Vec rowdot;               //!< sum_c dO O per (sample, head, query)
    mutable bool grads_ready = false; //!< backward_input ran since the forward
  };

  /*! \brief An empty layer; assign a configured one before use. */
  CausalSelfAttention() = default;
  /*! \brief \param hidden model width \param heads attention heads (must divide hidden)
   *  \param bias biases in the projections
   *  \throws Error when heads is 0 or does not divide hidden */
  CausalSelfAttention(std::size_t hidden, std::size_t heads, bool bias = true)
      : hidden_(hidden), heads_(heads), heads_local_(heads), q_(hidden, hidden, bias),
        k_(hidden, hidden, bias), v_(hidden, hidden, bias), proj_(hidden, hidden, bias) {
    if (heads == 0 || hidden % heads != 0)
      throw Error("telar::CausalSelfAttention: hidden size " + std::to_string(hidden) +
                  " cannot be split into " + std::to_string(heads) + " heads");
  }

  /*! \brief The same layer (configuration and projections) under another
   *  GEMM policy: what telar::Precision's rebind of a model makes.
   *  \tparam G the other policy \param o the layer */
  template <class G, class = std::enable_if_t<!std::is_same_v<G, Gemm>>>
  explicit CausalSelfAttention(CausalSelfAttention<T, MemorySpace, G> const& o)
      : hidden_(o.hidden_), heads_(o.heads_), heads_local_(o.heads_local_), q_(o.q_), k_(o.k_),
        v_(o.v_), proj_(o.proj_), score_limit_(o.score_limit_) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "CausalSelfAttention"; }
  /*! \brief The input's shape. \param in [seq, hidden]
   *  \throws ShapeError for another shape */
  Shape output_shape(Shape const& in) const {
    if (in.rank != 2 || in[1] != hidden_ || in[0] == 0)
      throw ShapeError("CausalSelfAttention expects [seq, " + std::to_string(hidden_) + "], got " +
                       in.str());
    return in;
  }
  /*! \brief Model width. */
  std::size_t hidden() const { return hidden_; }
  /*! \brief Number of heads. */
  std::size_t heads() const { return heads_; }
  /*! \brief Forward multiply-adds times 2: four projections and, per head,
   *  two seq x seq x d products. \param samples rows \param in [seq, hidden] */
  double flops(std::size_t samples, Shape const& in) const {
    double const s = double(samples), seq = double(in[0]), h = double(hidden_);
    double const local = double(heads_local_ * (hidden_ / heads_)); // this rank's heads x d
    return s * (8.0 * seq * h * local + 4.0 * seq * seq * local);
  }

  /*! \brief Values of the four projections this rank holds (its heads'
   *  rows of Q, K, V, their columns of the output projection, all of its bias). */
  std::size_t parameter_count() const {
    std::size_t const local = heads_local_ * (hidden_ / heads_), b = q_.has_bias() ? 1 : 0;
    return 4 * local * hidden_ + b * (3 * local + hidden_);
  }
  /*! \brief Q, K, V, O and their gradients, and two values per (sample,
   *  head, query): the log-sum-exp and the row dots of backward (the
   *  per-head scores are a workspace shared by every micro-batch).
   *  \param samples rows \param in [seq, hidden] */
  std::size_t saved_bytes(std::size_t samples, Shape const& in) const {
    std::size_t const seq = in[0], local = heads_local_ * (hidden_ / heads_);
    return 8 * detail::view_bytes<T>(samples * seq * local) +
           2 * detail::view_bytes<T>(samples * heads_local_ * seq);
  }
  /*! \brief Two score workspaces [samples, heads, seq, seq] of one chunk of
   *  (sample, head) pairs (at most score_workspace_limit() bytes each unless
   *  one pair alone is larger), whatever the micro-batches in flight.
   *  \param samples rows \param in [seq, hidden] */
  std::size_t workspace_bytes(std::size_t samples, Shape const& in) const {
    auto const [cs, ch] = chunk_shape({samples, in[0], heads_local_, hidden_ / heads_});
    return 2 * detail::view_bytes<T>(cs * ch * in[0] * in[0]);
  }

  /*! \brief Allocates and draws the four projections. \param seed stream seed */
  void initialize(std::uint64_t seed) {
    q_.initialize(detail::mix_seed(seed, 0));
    k_.initialize(detail::mix_seed(seed, 1));
    v_.initialize(detail::mix_seed(seed, 2));
    proj_.initialize(detail::mix_seed(seed, 3));
  }
  /*! \brief Visits the projections' weights and biases (see the class notes).
   *  \param f callable as f(char const*, View&, View&) */
  template <class F>
  void parameters(F&& f) {
    visit(f, q_, "query.weight", "query.bias");
    visit(f, k_, "key.weight", "key.bias");
    visit(f, v_, "value.weight", "value.bias");
    visit(f, proj_, "proj.weight", "proj.bias");
  }

  /*! \brief y = attention(x). \param exec execution space instance
   *  \param x [n, seq * hidden] \param y as x \param saved Q, K, V, O, log-sum-exp */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type& saved) const {
    forward_impl(exec, x, y, saved, [](auto const&) {});
  }

  /*! \brief dL/dx, keeping the inner gradients for backward_weight.
   *  \param exec execution space instance \param dy output gradient
   *  \param dx input gradient \param saved state of the matching forward */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      saved_type const& saved) const {
    backward_input_impl(exec, dy, dx, saved, [](auto const&) {});
  }

  /*! \brief forward, with \p reduce(view) summing the output projection's
   *  partial products over the heads' owners before the bias is added (a
   *  no-op when this layer holds every head).
   *  \param exec execution space instance \param x [n, seq * hidden] \param y as x
   *  \param saved Q, K, V, O, log-sum-exp \param reduce callable on a Matrix */
  template <class Exec, class Reduce>
  void forward_impl(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
                    saved_type& saved, Reduce&& reduce) const {
    auto const g = geometry("forward", x.extent(0), x.extent(1), y.extent(0), y.extent(1));
    std::size_t const n = g.n, k = g.seq * g.width();
    detail::attn_ensure_pass<Mat>(
        {{&saved.q, "q"}, {&saved.k, "k"}, {&saved.v, "v"}, {&saved.out, "out"}}, n, k, saved.lse,
        "lse", n * g.heads * g.seq);
    saved.x = x;
    saved.grads_ready = false;
    typename Proj::saved_type unused;
    q_.forward(exec, x, saved.q, unused);
    k_.forward(exec, x, saved.k, unused);
    v_.forward(exec, x, saved.v, unused);
    core_forward(exec, saved, g);
    // y = O Wo^T, summed over the heads' owners, then + bo once.
    std::size_t const rows = n * g.seq;
    auto const yr = as_rows(y, rows, hidden_);
    gemm(Gemm{}, exec, 'N', 'T', T(1), as_rows(saved.out, rows, g.width()), proj_.weight, T(0), yr);
    reduce(y);
    if (proj_.has_bias())
      add_proj_bias(exec, yr);
  }

  /*! \brief y += bo on every row. Its own member, not a lambda inside
   *  forward_impl: nvcc refuses an extended __device__ lambda in a function
   *  whose template arguments include a type local to another function (the
   *  tensor-parallel caller's Reduce lambda).
   *  \param exec execution space instance \param yr [rows, hidden] */
  template <class Exec, class Rows>
  void add_proj_bias(Exec const& exec, Rows const& yr) const {
    auto b = proj_.bias;
    Kokkos::parallel_for(
        "telar::CausalSelfAttention::proj_bias",
        Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {yr.extent(0), yr.extent(1)}),
        KOKKOS_LAMBDA(std::size_t i, std::size_t j) { yr(i, j) += b(j); });
  }

  /*! \brief backward_input, with \p reduce(dx) summing the partial input
   *  gradients over the heads' owners (a no-op when this layer holds every head).
   *  \param exec execution space instance \param dy output gradient
   *  \param dx input gradient \param saved state of the matching forward
   *  \param reduce callable on a Matrix */
  template <class Exec, class Reduce>
  void backward_input_impl(Exec const& exec, ConstMatrix<T, MemorySpace> dy,
                           Matrix<T, MemorySpace> dx, saved_type const& saved,
                           Reduce&& reduce) const {
    auto const g =
        geometry("backward_input", dx.extent(0), dx.extent(1), dy.extent(0), dy.extent(1));
    inner_gradients(exec, dy, saved, g);
    // dx = dQ Wq + dK Wk + dV Wv, position-wise.
    std::size_t const rows = g.n * g.seq;
    auto const dxr = as_rows(dx, rows, hidden_);
    gemm(Gemm{}, exec, 'N', 'N', T(1), as_rows(saved.dq, rows, g.width()), q_.weight, T(0), dxr);
    gemm(Gemm{}, exec, 'N', 'N', T(1), as_rows(saved.dk, rows, g.width()), k_.weight, T(1), dxr);
    gemm(Gemm{}, exec, 'N', 'N', T(1), as_rows(saved.dv, rows, g.width()), v_.weight, T(1), dxr);
    reduce(dx);
  }

  /*! \brief dW and db of the four projections (accumulates).
   *  \param exec execution space instance \param dy output gradient
   *  \param saved state of the matching forward */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<T, MemorySpace> dy,
                       saved_type const& saved) const {
    auto const g = geometry("backward_weight", saved.x.extent(0), saved.x.extent(1), dy.extent(0),
                            dy.extent(1));
    if (!saved.grads_ready)
      inner_gradients(exec, dy, saved, g);
    proj_.backward_weight(exec, dy, typename Proj::saved_type{saved.out});
    q_.backward_weight(exec, saved.dq, typename Proj::saved_type{saved.x});
    k_.backward_weight(exec, saved.dk, typename Proj::saved_type{saved.x});
    v_.backward_weight(exec, saved.dv, typename Proj::saved_type{saved.x});
    saved.grads_ready = false;
  }

  /*! \brief Per chunk of (sample, head) pairs: S = Q K^T / sqrt(d), causal
   *  softmax, O = P V, each one batched launch over the chunk.
   *  \param exec execution space instance \param saved holds Q, K, V; receives
   *  O and the log-sum-exp \param g geometry */
  template <class Exec>
  void core_forward(Exec const& exec, saved_type& saved, detail::AttentionGeometry g) const {
    T const scale = T(1) / detail::sqrt(T(g.d));
    for_each_chunk(g, false, [&](detail::AttentionChunk c, Scores const& s, Scores const&) {
      auto const q = heads_of(saved.q, g, c), k = heads_of(saved.k, g, c),
                 v = heads_of(saved.v, g, c), o = heads_of(saved.out, g, c);
      gemm_batched(Gemm{}, exec, 'N', 'T', scale, q, k, T(0), s);
      detail::attn_softmax(exec, s, saved.lse, c);
      gemm_batched(Gemm{}, exec, 'N', 'N', T(1), s, v, T(0), o);
    });
  }

  /*! \brief dO from dy, then per chunk of (sample, head) pairs the
   *  recomputed P and dQ, dK, dV, into saved (batched launches over the
   *  chunk). \param exec execution space instance \param dy output gradient
   *  \param saved state of the matching forward \param g geometry */
  template <class Exec>
  void inner_gradients(Exec const& exec, ConstMatrix<T, MemorySpace> dy, saved_type const& saved,
                       detail::AttentionGeometry g) const {
    std::size_t const n = g.n, kk = g.seq * g.width();
    detail::attn_ensure_pass<Mat>(
        {{&saved.dq, "dq"}, {&saved.dk, "dk"}, {&saved.dv, "dv"}, {&saved.dout, "dout"}}, n, kk,
        saved.rowdot, "rowdot", n * g.heads * g.seq);
    proj_.backward_input(exec, dy, saved.dout, typename Proj::saved_type{saved.out});
    std::size_t const rows = n * g.seq;
    detail::attn_rowdot(exec, as_rows(saved.dout, rows, g.width()),
                        as_rows(saved.out, rows, g.width()), saved.rowdot, g);
    T const scale = T(1) / detail::sqrt(T(g.d));
    for_each_chunk(g, true, [&](detail::AttentionChunk c, Scores const& s, Scores const& dp) {
      auto const q = heads_of(saved.q, g, c), k = heads_of(saved.k, g, c),
                 v = heads_of(saved.v, g, c), dout = heads_of(saved.dout, g, c),
                 dq = heads_of(saved.dq, g, c), dk = heads_of(saved.dk, g, c),
                 dv = heads_of(saved.dv, g, c);
      gemm_batched(Gemm{}, exec, 'N', 'T', scale, q, k, T(0), s);
      detail::attn_probabilities(exec, s, saved.lse, c);
      gemm_batched(Gemm{}, exec, 'T', 'N', T(1), s, dout, T(0), dv); // dV = P^T dO
      gemm_batched(Gemm{}, exec, 'N', 'T', T(1), dout, v, T(0), dp); // dP = dO V^T
      detail::attn_dscores(exec, s, dp, saved.rowdot, c, scale);
      gemm_batched(Gemm{}, exec, 'N', 'N', T(1), dp, k, T(0), dq); // dQ = dS K
      gemm_batched(Gemm{}, exec, 'T', 'N', T(1), dp, q, T(0), dk); // dK = dS^T Q
    });
    saved.grads_ready = true;
  }

  /*! \brief Caps one score workspace at \p bytes (64 MiB unless set): (sample,
   *  head) pairs are batched up to it, so launches do not grow with the
   *  batch and the head count until seq^2 x heads x samples outgrows it
   *  (GPT-2 small at seq 1024 in float: 4 MiB a pair, one sample's 12 heads
   *  a chunk). One pair is always allowed.
   *  \param bytes most bytes per score workspace */
  void set_score_workspace_limit(std::size_t bytes) { score_limit_ = bytes; }
  /*! \brief The cap set by set_score_workspace_limit. */
  std::size_t score_workspace_limit() const { return score_limit_; }

  /*! \brief Score-sized values the layer's workspace holds now (the largest
   *  chunk's scores so far, and as many for dP once a backward ran),
   *  whatever the micro-batches in flight. */
  std::size_t score_workspace_size() const { return ws_.s.size() + ws_.dp.size(); }

protected:
  template <class, class, class>
  friend class CausalSelfAttention; // the converting constructor reads another policy's layer

  std::size_t hidden_ = 0;      //!< model width
  std::size_t heads_ = 1;       //!< all heads
  std::size_t heads_local_ = 1; //!< heads computed here (all, unless split by telar::HeadParallel)
  Proj q_;                      //!< query projection [heads_local d, hidden]
  Proj k_;                      //!< key projection, as q_
  Proj v_;                      //!< value projection, as q_
  Proj proj_;                   //!< output projection [hidden, heads_local d]

private:
  using Scores = Kokkos::View<T****, MemorySpace>;
  // Scores [samples, heads, seq, seq] of one chunk, plus dP in backward,
  // shared by every micro-batch.
  struct Workspace {
    Scores s, dp;
  };

  template <class F>
  static void visit(F& f, Proj& p, char const* w, char const* b) {
    f(w, p.weight, p.weight_grad);
    if (p.has_bias())
      f(b, p.bias, p.bias_grad);
  }

  // Samples and heads per chunk: all of both if their scores fit in
  // the limit, else heads of one sample, at least one.
  std::pair<std::size_t, std::size_t> chunk_shape(detail::AttentionGeometry g) const {
    std::size_t const pair = detail::view_bytes<T>(std::max<std::size_t>(1, g.seq * g.seq));
    std::size_t const pairs = std::max<std::size_t>(1, score_limit_ / pair);
    if (pairs >= g.heads)
      return {std::min(g.n, pairs / g.heads), g.heads};
    return {1, pairs};
  }

  // Calls f(chunk, scores, dP) over chunks covering every (sample, head),
  // the workspace views cut to the chunk (dP empty unless backward).
  template <class F>
  void for_each_chunk(detail::AttentionGeometry g, bool backward, F&& f) const {
    auto const [cs, ch] = chunk_shape(g);
    grow(ws_.s, cs * ch, g.seq);
    if (backward)
      grow(ws_.dp, cs * ch, g.seq);
    for (std::size_t s0 = 0; s0 < g.n; s0 += cs)
      for (std::size_t h0 = 0; h0 < g.heads; h0 += ch) {
        detail::AttentionChunk const c{
            s0, std::min(cs, g.n - s0), h0, std::min(ch, g.heads - h0), g.heads, g.seq};
        auto cut = [&](Scores const& v) { return v.size() == 0 ? Scores() : cut_scores(v, c); };
        f(c, cut(ws_.s), cut(ws_.dp));
      }
  }

  // v holds at least `pairs` score matrices afterwards (a smaller batch,
  // e.g. a pipeline's last micro-batch, reuses a larger workspace).
  static void grow(Scores& v, std::size_t pairs, std::size_t seq) {
    if (v.size() < pairs * seq * seq)
      v = Scores(Kokkos::view_alloc(Kokkos::WithoutInitializing,
                                    std::string("telar::CausalSelfAttention::workspace")),
                 pairs, 1, seq, seq);
  }

  // The first ns x nh score matrices of v, as a view of v's type (a full
  // chunk is v itself; a last, smaller one reuses its memory).
  static Scores cut_scores(Scores const& v, detail::AttentionChunk c) {
    return Scores(v.data(), c.ns, c.nh, c.seq, c.seq);
  }

  // Heads [h0, h0 + nh) of samples [s0, s0 + ns) of m [n, seq * width] as a
  // batch [ns, nh, seq, d] (no copies).
  template <class V>
  static auto heads_of(V const& m, detail::AttentionGeometry g, detail::AttentionChunk c) {
    std::size_t const w = g.width();
    return strided_batch<MemorySpace>(m.data() + c.s0 * g.seq * w + c.h0 * g.d, c.ns, g.seq * w,
                                      c.nh, g.d, g.seq, w, g.d);
  }

  detail::AttentionGeometry geometry(char const* what, std::size_t an, std::size_t ak,
                                     std::size_t bn, std::size_t bk) const {
    std::size_t const w = q_.weight.extent(0), local = heads_local_ * (hidden_ / heads_);
    bool const ok =
        hidden_ > 0 && an == bn && ak == bk && ak % hidden_ == 0 && ak > 0 && w == local && w > 0;
    if (!ok)
      throw ShapeError(std::string("telar::CausalSelfAttention::") + what +
                       ": expected [n, seq * " + std::to_string(hidden_) + "] twice, got [" +
                       std::to_string(an) + ", " + std::to_string(ak) + "] and [" +
                       std::to_string(bn) + ", " + std::to_string(bk) + "]" +
                       (w != local ? " (layer not initialised)" : ""));
    return detail::AttentionGeometry{an, ak / hidden_, heads_local_, hidden_ / heads_};
  }

  std::size_t score_limit_ = std::size_t(64) << 20;
  mutable Workspace ws_;
};

} // namespace telar
