#pragma once
// This rank's pieces of the model's whole (global) tensors: the common
// ground of checkpoints and gather_model. A piece is the part of one local
// tensor inside this rank's shard of the flat store (what the optimizer
// updates, so optimizer state has the same pieces); the layer's
// parameter_block places the local tensor in the global one. Exactly one
// rank "owns" each global element: it writes it and counts it in checksums.
#include <telar/comm/communicator.hpp>
#include <telar/core/layer.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace telar::detail {

// One contiguous range of a local tensor, in local row-major order.
struct TensorPiece {
  std::size_t tensor = 0;       // index into ModelPieces::names
  std::size_t shard_offset = 0; // first element in the shard buffers
  std::size_t local_begin = 0;  // first element within the local tensor
  std::size_t size = 0;
  std::size_t local_rows = 1, local_cols = 0; // the local tensor as 2-D (a vector is one row)
  std::size_t row0 = 0, col0 = 0;             // its block's offset in the global tensor (2-D)
  bool owner = false;                         // this rank writes and counts these elements
};

// A run of a piece that is contiguous in both the local and the global
// tensor (2-D coordinates: the first element, and rows x cols of a block).
struct PieceBlock {
  std::size_t row = 0, col = 0, rows = 0, cols = 0;
};

struct ModelPieces {
  std::vector<std::string> names;               // every tensor of the model, model order
  std::vector<std::vector<std::size_t>> shapes; // their global shapes (agreed over ranks)
  std::vector<TensorPiece> pieces;              // this rank's
  std::size_t shard_size = 0;                   // elements of the shard buffers
  int state_size = 0;                           // optimizer state slots per element

  // Global rows x cols of tensor t (a vector is one row).
  std::pair<std::size_t, std::size_t> dims2(std::size_t t) const {
    auto const& s = shapes[t];
    if (s.size() == 1)
      return {1, s[0]};
    return {s.empty() ? 0 : s[0], s.size() < 2 ? 1 : s[1]};
  }
};

// The at most three blocks (partial first row, full rows, partial last row)
// a piece covers, in row-major order, in global coordinates.
inline std::vector<PieceBlock> piece_blocks(TensorPiece const& p) {
  std::vector<PieceBlock> out;
  std::size_t const c = p.local_cols, e = p.local_begin + p.size;
  std::size_t i = p.local_begin;
  if (c == 0 || p.size == 0)
    return out;
  auto add = [&](std::size_t r, std::size_t col, std::size_t rows, std::size_t cols) {
    out.push_back({p.row0 + r, p.col0 + col, rows, cols});
  };
  if (i % c != 0) {
    std::size_t const n = std::min(e - i, c - i % c);
    add(i / c, i % c, 1, n);
    i += n;
  }
  if (std::size_t const full = (e - i) / c; full > 0) {
    add(i / c, 0, full, c);
    i += full * c;
  }
  if (i < e)
    add(i / c, 0, 1, e - i);
  return out;
}

// f(global linear index, k) for the piece's elements k = 0.. in order.
template <class F>
void for_each_global_index(TensorPiece const& p, std::size_t global_cols, F&& f) {
  std::size_t k = 0;
  for (auto const& b : piece_blocks(p))
    for (std::size_t r = 0; r < b.rows; ++r)
      for (std::size_t c = 0; c < b.cols; ++c, ++k)
        f((b.row + r) * global_cols + b.col + c, k);
}

// A hash of (index, bits) whose sum over a tensor's elements (mod 2^64) is
// its checksum: additive, so each rank sums the elements it owns and one
// allreduce combines them, whatever the layout.
inline std::uint64_t checksum_mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
template <class T>
std::uint64_t element_hash(std::uint64_t index, T value) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T) < sizeof(bits) ? sizeof(T) : sizeof(bits));
  return checksum_mix(checksum_mix(index) ^ bits);
}

// Sum of element_hash over the owned elements of piece p, values at data[k].
template <class T>
std::uint64_t piece_hash(ModelPieces const& m, TensorPiece const& p, T const* data) {
  std::uint64_t h = 0;
  if (!p.owner)
    return h;
  std::size_t const gc = m.dims2(p.tensor).second;
  for_each_global_index(p, gc,
                        [&](std::size_t g, std::size_t k) { h += element_hash(g, data[k]); });
  return h;
}

// "[2048, 784]"
inline std::string shape_str(std::vector<std::size_t> const& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i)
    out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Every rank's (tensor, global shape) pairs to every rank: under pipeline
// parallelism a rank knows only its stages' tensors.
inline void agree_shapes(Communicator const* comm, ModelPieces& m,
                         std::vector<std::vector<std::size_t>> const& mine) {
  std::vector<std::uint64_t> local; // (tensor, rank, dims...) records
  for (std::size_t t = 0; t < mine.size(); ++t)
    if (!mine[t].empty()) {
      local.push_back(t);
      local.push_back(mine[t].size());
      local.insert(local.end(), mine[t].begin(), mine[t].end());
    }
  std::vector<std::uint64_t> all = local;
  if (comm != nullptr && comm->size() > 1) {
    int const n = int(local.size());
    std::vector<int> counts(std::size_t(comm->size()));
    comm->allgather(&n, 1, counts.data());
    std::size_t total = 0;
    for (int c : counts)
      total += std::size_t(c);
    all.assign(total, 0);
    comm->allgatherv(local.data(), counts, all.data());
  }
  m.shapes.assign(m.names.size(), {});
  for (std::size_t i = 0; i + 1 < all.size();) {
    std::size_t const t = all[i], d = all[i + 1];
    m.shapes[t].assign(all.begin() + long(i + 2), all.begin() + long(i + 2 + d));
    i += 2 + d;
  }
}

} // namespace telar::detail
