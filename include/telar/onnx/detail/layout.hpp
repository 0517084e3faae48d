#pragma once
// Where the ONNX axes of an imported tensor are in Telar's storage. Telar
// keeps every tensor as [batch, per-sample shape] with the batch first;
// PyTorch's attention moves the batch (Transpose [1, 0, 2] to [seq, batch,
// d]) and merges it with the heads (Reshape to [seq, batch * heads, head]).
// Each ONNX (logical) axis is recorded as a group of "atoms": stored axes of
// the sample (0, 1, ...) or the batch (-1), outermost first, so Transpose
// and most Reshapes only regroup atoms; a layer that needs its axes in place
// gets a telar::Rearrange first (materialize).
#include <telar/core/shape.hpp>
#include <telar/onnx/detail/fold.hpp>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace telar::onnx::detail {

inline constexpr int batch_atom = -1;

struct Layout {
  std::vector<std::vector<int>> groups; // logical axis -> atoms
  friend bool operator==(Layout const& a, Layout const& b) { return a.groups == b.groups; }
  friend bool operator!=(Layout const& a, Layout const& b) { return !(a == b); }
};

// [batch, d0, d1, ...] in place.
inline Layout plain_layout(int rank) {
  Layout l;
  l.groups.push_back({batch_atom});
  for (int d = 0; d < rank; ++d)
    l.groups.push_back({d});
  return l;
}

inline Sym atom_extent(int atom, Shape const& s) {
  return atom == batch_atom ? Sym{1, 1} : Sym{std::int64_t(s[atom]), 0};
}

// The logical extents, batch included.
inline std::vector<Sym> logical_dims(Layout const& l, Shape const& s) {
  std::vector<Sym> d;
  for (auto const& g : l.groups) {
    Sym e{1, 0};
    for (int a : g)
      e = e * atom_extent(a, s);
    d.push_back(e);
  }
  return d;
}

inline std::string dims_str(std::vector<Sym> const& d) {
  Folded f;
  f.v = d;
  return f.str();
}

// The stored layout a layer can read: the sample's atoms in logical order,
// and every logical axis without the batch merged into one stored axis.
struct Materialized {
  std::vector<int> perm; // stored axis d of the transposed sample = old axis perm[d]
  Shape transposed, shape;
  Layout layout;
};
inline Materialized materialize(Layout const& l, Shape const& s) {
  Materialized m;
  for (auto const& g : l.groups)
    for (int a : g)
      if (a != batch_atom)
        m.perm.push_back(a);
  m.transposed.rank = int(m.perm.size());
  for (std::size_t d = 0; d < m.perm.size(); ++d)
    m.transposed.dims[d] = s[m.perm[d]];
  std::vector<std::size_t> dims; // of the result, one per stored axis
  for (auto const& g : l.groups) {
    bool const has_batch = std::find(g.begin(), g.end(), batch_atom) != g.end();
    std::vector<int> out;
    std::size_t merged = 1;
    for (int a : g)
      if (a == batch_atom)
        out.push_back(a);
      else if (has_batch && s[a] == 1) // beside the batch an extent 1 is no axis
        continue;                      // (the Reshape after the Transpose drops it)
      else if (has_batch)
        out.push_back(int(dims.size())), dims.push_back(s[a]);
      else
        merged *= s[a];
    if (!has_batch)
      out.push_back(int(dims.size())), dims.push_back(merged);
    m.layout.groups.push_back(out);
  }
  m.shape.rank = int(dims.size()); // over Shape::max_rank: the caller refuses it
  for (std::size_t d = 0; d < dims.size() && d < std::size_t(Shape::max_rank); ++d)
    m.shape.dims[d] = dims[d];
  return m;
}
inline bool identity_perm(std::vector<int> const& p) {
  for (std::size_t d = 0; d < p.size(); ++d)
    if (p[d] != int(d))
      return false;
  return true;
}

// Groups atoms for Reshape's \p target (logical extents, batch included) or
// names a stored axis to split first: split = {axis, outer extent}.
struct Regroup {
  std::optional<Layout> layout;
  int split_axis = -1;
  std::size_t split_outer = 0;
};
inline Regroup regroup(Layout const& l, Shape const& s, std::vector<Sym> const& target) {
  std::vector<int> atoms;
  for (auto const& g : l.groups)
    atoms.insert(atoms.end(), g.begin(), g.end());
  Layout out;
  std::size_t i = 0;
  for (Sym t : target) {
    std::vector<int> g;
    Sym acc{1, 0};
    while (acc != t) {
      if (i == atoms.size())
        return {};
      int const a = atoms[i];
      Sym const e = atom_extent(a, s);
      if (divide(t, acc * e)) {
        g.push_back(a), acc = acc * e, ++i;
        continue;
      }
      auto const rest = divide(t, acc);
      if (a == batch_atom || !rest || rest->pow != 0 || e.coef % rest->coef != 0)
        return {}; // would split the batch, or extents that do not nest
      Regroup r;
      r.split_axis = a;
      r.split_outer = std::size_t(rest->coef);
      return r;
    }
    out.groups.push_back(g);
  }
  for (; i < atoms.size(); ++i) { // trailing extent-1 atoms join the last axis
    if (atom_extent(atoms[i], s) != Sym{1, 0} || out.groups.empty())
      return {};
    out.groups.back().push_back(atoms[i]);
  }
  return {out, -1, 0};
}

// Stored axis \p axis of extent n split into (outer, n / outer): the new
// stored shape and the layout with later atoms renumbered.
inline std::pair<Shape, Layout> split_axis(Layout l, Shape s, int axis, std::size_t outer) {
  Shape n;
  n.rank = s.rank + 1;
  for (int d = 0, k = 0; d < s.rank; ++d) {
    if (d == axis) {
      n.dims[std::size_t(k++)] = outer;
      n.dims[std::size_t(k++)] = s[d] / outer;
    } else if (k < Shape::max_rank) {
      n.dims[std::size_t(k++)] = s[d];
    }
  }
  for (auto& g : l.groups) {
    std::vector<int> ng;
    for (int a : g) {
      ng.push_back(a == batch_atom || a < axis ? a : a + 1);
      if (a == axis)
        ng.back() = axis, ng.push_back(axis + 1);
    }
    g = ng;
  }
  return {n, l};
}

// The one stored axis that logical axis \p axis is, if it is one atom
// other than the batch (a layer can then work along it in place).
inline int single_atom(Layout const& l, std::size_t axis) {
  auto const& g = l.groups[axis];
  return g.size() == 1 && g[0] != batch_atom ? g[0] : -1;
}

} // namespace telar::onnx::detail
