// What telar/comm/detail/schedule.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/comm/detail/schedule.hpp>

namespace telar::detail {

TELAR_DECL void Schedule::add(Xfer::Kind k, int comm, int peer, std::size_t off, std::size_t cnt) {
  for (std::size_t o = 0; o < cnt; o += seg)
    ops.push_back(Xfer{k, static_cast<unsigned char>(comm), peer, off + o, std::min(seg, cnt - o)});
}

TELAR_DECL std::size_t block_begin(std::size_t n, int p, int c) {
  auto const q = n / static_cast<std::size_t>(p), r = n % static_cast<std::size_t>(p);
  auto const cc = static_cast<std::size_t>(c);
  return cc * q + std::min(cc, r);
}

TELAR_DECL int ring_reduce_scatter(Schedule& s, int comm, int r, int p, std::size_t base,
                                   std::size_t n) {
  if (p == 1)
    return 0;
  int const right = mod(r + 1, p), left = mod(r - 1, p);
  for (int t = 0; t < p - 1; ++t) {
    int const sc = mod(r - t, p), rc = mod(r - t - 1, p);
    s.add(Xfer::send, comm, right, base + block_begin(n, p, sc), block_size(n, p, sc));
    s.add(Xfer::recv_reduce, comm, left, base + block_begin(n, p, rc), block_size(n, p, rc));
  }
  return mod(r + 1, p);
}

TELAR_DECL void ring_allgather(Schedule& s, int comm, int r, int p, std::size_t base,
                               std::size_t n) {
  if (p == 1)
    return;
  int const right = mod(r + 1, p), left = mod(r - 1, p);
  for (int t = 0; t < p - 1; ++t) {
    int const sc = mod(r + 1 - t, p), rc = mod(r - t, p);
    s.add(Xfer::send, comm, right, base + block_begin(n, p, sc), block_size(n, p, sc));
    s.add(Xfer::recv_copy, comm, left, base + block_begin(n, p, rc), block_size(n, p, rc));
  }
}

TELAR_DECL void recursive_halving_doubling(Schedule& s, int comm, int r, int p, std::size_t n) {
  if (p == 1)
    return;
  int p2 = 1;
  while (p2 * 2 <= p)
    p2 *= 2;
  int const rem = p - p2;
  int nr; // rank among the p2 active ranks, -1 when folded out
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      s.add(Xfer::send, comm, r + 1, 0, n);
      s.add(Xfer::recv_copy, comm, r + 1, 0, n);
      return;
    }
    s.add(Xfer::recv_reduce, comm, r - 1, 0, n);
    nr = r / 2;
  } else {
    nr = r - rem;
  }
  auto real = [rem](int q) { return q < rem ? 2 * q + 1 : q + rem; };
  int lo = 0, hi = p2; // blocks this rank is responsible for, of p2
  struct Half {
    int peer, lo, hi;
  };
  std::vector<Half> given; // what was handed to the partner at each step
  for (int m = p2 / 2; m >= 1; m /= 2) {
    int const partner = real(nr ^ m);
    int const mid = lo + (hi - lo) / 2;
    int slo, shi;
    if ((nr & m) == 0) {
      slo = mid, shi = hi, hi = mid;
    } else {
      slo = lo, shi = mid, lo = mid;
    }
    std::size_t const sb = block_begin(n, p2, slo), se = block_begin(n, p2, shi);
    std::size_t const kb = block_begin(n, p2, lo), ke = block_begin(n, p2, hi);
    s.add(Xfer::send, comm, partner, sb, se - sb);
    s.add(Xfer::recv_reduce, comm, partner, kb, ke - kb);
    given.push_back(Half{partner, slo, shi});
  }
  for (auto it = given.rbegin(); it != given.rend(); ++it) {
    std::size_t const ob = block_begin(n, p2, lo), oe = block_begin(n, p2, hi);
    std::size_t const gb = block_begin(n, p2, it->lo), ge = block_begin(n, p2, it->hi);
    s.add(Xfer::send, comm, it->peer, ob, oe - ob);
    s.add(Xfer::recv_copy, comm, it->peer, gb, ge - gb);
    lo = std::min(lo, it->lo);
    hi = std::max(hi, it->hi);
  }
  if (r < 2 * rem)
    s.add(Xfer::send, comm, r - 1, 0, n);
}

} // namespace telar::detail
