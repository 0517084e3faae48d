#pragma once
/*! \file
 *  \brief Token embedding (telar::Embedding) and learned positional
 *  embedding (telar::PositionalEmbedding) for [sequence, hidden] samples.
 *
 *  A batch is a matrix of T, so token ids travel as T values: a sample of
 *  `seq` tokens is a row of `seq` ids. Integers are exact in float up to 2^24
 *  (16,777,216) and in double up to 2^53, far above any vocabulary in use;
 *  an id that is negative, not an integer or not below the vocabulary size
 *  is refused with telar::Error.
 *
 *  Weight gradients are accumulated without atomics, in a fixed order, so
 *  two runs give bitwise the same gradients on every backend.
 */
#include <telar/core/detail/counter_rng.hpp>
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/detail/math.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>

#include <cstdint>
#include <string>

namespace telar {

namespace detail {

// Uniform in +-sqrt(3) * std: the standard deviation GPT-2 draws embeddings
// with (normal there), from the counter generator so shards get serial values.
template <class W>
void embedding_fill(W const& w, std::uint64_t seed, double std_dev) {
  using T = typename W::non_const_value_type;
  using Exec = typename W::memory_space::execution_space;
  T const bound = T(std_dev * 1.7320508075688772);
  std::size_t const cols = w.extent(1);
  Kokkos::parallel_for(
      "telar::Embedding::initialize",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>({0, 0}, {w.extent(0), w.extent(1)}),
      KOKKOS_LAMBDA(std::size_t i, std::size_t j) {
        w(i, j) = uniform_at(seed, i * cols + j, -bound, bound);
      });
  Kokkos::fence();
}

// Allocates a table [rows, hidden] and its gradient, labelled after `layer`,
// and draws the table (embedding_fill).
template <class T, class M>
void embedding_allocate(Matrix<T, M>& w, Matrix<T, M>& wg, std::size_t rows, std::size_t hidden,
                        char const* layer, std::uint64_t seed, double std_dev) {
  std::string const a(layer);
  w = Matrix<T, M>(a + "::weight", rows, hidden);
  wg = Matrix<T, M>(a + "::weight_grad", rows, hidden);
  embedding_fill(w, seed, std_dev);
}

// Flat index of the first id that is not an integer in [0, vocab); the
// largest std::size_t if there is none.
template <class Exec, class X>
std::size_t embedding_first_bad(Exec const& exec, X const& ids, std::size_t vocab) {
  using T = typename X::non_const_value_type;
  std::size_t const k = ids.extent(1);
  std::size_t first = 0;
  Kokkos::parallel_reduce(
      "telar::Embedding::check_ids", Kokkos::RangePolicy<Exec>(exec, 0, ids.extent(0) * k),
      KOKKOS_LAMBDA(std::size_t p, std::size_t & acc) {
        T const v = ids(p / k, p % k);
        bool const ok = v >= T(0) && v < T(vocab) && T(std::int64_t(v)) == v;
        if (!ok && p < acc)
          acc = p;
      },
      Kokkos::Min<std::size_t>(first));
  return first;
}

template <class Exec, class X, class W, class Y>
void embedding_forward(Exec const& exec, X const& ids, W const& w, Y const& y) {
  std::size_t const seq = ids.extent(1), hidden = w.extent(1);
  Kokkos::parallel_for(
      "telar::Embedding::forward",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {ids.extent(0) * seq, hidden}),
      KOKKOS_LAMBDA(std::size_t p, std::size_t h) {
        std::size_t const id = std::size_t(ids(p / seq, p % seq));
        y(p / seq, (p % seq) * hidden + h) = w(id, h);
      });
}

// dW[id, h] += dy[p, h] over positions p in order: one thread per column h
// owns that column of dW, so no two threads write one entry and the sum
// order is fixed (bitwise reproducible, no atomics).
template <class Exec, class X, class DY, class G>
void embedding_backward_weight(Exec const& exec, X const& ids, DY const& dy, G const& g) {
  std::size_t const seq = ids.extent(1), hidden = g.extent(1), positions = ids.extent(0) * seq;
  Kokkos::parallel_for(
      "telar::Embedding::backward_weight", Kokkos::RangePolicy<Exec>(exec, 0, hidden),
      KOKKOS_LAMBDA(std::size_t h) {
        for (std::size_t p = 0; p < positions; ++p) {
          std::size_t const id = std::size_t(ids(p / seq, p % seq));
          g(id, h) += dy(p / seq, (p % seq) * hidden + h);
        }
      });
}

} // namespace detail

