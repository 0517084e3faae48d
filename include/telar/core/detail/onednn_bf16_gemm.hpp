#pragma once
// oneDNN matmul behind telar::Bf16Gemm: C (f32) = alpha op(A) op(B) + beta C
// with A and B converted to bf16 by cached reorders into dense buffers, f32
// accumulation and output; for a batch of products (telar::gemm_batched:
// attention's (sample, head) pairs) one 4-D matmul, so the conversions and
// the product are three calls whatever the batch, not three per entry.
// Primitives, reorders and bf16 buffers are created once per (shape,
// transposes, leading dimensions and strides, alpha, beta) and thread; a
// steady-state call only sets data handles and executes.
#include <telar/config.hpp>

#if TELAR_HAVE_ONEDNN
#include <telar/core/detail/bf16_copy.hpp>
#include <telar/core/detail/onednn.hpp>
#include <telar/core/error.hpp>

#include <dnnl.hpp>

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace telar {
namespace detail {

// n floats rounded to bf16 as the matmul's own conversion rounds them (one
// oneDNN reorder per size, kept: a step rounds each weight shape in turn):
// the copy is the same words the reorder would have made.
inline void onednn_to_bf16(float const* in, std::uint16_t* out, std::int64_t n) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  struct Cached {
    dnnl::memory from, to;
    dnnl::reorder convert;
  };
  thread_local std::unordered_map<std::int64_t, Cached> cache;
  auto [it, fresh] = cache.try_emplace(n);
  Cached& c = it->second;
  if (fresh) {
    auto& eng = onednn_engine();
    c.from = dnnl::memory(dnnl::memory::desc({n}, dt::f32, tag::a), eng, DNNL_MEMORY_NONE);
    c.to = dnnl::memory(dnnl::memory::desc({n}, dt::bf16, tag::a), eng, DNNL_MEMORY_NONE);
    c.convert = dnnl::reorder(c.from, c.to);
  }
  c.from.set_data_handle(const_cast<float*>(in));
  c.to.set_data_handle(out);
  auto& s = onednn_stream();
  c.convert.execute(s, c.from, c.to);
  s.wait();
}

class OneDnnBf16Matmul {
public:
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;

  // A product's geometry: n1 x n2 entries (1 x 1: one GEMM), each op(A)
  // [m, k] times op(B) [k, n] into C [m, n], row-major with leading
  // dimensions lda, ldb, ldc; entry (i, j) starts i sa[0] + j sa[1] values
  // into A (likewise sb, sc).
  struct Geometry {
    char ta = 'N', tb = 'N';
    std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
    std::int64_t n1 = 1, n2 = 1;
    std::array<std::int64_t, 2> sa{}, sb{}, sc{}; // strides between entries (i, j)
    bool batched() const { return n1 * n2 > 1; }
  };

  // Row-major A, B, C with leading dimensions lda, ldb, ldc.
  void run(char ta, char tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           float const* A, std::int64_t lda, float const* B, std::int64_t ldb, float beta, float* C,
           std::int64_t ldc) {
    Geometry const g{ta, tb, m, n, k, lda, ldb, ldc};
    run(g, alpha, A, B, beta, C);
  }

  // Every entry of a batch (or one product) in one matmul. `a_words` or
  // `b_words` (not null): that operand already rounded, as the 1-D
  // conversion of a dense operand makes it (a layer's compact copy of its
  // input); its fp32 pointer is then not read.
  void run(Geometry const& g, float alpha, float const* A, float const* B, float beta, float* C,
           std::uint16_t const* a_words = nullptr, std::uint16_t const* b_words = nullptr) {
    Entry& e = entry(g, alpha, beta, a_words != nullptr);
    if ((a_words && !e.a_flat) || (b_words && !e.b_flat))
      throw Error("telar::gemm (telar::Bf16Gemm): an operand given in bf16 must be dense in its "
                  "own orientation");
    auto& s = onednn_stream();
    e.a_view.set_data_handle(a_words ? const_cast<std::uint16_t*>(a_words)
                                     : e.a.in(s, A).get_data_handle());
    Bf16Copy& copy = bf16_copy();
    std::uint16_t* const words = e.b_flat && !b_words ? copy.find(B, e.b_count) : nullptr;
    if (b_words) {
      e.b_view.set_data_handle(const_cast<std::uint16_t*>(b_words));
    } else if (words) { // B is a registered weight: rounded once this step
      if (!copy.made(B, e.b_count)) {
        onednn_to_bf16(B, words, e.b_count);
        copy.mark(B, e.b_count);
      }
      ++copy.hits;
      e.b_view.set_data_handle(words);
    } else {
      e.b.in(s, B);
      e.b_view.set_data_handle(e.b.inner.get_data_handle());
    }
    e.c.set_data_handle(C);
    e.prim.execute(s, e.args);
    s.wait();
  }

  // The implementation oneDNN picked for the last shape (tests, logs).
  std::string const& last_impl() const { return last_impl_; }
  // Shapes with primitives.
  std::size_t size() const { return entries_.size(); }

private:
  struct Entry {
    std::vector<std::int64_t> key;
    dnnl::matmul prim;
    OneDnnPort a, b;
    dnnl::memory a_view, b_view, c;      // what the matmul reads: the ports' bf16 buffers
    bool a_flat = false, b_flat = false; // converted as their bytes are (a 1-D reorder)
    std::int64_t b_count = 0;            // B's values
    std::unordered_map<int, dnnl::memory> args;
  };

  // A's bf16 copy gets a leading dimension this many values longer than its
  // rows when the product accumulates into a large C from a short k (below).
  static constexpr std::int64_t a_pad = 16;

  // Whether to pad A's copy: C += A B with k <= 512 into more than 2^20
  // values (an MLP's or a projection's weight gradient, k the batch's rows).
  // There oneDNN 2.6's brgemm matmul, which it picks for dense operands,
  // spends about 0.7 ns a value of C on the sum (2048x128 * 128x2048: 5.1 to
  // 5.8 ms, 2.5 without the sum), while its gemm-based bf16 matmul, which it
  // picks when A is not dense, accumulates as it goes (3.2 to 3.8 ms; k =
  // 512: 11.6 against 13.1 ms). Below 2^20 values, or with a longer k, the
  // brgemm is as fast or faster (2048x128 * 128x512: 0.71 against 0.83 ms).
  // A given in bf16 (a layer's compact copy) is read as it is, unpadded.
  static bool pads_a(Geometry const& g, float beta, bool a_given) {
    return !g.batched() && beta != 0.f && !a_given && g.k <= 512 && g.m * g.n > (1 << 20);
  }

  // Shapes kept per thread: an MLP step uses three per layer (forward, input
  // and weight gradients), times the batch sizes in use; the oldest goes.
  static constexpr std::size_t max_entries = 48;

  // dims of a [rows, cols] operand, with the batch's two dimensions in front.
  static dims shape(Geometry const& g, std::int64_t rows, std::int64_t cols) {
    return g.batched() ? dims{g.n1, g.n2, rows, cols} : dims{rows, cols};
  }
  // Its strides: entries `between` apart, rows ld apart (transposed: a swap).
  static dims strides(Geometry const& g, std::array<std::int64_t, 2> between, std::int64_t ld,
                      bool transposed) {
    dims const mat = transposed ? dims{1, ld} : dims{ld, 1};
    return g.batched() ? dims{between[0], between[1], mat[0], mat[1]} : mat;
  }
  // The bf16 copy of an operand: dense, rows contiguous (`transposed`: columns).
  static dnnl::memory::desc dense(Geometry const& g, std::int64_t rows, std::int64_t cols,
                                  bool transposed) {
    using tag = dnnl::memory::format_tag;
    tag const t =
        g.batched() ? (transposed ? tag::abdc : tag::abcd) : (transposed ? tag::ba : tag::ab);
    return dnnl::memory::desc(shape(g, rows, cols), dt::bf16, t);
  }

  Entry& entry(Geometry const& g, float alpha, float beta, bool a_given) {
    std::uint32_t ab, bb;
    std::memcpy(&ab, &alpha, 4);
    std::memcpy(&bb, &beta, 4);
    bool const pad = pads_a(g, beta, a_given);
    std::vector<std::int64_t> key{g.ta,    g.tb,    g.m,  g.n,     g.k,     g.lda,   g.ldb,
                                  g.ldc,   g.n1,    g.n2, g.sa[0], g.sa[1], g.sb[0], g.sb[1],
                                  g.sc[0], g.sc[1], ab,   bb,      pad};
    if (Entry* hit = cached_primitive(entries_, key, max_entries))
      return *hit;
    auto e = std::make_unique<Entry>();
    e->key = std::move(key);
    auto& eng = onednn_engine();
    std::int64_t const m = g.m, n = g.n, k = g.k;
    // The callers' f32 matrices as oneDNN sees op(A) [m, k] and op(B) [k, n]:
    // a transpose is a swap of strides.
    dnnl::memory::desc const a_user(shape(g, m, k), dt::f32, strides(g, g.sa, g.lda, g.ta != 'N'));
    dnnl::memory::desc const b_user(shape(g, k, n), dt::f32, strides(g, g.sb, g.ldb, g.tb != 'N'));
    dnnl::memory::desc const c_user(shape(g, m, n), dt::f32, strides(g, g.sc, g.ldc, false));
    // bf16 copies, dense, each in the caller's orientation, so a dense
    // operand converts as a 1-D reorder of its bytes. A transposed A (the
    // weight gradient's dy^T) used to be converted to row-major: a 2-D
    // transposing reorder, 5 ms for 2048x1024 against a matmul of 6 ms; the
    // transposed product costs less than that (transformer block, bf16: 4%
    // faster, 8 interleaved rounds, docs/precision.md). Not format "any":
    // oneDNN 2.6 then picks blocked weights (BA16a64b2a) whose reorder from
    // f32 costs about as much as the product (2048x2048: 24-41 ms against
    // 21-29 ms, one loaded core), while a plain f32 -> bf16 reorder is a
    // streaming conversion and brgemm packs plain B itself. A padded A (see
    // pads_a) keeps the caller's orientation too: a 2-D reorder row by row.
    dnnl::memory::desc const a_want =
        pad ? dnnl::memory::desc(dims{m, k}, dt::bf16,
                                 g.ta != 'N' ? dims{1, m + a_pad} : dims{k + a_pad, 1})
            : dense(g, m, k, g.ta != 'N');
    dnnl::memory::desc const b_want = dense(g, k, n, g.tb != 'N');
    dnnl::primitive_attr attr;
    dnnl::post_ops po;
    if (alpha != 1.f) {
#if DNNL_VERSION_MAJOR >= 3 // output scales are gone: alpha AB as a post-op, before the sum
      po.append_eltwise(dnnl::algorithm::eltwise_linear, alpha, 0.f);
#else
      attr.set_output_scales(0, {alpha});
#endif
    }
    if (beta != 0.f)
      po.append_sum(beta);
    attr.set_post_ops(po);
    try {
#if DNNL_VERSION_MAJOR >= 3 // no operation descriptors: the primitive's directly
      dnnl::matmul::primitive_desc pd(eng, a_want, b_want, c_user, attr);
#else
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_want, b_want, c_user), attr, eng);
#endif
      e->prim = dnnl::matmul(pd);
      // A is stored [m, k] ('N') or [k, m]; B [k, n] or [n, k]; a batch's
      // entries back to back, or not the same bytes.
      std::int64_t const entries = g.n1 * g.n2;
      bool const a_dense = !g.batched() || (g.sa[1] == m * k && g.sa[0] == g.n2 * m * k);
      bool const b_dense = !g.batched() || (g.sb[1] == k * n && g.sb[0] == g.n2 * k * n);
      e->a_flat = a_dense && !pad && g.lda == (g.ta == 'N' ? k : m);
      init_operand(e->a, e->a_view, a_user, pd.src_desc(), e->a_flat, entries * m * k);
      e->b_flat = b_dense && g.ldb == (g.tb == 'N' ? n : k);
      e->b_count = entries * k * n;
      init_operand(e->b, e->b_view, b_user, pd.weights_desc(), e->b_flat, e->b_count);
      e->c = dnnl::memory(c_user, eng, DNNL_MEMORY_NONE);
      e->args = {{DNNL_ARG_SRC, e->a_view}, {DNNL_ARG_WEIGHTS, e->b_view}, {DNNL_ARG_DST, e->c}};
      last_impl_ = pd.impl_info_str();
    } catch (dnnl::error const& err) {
      throw Error(std::string("telar::gemm (telar::Bf16Gemm): oneDNN could not create a bf16 "
                              "matmul for ") +
                  (g.batched() ? std::to_string(g.n1) + "x" + std::to_string(g.n2) + " of " : "") +
                  std::to_string(m) + "x" + std::to_string(k) + " * " + std::to_string(k) + "x" +
                  std::to_string(n) + ": " + err.what());
    }
    note_bf16_impl("matmul:" + last_impl_);
    entries_.push_back(std::move(e));
    return *entries_.back();
  }

  // An operand's conversion to bf16. In general a 2-D reorder (strides,
  // transposes); when the caller's matrix is dense and keeps its layout, a
  // 1-D reorder of its bytes: oneDNN 2.6's 2-D f32 -> bf16 reorder of a
  // column-major ("ba") 2048x2048 matrix measured 13-21 ms, the same bytes
  // as 1-D about 1 ms.
  static void init_operand(OneDnnPort& port, dnnl::memory& view, dnnl::memory::desc const& user,
                           dnnl::memory::desc const& want, bool same_bytes, std::int64_t count) {
    if (same_bytes) {
      using tag = dnnl::memory::format_tag;
      port.init(dnnl::memory::desc(dims{count}, dt::f32, tag::a),
                dnnl::memory::desc(dims{count}, dt::bf16, tag::a), true);
      view = dnnl::memory(want, onednn_engine(), port.inner.get_data_handle());
    } else {
      port.init(user, want, true);
      view = port.inner;
    }
  }

  std::vector<std::unique_ptr<Entry>> entries_;
  std::string last_impl_;
};

// The calling thread's matmul cache.
inline OneDnnBf16Matmul& onednn_bf16_matmul() {
  thread_local OneDnnBf16Matmul m;
  return m;
}

} // namespace detail
} // namespace telar

#endif // TELAR_HAVE_ONEDNN
