// What telar/schedule/generators.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/schedule/generators.hpp>

namespace telar::schedule {

TELAR_DECL Schedule gpipe(int p, int m) {
  detail::require_pm("gpipe", p, m);
  std::vector<std::vector<Instruction>> ranks(p);
  for (auto& list : ranks) {
    for (int k = 0; k < m; ++k)
      list.push_back({Op::Forward, k});
    for (int k = 0; k < m; ++k)
      list.push_back({Op::Backward, k});
  }
  return detail::finish(detail::names::gpipe, p, m, 1, std::move(ranks));
}

TELAR_DECL Schedule one_f_one_b(int p, int m) {
  detail::require_pm("one_f_one_b", p, m);
  std::vector<std::vector<Instruction>> ranks(p);
  for (int r = 0; r < p; ++r) {
    auto& list = ranks[r];
    int const warmup = std::min(p - r - 1, m);
    for (int k = 0; k < warmup; ++k)
      list.push_back({Op::Forward, k});
    for (int k = 0; k < m - warmup; ++k) {
      list.push_back({Op::Forward, warmup + k});
      list.push_back({Op::Backward, k});
    }
    for (int k = m - warmup; k < m; ++k)
      list.push_back({Op::Backward, k});
  }
  return detail::finish(detail::names::one_f_one_b, p, m, 1, std::move(ranks));
}

TELAR_DECL Schedule interleaved_1f1b(int p, int m, int v) {
  detail::require_pm("interleaved_1f1b", p, m, v);
  int const rounds = std::max(1, m / p);
  std::vector<int> sizes(rounds, m / rounds);
  for (int i = 0; i < m % rounds; ++i)
    ++sizes[i];
  // The forward order of (micro-batch, chunk) pairs, shared by all ranks.
  std::vector<std::pair<int, int>> order;
  order.reserve(static_cast<std::size_t>(m) * v);
  for (int i = 0, first = 0; i < rounds; first += sizes[i], ++i)
    for (int c = 0; c < v; ++c)
      for (int k = first; k < first + sizes[i]; ++k)
        order.emplace_back(k, c);
  int const total = m * v;
  std::vector<std::vector<Instruction>> ranks(p);
  for (int r = 0; r < p; ++r) {
    auto& list = ranks[r];
    int const wanted = v == 1 ? p - r - 1 : (v - 1) * sizes[0] + 2 * (p - r - 1);
    int const warmup = std::min(wanted, total);
    auto fwd = [&](int i) { list.push_back({Op::Forward, order[i].first, order[i].second}); };
    auto bwd = [&](int i) {
      list.push_back({Op::Backward, order[i].first, v - 1 - order[i].second});
    };
    for (int i = 0; i < warmup; ++i)
      fwd(i);
    for (int i = 0; i < total - warmup; ++i) {
      fwd(warmup + i);
      bwd(i);
    }
    for (int i = total - warmup; i < total; ++i)
      bwd(i);
  }
  return detail::finish(detail::names::interleaved, p, m, v, std::move(ranks));
}

TELAR_DECL Schedule zb_h1(int p, int m) {
  detail::require_pm("zb_h1", p, m);
  std::vector<std::vector<Instruction>> ranks(p);
  for (int r = 0; r < p; ++r) {
    auto& list = ranks[r];
    int nf = 0, nw = 0;
    for (int const warmup = std::min(p - r, m); nf < warmup; ++nf)
      list.push_back({Op::Forward, nf});
    for (int k = 0; k < m; ++k) {
      list.push_back({Op::BackwardInput, k});
      if (k >= r)
        list.push_back({Op::BackwardWeight, nw++});
      if (nf < m)
        list.push_back({Op::Forward, nf++});
    }
    while (nw < m)
      list.push_back({Op::BackwardWeight, nw++});
  }
  return detail::finish(detail::names::zb_h1, p, m, 1, std::move(ranks));
}

TELAR_DECL Schedule zb_h2(int p, int m) {
  detail::require_pm("zb_h2", p, m);
  std::vector<std::vector<Instruction>> ranks(p);
  for (int r = 0; r < p; ++r) {
    auto& list = ranks[r];
    int nf = 0, nb = 0, nw = 0;
    for (int const warmup = std::min(2 * (p - r) - 1, m); nf < warmup; ++nf)
      list.push_back({Op::Forward, nf});
    for (int j = 0; j < 2 * r && nf < m; ++j) {
      list.push_back({Op::BackwardInput, nb++});
      list.push_back({Op::Forward, nf++});
    }
    while (nf < m) {
      list.push_back({Op::BackwardInput, nb++});
      list.push_back({Op::BackwardWeight, nw++});
      list.push_back({Op::Forward, nf++});
    }
    while (nb < m) {
      list.push_back({Op::BackwardInput, nb++});
      list.push_back({Op::BackwardWeight, nw++});
    }
    while (nw < m)
      list.push_back({Op::BackwardWeight, nw++});
  }
  return detail::finish(detail::names::zb_h2, p, m, 1, std::move(ranks));
}

} // namespace telar::schedule
