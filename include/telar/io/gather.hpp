#pragma once
/*! \file
 *  \brief telar::gather_model: every parameter tensor of a trained model,
 *  whole and unsharded, on one rank or on all (no HDF5 needed). */
#include <telar/io/detail/checkpoint_io.hpp>
#include <telar/io/detail/model_pieces.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace telar {

/*! \brief Whole tensors by name, with their global shapes.
 *  \tparam T value type */
template <class T>
struct GatheredModel {
  /*! \brief Row-major values of every tensor: "layer0.weight" for
   *  parameters, "buffers/layer1.running_mean" for buffers (BatchNorm's
   *  running statistics) and, when asked for, "optim/slot<k>/layer0.weight"
   *  for the optimizer's state slot k (Adam: 0 = m, 1 = v). */
  std::map<std::string, std::vector<T>> tensors;
  /*! \brief Global shape of every entry of tensors. */
  std::map<std::string, std::vector<std::size_t>> shapes;
};

namespace detail {

// The name of part `part` (0: parameters, k + 1: state slot k) of tensor t.
inline std::string part_name(std::vector<std::string> const& names, std::size_t t,
                             std::size_t part) {
  return part == 0 ? names[t] : "optim/slot" + std::to_string(part - 1) + "/" + names[t];
}

// Variable-length gather of v to root (root < 0: to every rank), in rank
// order, through the communicator's bounded operations.
template <class U>
std::vector<U> gather_all(Communicator const& comm, std::vector<U> const& v, int root) {
  int const n = int(v.size()), size = comm.size();
  std::vector<int> counts(std::size_t(size), 0);
  comm.allgather(&n, 1, counts.data());
  std::size_t total = 0;
  for (int c : counts)
    total += std::size_t(c);
  if (root < 0) {
    std::vector<U> out(total);
    comm.allgatherv(v.data(), counts, out.data());
    return out;
  }
  if (comm.rank() != root) {
    if (n > 0)
      comm.send(v.data(), v.size(), root, 7);
    return {};
  }
  std::vector<U> out(total);
  std::size_t at = 0;
  for (int r = 0; r < size; ++r) {
    std::size_t const c = std::size_t(counts[std::size_t(r)]);
    if (r == root)
      std::copy(v.begin(), v.end(), out.begin() + long(at));
    else if (c > 0)
      comm.recv(out.data() + at, c, r, 7);
    at += c;
  }
  return out;
}

// Adds every buffer, "buffers/<name>", from the rank that owns it.
template <class T>
void gather_buffers(std::vector<ModelBuffer<T>> const& bufs, Communicator const* comm, int root,
                    bool here, GatheredModel<T>& out) {
  std::vector<std::uint64_t> ids;
  std::vector<T> data;
  for (std::size_t i = 0; i < bufs.size(); ++i)
    if (bufs[i].owner) {
      ids.push_back(i);
      data.insert(data.end(), bufs[i].values.begin(), bufs[i].values.end());
    }
  if (comm != nullptr && comm->size() > 1) {
    ids = gather_all(*comm, ids, root);
    data = gather_all(*comm, data, root);
  }
  if (!here)
    return;
  auto at = data.begin();
  for (std::uint64_t i : ids) {
    std::string const key = "buffers/" + bufs[i].name;
    out.tensors[key].assign(at, at + long(bufs[i].size));
    out.shapes[key] = {bufs[i].size};
    at += long(bufs[i].size);
  }
}

} // namespace detail

/*! \brief Every parameter tensor (and buffer) of \p trainer's model, whole, assembled
 *  from the ranks that hold its pieces (pipeline stages, tensor-parallel
 *  blocks, ZeRO shards), in the same form whatever the layout (collective
 *  over the trainer's ranks).
 *  \code
 *  auto all = telar::gather_model(trainer, 0); // on rank 0
 *  if (trainer.rank() == 0) save(all.tensors["layer0.weight"], all.shapes["layer0.weight"]);
 *  \endcode
 *  \param trainer a telar::Trainer or telar::SlabDataParallel
 *  \param root the rank that receives the tensors, or -1 for every rank
 *  \param optimizer_state also gather the optimizer's state slots
 *  \return the tensors on \p root (every rank for -1), empty elsewhere */
template <class Trainer>
GatheredModel<typename Trainer::value_type> gather_model(Trainer& trainer, int root = 0,
                                                         bool optimizer_state = false) {
  using T = typename Trainer::value_type;
  using Access = typename detail::checkpoint_io<Trainer>::access; // the optimizer's shard, state
  using View = typename detail::checkpoint_io<Trainer>::view;     // the rest
  detail::ModelPieces const m = View::pieces(trainer);
  std::vector<T> const values = Access::values(trainer);
  std::vector<T> const state = optimizer_state ? Access::state(trainer) : std::vector<T>();
  std::size_t const parts = 1 + (optimizer_state ? std::size_t(m.state_size) : 0);
  // Records (key, count, global indices...) and the values in the same order.
  std::vector<std::uint64_t> index;
  std::vector<T> data;
  for (auto const& p : m.pieces) {
    if (!p.owner)
      continue;
    for (std::size_t part = 0; part < parts; ++part) {
      T const* src = part == 0 ? values.data() + p.shard_offset
                               : state.data() + (part - 1) * m.shard_size + p.shard_offset;
      index.push_back(part * m.names.size() + p.tensor);
      index.push_back(p.size);
      detail::for_each_global_index(p, m.dims2(p.tensor).second, [&](std::size_t g, std::size_t k) {
        index.push_back(g);
        data.push_back(src[k]);
      });
    }
  }
  Communicator const* comm = View::comm(trainer);
  bool const here = root < 0 || comm == nullptr || comm->rank() == root;
  if (comm != nullptr && comm->size() > 1) {
    index = detail::gather_all(*comm, index, root);
    data = detail::gather_all(*comm, data, root);
  }
  GatheredModel<T> out;
  detail::gather_buffers(View::buffers(trainer), comm, root, here, out);
  if (!here)
    return out;
  for (std::size_t t = 0; t < m.names.size(); ++t)
    for (std::size_t part = 0; part < parts; ++part) {
      std::string const key = detail::part_name(m.names, t, part);
      std::size_t n = 1;
      for (std::size_t d : m.shapes[t])
        n *= d;
      out.tensors[key].assign(n, T(0));
      out.shapes[key] = m.shapes[t];
    }
  std::size_t v = 0;
  for (std::size_t i = 0; i < index.size();) {
    std::size_t const key = index[i], count = index[i + 1];
    auto& dst = out.tensors[detail::part_name(m.names, key % m.names.size(), key / m.names.size())];
    for (std::size_t k = 0; k < count; ++k)
      dst[index[i + 2 + k]] = data[v++];
    i += 2 + count;
  }
  return out;
}

} // namespace telar