/*! \brief Token embedding: a sample of \p seq token ids, stored as T values
 *  (shape [seq]), becomes [seq, hidden], row id of a learned [vocab, hidden]
 *  table per token (PyTorch's `nn.Embedding(vocab, hidden)`).
 *
 *  The input is integer, so there is no input gradient: backward_input
 *  writes zeros (a model's first layer never runs it). The table's gradient
 *  is accumulated by column, each column's positions in order, with no
 *  atomics: bitwise reproducible. Parameter "weight" [vocab, hidden] is drawn
 *  uniform with standard deviation 0.02 (GPT-2's).
 *  \code
 *  telar::Embedding<float> tok(50257, 768);   // [1024] ids -> [1024, 768]
 *  \endcode
 *  \tparam T value type (also of the ids) \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
class Embedding : public detail::LayerTypes<T, MemorySpace> {
public:
  /*! \brief Backward reads the ids (the input), never the output. */
  static constexpr BackwardReads backward_reads = BackwardReads::input;
  /*! \brief What backward needs: the ids. */
  struct saved_type {
    ConstMatrix<T, MemorySpace> ids; //!< the forward input [n, seq]
  };

  /*! \brief An empty layer; assign a configured one before use. */
  Embedding() = default;
  /*! \brief \param vocab number of tokens \param hidden embedding size */
  Embedding(std::size_t vocab, std::size_t hidden) : vocab_(vocab), hidden_(hidden) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "Embedding"; }
  /*! \brief [seq, hidden] for ids [seq]. \param in [seq]
   *  \throws ShapeError for another rank */
  Shape output_shape(Shape const& in) const {
    if (in.rank != 1 || in[0] == 0)
      throw ShapeError("Embedding expects token ids [seq], got " + in.str());
    return Shape{in[0], hidden_};
  }
  /*! \brief Vocabulary size. */
  std::size_t vocab() const { return vocab_; }
  /*! \brief Embedding size. */
  std::size_t hidden() const { return hidden_; }
  /*! \brief Cost estimate (a copy per output value). \param samples rows \param in [seq] */
  double flops(std::size_t samples, Shape const& in) const {
    return double(samples) * double(in.size()) * double(hidden_);
  }

  /*! \brief Values of the table. */
  std::size_t parameter_count() const { return vocab_ * hidden_; }
  /*! \brief Keeps a view of the ids: 0. */
  std::size_t saved_bytes(std::size_t, Shape const&) const { return 0; }

  /*! \brief Allocates and draws the table. \param seed stream seed */
  void initialize(std::uint64_t seed) {
    detail::embedding_allocate(weight, weight_grad, vocab_, hidden_, "telar::Embedding", seed,
                               0.02);
  }
  /*! \brief Visits ("weight", table). \param f callable as f(char const*, View&, View&) */
  template <class F>
  void parameters(F&& f) {
    f("weight", weight, weight_grad);
  }

  /*! \brief y[s, :] = weight[id[s], :]. \param exec execution space instance
   *  \param x ids [n, seq] \param y [n, seq * hidden] \param saved keeps the ids
   *  \throws Error naming the first id that is not an integer in [0, vocab) */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               saved_type& saved) const {
    check(x.extent(0), x.extent(1), y.extent(0), y.extent(1));
    std::size_t const p = detail::embedding_first_bad(exec, x, vocab_);
    if (p < x.extent(0) * x.extent(1)) {
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, x);
      throw Error("telar::Embedding: token id " +
                  std::to_string(h(p / x.extent(1), p % x.extent(1))) + " at sample " +
                  std::to_string(p / x.extent(1)) + ", position " +
                  std::to_string(p % x.extent(1)) + " is not an integer in [0, " +
                  std::to_string(vocab_) + ")");
    }
    saved.ids = x;
    detail::embedding_forward(exec, x, weight, y);
  }
  /*! \brief Zeros: ids have no gradient. \param exec execution space instance
   *  \param dy output gradient (unused) \param dx [n, seq], set to 0 */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      saved_type const&) const {
    (void)dy;
    Kokkos::deep_copy(exec, dx, T(0));
  }
  /*! \brief weight_grad[id] += dy at each position (accumulates, deterministic).
   *  \param exec execution space instance \param dy [n, seq * hidden]
   *  \param saved the ids of the matching forward */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<T, MemorySpace> dy,
                       saved_type const& saved) const {
    check(saved.ids.extent(0), saved.ids.extent(1), dy.extent(0), dy.extent(1));
    detail::embedding_backward_weight(exec, saved.ids, dy, weight_grad);
  }

  Matrix<T, MemorySpace> weight;      //!< the table [vocab, hidden]
  Matrix<T, MemorySpace> weight_grad; //!< dL/dtable

private:
  void check(std::size_t xn, std::size_t seq, std::size_t yn, std::size_t yk) const {
    if (xn != yn || yk != seq * hidden_ || weight.extent(0) != vocab_)
      throw ShapeError("telar::Embedding: expected ids [n, seq] -> [n, seq * " +
                       std::to_string(hidden_) + "], got [" + std::to_string(xn) + ", " +
                       std::to_string(seq) + "] -> [" + std::to_string(yn) + ", " +
                       std::to_string(yk) + "]" +
                       (weight.extent(0) != vocab_ ? " (layer not initialised)" : ""));
  }

  std::size_t vocab_ = 0;
  std::size_t hidden_ = 0;
};

