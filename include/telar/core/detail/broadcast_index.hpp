#pragma once
// telar::detail::BroadcastIndex: a table broadcast over a sample as NumPy and
// ONNX broadcast, shared by telar::Bias and telar::Multiplier (an imported
// Add/Sub or Mul/Div of a constant), and the deterministic per-entry sum
// their table gradients need.
#include <telar/core/shape.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace telar {

namespace detail {

// A table broadcast over a sample: the table's axes right-aligned with the
// sample's (missing leading axes count as 1), each extent equal to the
// sample's or 1. Maps a sample position to its table entry, and the q-th
// position reading an entry back (for a gradient summed without atomics).
struct BroadcastIndex {
  int rank = 0;
  std::size_t in[Shape::max_rank] = {}, tab[Shape::max_rank] = {};

  // Whether \p table broadcasts over \p sample (fills in the extents).
  bool set(Shape const& sample, Shape const& table) {
    rank = sample.rank;
    if (!sample.known() || !table.known() || table.rank > sample.rank)
      return false;
    for (int k = 0; k < rank; ++k) {
      int const t = k - (rank - table.rank); // the table's axis aligned with k
      in[k] = sample[k];
      tab[k] = t < 0 ? 1 : table[t];
      if (tab[k] != in[k] && tab[k] != 1)
        return false;
    }
    return true;
  }
  // The table entry that sample position e reads.
  KOKKOS_INLINE_FUNCTION std::size_t entry(std::size_t e) const {
    std::size_t t = 0, stride = 1;
    for (int k = rank - 1; k >= 0; --k) {
      std::size_t const c = e % in[k];
      e /= in[k];
      if (tab[k] != 1)
        t += c * stride;
      stride *= tab[k];
    }
    return t;
  }
  // The q-th sample position (q < sample size / table size) reading entry t.
  KOKKOS_INLINE_FUNCTION std::size_t position(std::size_t t, std::size_t q) const {
    std::size_t e = 0, stride = 1;
    for (int k = rank - 1; k >= 0; --k) {
      std::size_t c = 0;
      if (tab[k] != 1)
        c = t % tab[k], t /= tab[k];
      else
        c = q % in[k], q /= in[k];
      e += c * stride;
      stride *= in[k];
    }
    return e;
  }
};

// g(t) += finish(t, s), s the sum of term(n, e) over the samples n of \p rows
// and the \p repeats positions e that read entry t, summed in order (one
// thread per entry: deterministic, no atomics). The table gradient of
// telar::Bias (term dy) and telar::Multiplier (term dy x).
template <class Exec, class G, class Term, class Finish>
void broadcast_sum(Exec const& exec, char const* label, BroadcastIndex const& ix, std::size_t rows,
                   std::size_t repeats, G const& g, Term const& term, Finish const& finish) {
  using V = typename G::non_const_value_type;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<Exec>(exec, 0, g.extent(0)), KOKKOS_LAMBDA(std::size_t t) {
        V s = 0;
        for (std::size_t n = 0; n < rows; ++n)
          for (std::size_t q = 0; q < repeats; ++q)
            s += term(n, ix.position(t, q));
        g(t) += finish(t, s);
      });
}

} // namespace detail

} // namespace telar