/*! \brief Learned positional embedding: y[s, h] = x[s, h] + table[s, h] over
 *  [seq, hidden] samples, with a [context, hidden] table (GPT-2's wpe) and
 *  seq <= context.
 *
 *  dx = dy; the table's gradient sums over samples in order, one thread per
 *  entry (deterministic). Parameter "weight" [context, hidden] is drawn
 *  uniform with standard deviation 0.01 (GPT-2's).
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T = float, class MemorySpace = DefaultMemorySpace>
class PositionalEmbedding : public detail::ShapePreservingLayerTypes<T, MemorySpace> {
public:
  /*! \brief An empty layer; assign a configured one before use. */
  PositionalEmbedding() = default;
  /*! \brief \param context longest sequence \param hidden embedding size */
  PositionalEmbedding(std::size_t context, std::size_t hidden)
      : context_(context), hidden_(hidden) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "PositionalEmbedding"; }
  /*! \brief The input's shape. \param in [seq, hidden], seq <= context
   *  \throws ShapeError naming seq and context, or the expected shape */
  Shape output_shape(Shape const& in) const {
    if (in.rank != 2 || in[1] != hidden_)
      throw ShapeError("PositionalEmbedding expects [seq, " + std::to_string(hidden_) + "], got " +
                       in.str());
    if (in[0] > context_)
      throw ShapeError("PositionalEmbedding: sequence length " + std::to_string(in[0]) +
                       " exceeds the context of " + std::to_string(context_));
    return in;
  }
  /*! \brief Longest sequence. */
  std::size_t context() const { return context_; }
  /*! \brief Cost estimate. \param samples rows \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    return double(samples) * double(in.size());
  }

  /*! \brief Values of the table. */
  std::size_t parameter_count() const { return context_ * hidden_; }

  /*! \brief Allocates and draws the table. \param seed stream seed */
  void initialize(std::uint64_t seed) {
    detail::embedding_allocate(weight, weight_grad, context_, hidden_, "telar::PositionalEmbedding",
                               seed, 0.01);
  }
  /*! \brief Visits ("weight", table). \param f callable as f(char const*, View&, View&) */
  template <class F>
  void parameters(F&& f) {
    f("weight", weight, weight_grad);
  }

  /*! \brief y = x + table[:seq]. \param exec execution space instance
   *  \param x [n, seq * hidden] \param y as x */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               NoSaved&) const {
    check(x.extent(0), x.extent(1), y.extent(0), y.extent(1));
    auto w = weight;
    std::size_t const k = x.extent(1);
    Kokkos::parallel_for(
        "telar::PositionalEmbedding::forward",
        Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {x.extent(0), k}),
        KOKKOS_LAMBDA(std::size_t i, std::size_t f) { y(i, f) = x(i, f) + w.data()[f]; });
  }
  /*! \brief dx = dy. \param exec execution space instance \param dy output gradient
   *  \param dx input gradient */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<T, MemorySpace> dy, Matrix<T, MemorySpace> dx,
                      NoSaved const&) const {
    Kokkos::deep_copy(exec, dx, dy);
  }
  /*! \brief table[:seq] += sum over samples of dy (accumulates).
   *  \param exec execution space instance \param dy output gradient */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<T, MemorySpace> dy, NoSaved const&) const {
    auto g = weight_grad;
    std::size_t const n = dy.extent(0);
    Kokkos::parallel_for(
        "telar::PositionalEmbedding::backward_weight",
        Kokkos::RangePolicy<Exec>(exec, 0, dy.extent(1)), KOKKOS_LAMBDA(std::size_t f) {
          T s = 0;
          for (std::size_t i = 0; i < n; ++i)
            s += dy(i, f);
          g.data()[f] += s;
        });
  }

  Matrix<T, MemorySpace> weight;      //!< the table [context, hidden]
  Matrix<T, MemorySpace> weight_grad; //!< dL/dtable

private:
  void check(std::size_t xn, std::size_t xk, std::size_t yn, std::size_t yk) const {
    bool const ok = hidden_ > 0 && xn == yn && xk == yk && xk % hidden_ == 0 &&
                    xk / hidden_ <= context_ && weight.extent(0) == context_;
    if (!ok)
      throw ShapeError("telar::PositionalEmbedding: expected [n, seq * " + std::to_string(hidden_) +
                       "] with seq <= " + std::to_string(context_) + " twice, got [" +
                       std::to_string(xn) + ", " + std::to_string(xk) + "] and [" +
                       std::to_string(yn) + ", " + std::to_string(yk) + "]" +
                       (weight.extent(0) != context_ ? " (layer not initialised)" : ""));
  }

  std::size_t context_ = 0;
  std::size_t hidden_ = 0;
};

} // namespace telar
