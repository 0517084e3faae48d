#pragma once
/*! \file
 *  \brief Checkpoints of a telar::Trainer (or of a telar::SlabDataParallel,
 *  a slab graph's update): the whole training state in one parallel HDF5
 *  file, loadable under any other layout.
 *
 *  \code
 *  telar::RunPosition pos{epoch, batch, data_seed};
 *  telar::save_checkpoint(trainer, "ckpt", pos);              // ckpt/step-000120.h5
 *  ...
 *  if (auto last = telar::latest_checkpoint("ckpt"))
 *    pos = telar::load_checkpoint(trainer, *last);            // any layout the model fits
 *  \endcode
 *  A checkpoint holds every parameter tensor whole, as a dataset of its
 *  global shape ("/params/layer0.weight"), every optimizer state slot the
 *  same way ("/optim/slot0/layer0.weight", Adam: slot 0 = m, slot 1 = v),
 *  every buffer whole ("/buffers/layer1.running_mean", BatchNorm's running
 *  statistics, written by the first data-parallel replica), the
 *  step count (which fixes the learning-rate schedule's position, Adam's bias
 *  correction and dropout's masks), the caller's telar::RunPosition and a
 *  description of the run, as attributes. Each rank writes and reads its own
 *  blocks with MPI-IO; a checksum per dataset is verified on load. The file
 *  is written under a temporary name and renamed when complete.
 *  docs/checkpoints.md has the format and an h5py example.
 *
 *  Needs a parallel HDF5 (TELAR_HAVE_HDF5; CMake target Telar::hdf5).
 */
#include <telar/io/checkpoint_lock.hpp>
#include <telar/io/detail/agree.hpp>
#include <telar/io/detail/checkpoint_io.hpp>
#include <telar/io/detail/hdf5.hpp>
#include <telar/io/detail/model_pieces.hpp>
#include <telar/io/detail/space_reserve.hpp>
#include <telar/io/error.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace telar {

/*! \brief Where the data pipeline stood when a checkpoint was taken: the
 *  caller fills it on save and gets it back on load (Telar does not read it). */
struct RunPosition {
  long long epoch = 0;    //!< epoch in progress (0-based)
  long long batch = 0;    //!< batches of that epoch already trained
  std::uint64_t seed = 0; //!< the data sampler's shuffle seed
  /*! \brief The caller's description of the run ("--seed 1 --batch 64"),
   *  stored as the attribute `run_config` and returned as written (empty
   *  for a file written without one), so a resumed run can refuse a
   *  checkpoint of another configuration. */
  std::string config;
};

/*! \brief How checkpoints are kept. */
struct CheckpointOptions {
  /*! \brief Complete checkpoints kept in the directory; older ones are
   *  deleted after a new one is complete (0 keeps all). */
  int keep = 3;
};

namespace detail {

inline std::string checkpoint_file_name(long long step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%06lld.h5", step);
  return buf;
}

// The step of a complete checkpoint's file name, or -1.
inline long long checkpoint_step(std::string const& name) {
  if (name.size() < 9 || name.rfind("step-", 0) != 0 || name.substr(name.size() - 3) != ".h5")
    return -1;
  std::string const digits = name.substr(5, name.size() - 8);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  return std::stoll(digits);
}

// Complete checkpoints of dir by step (empty when dir is unreadable).
inline std::map<long long, std::string> list_checkpoints(std::string const& dir) {
  std::map<long long, std::string> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (long long const s = checkpoint_step(it->path().filename().string()); s >= 0)
      out[s] = it->path().string();
  return out;
}

// Throws the same CheckpointError on every rank when any rank has a
// message: the lowest such rank's.
inline void agree(Communicator const* comm, std::string const& error) {
  agree_as<CheckpointError>(comm, error);
}

// Runs f(), catching what it throws as this rank's message; then agrees.
template <class F>
void agreed(Communicator const* comm, F&& f) {
  agreed_as<CheckpointError>(comm, "telar::checkpoint: unknown error", std::forward<F>(f));
}

// "layer0.weight [64, 784]\n..." for every tensor: the model's signature.
inline std::string signature(ModelPieces const& m) {
  std::string s;
  for (std::size_t t = 0; t < m.names.size(); ++t)
    s += m.names[t] + " " + shape_str(m.shapes[t]) + "\n";
  return s;
}

// The first difference between a file's signature and the model's, or "".
inline std::string signature_mismatch(std::string const& file_sig, std::string const& model_sig) {
  auto parse = [](std::string const& s) {
    std::vector<std::pair<std::string, std::string>> out;
    std::size_t i = 0;
    while (i < s.size()) {
      std::size_t const nl = s.find('\n', i), sp = s.find(' ', i);
      std::size_t const e = nl == std::string::npos ? s.size() : nl;
      if (sp < e)
        out.emplace_back(s.substr(i, sp - i), s.substr(sp + 1, e - sp - 1));
      i = e + 1;
    }
    return out;
  };
  auto const f = parse(file_sig), m = parse(model_sig);
  auto find = [](auto const& v, std::string const& n) {
    return std::find_if(v.begin(), v.end(), [&](auto const& p) { return p.first == n; });
  };
  for (auto const& [name, shape] : m) {
    auto const it = find(f, name);
    if (it == f.end())
      return "the model's tensor " + name + " " + shape + " is not in the file";
    if (it->second != shape)
      return "tensor " + name + " is " + it->second + " in the file but " + shape + " in the model";
  }
  for (auto const& [name, shape] : f)
    if (find(m, name) == m.end())
      return "the file's tensor " + name + " " + shape + " is not in the model";
  return {};
}

// Selects this rank's `pieces` of tensor t (owned ones only when
// owned_only) in a dataset space; returns the elements selected.
inline std::size_t select_pieces(ModelPieces const& m, std::size_t t, bool owned_only, hid_t space,
                                 std::string const& file) {
  std::size_t n = 0;
  bool first = true;
  h5_check(H5Sselect_none(space), file, "H5Sselect_none");
  int const rank = int(m.shapes[t].size());
  for (auto const& p : m.pieces) {
    if (p.tensor != t || (owned_only && !p.owner))
      continue;
    for (auto const& b : piece_blocks(p)) {
      hsize_t start[2] = {b.row, b.col}, count[2] = {b.rows, b.cols};
      hsize_t* s = rank == 1 ? start + 1 : start;
      hsize_t* c = rank == 1 ? count + 1 : count;
      h5_check(H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, s, nullptr, c,
                                   nullptr),
               file, "H5Sselect_hyperslab");
      first = false;
    }
    n += p.size;
  }
  return n;
}

// The piece of tensor t on this rank (at most one: a shard is contiguous).
inline TensorPiece const* piece_of(ModelPieces const& m, std::size_t t) {
  for (auto const& p : m.pieces)
    if (p.tensor == t)
      return &p;
  return nullptr;
}

inline H5Handle memory_space(std::size_t n, std::string const& file) {
  hsize_t dim = n > 0 ? n : 1;
  H5Handle s(h5_check(H5Screate_simple(1, &dim, nullptr), file, "H5Screate_simple"), H5Sclose);
  if (n == 0)
    h5_check(H5Sselect_none(s.get()), file, "H5Sselect_none");
  return s;
}

// Test hook: rank 1 (0 alone) dies after writing dataset k (tests only).
inline void maybe_die(Communicator const* comm, std::size_t written) {
  char const* const env = std::getenv("TELAR_CHECKPOINT_TEST_KILL_AFTER_TENSOR");
  if (env == nullptr)
    return;
  int const victim = comm != nullptr && comm->size() > 1 ? 1 : 0;
  if (std::to_string(written) == env && (comm == nullptr ? 0 : comm->rank()) == victim)
    std::raise(SIGKILL);
}

inline std::string part_path(std::vector<std::string> const& names, std::size_t t,
                             std::size_t part) {
  return part == 0 ? "/params/" + names[t]
                   : "/optim/slot" + std::to_string(part - 1) + "/" + names[t];
}

// Checksums of the buffers (element_hash sums over the owners' values),
// the same on every rank (collective).
template <class T>
std::vector<std::uint64_t> buffer_sums(Communicator const* comm,
                                       std::vector<ModelBuffer<T>> const& bufs) {
  std::vector<std::uint64_t> sums(bufs.size(), 0);
  for (std::size_t i = 0; i < bufs.size(); ++i)
    if (bufs[i].owner)
      for (std::size_t k = 0; k < bufs[i].values.size(); ++k)
        sums[i] += element_hash(k, bufs[i].values[k]);
  if (comm && comm->size() > 1 && !sums.empty())
    comm->allreduce(sums.data(), sums.size());
  return sums;
}

// Selects all of a 1-D dataset space when `all`, else none, and returns
// the matching memory space.
inline H5Handle select_whole(hid_t space, bool all, std::size_t n, std::string const& file) {
  if (all)
    h5_check(H5Sselect_all(space), file, "H5Sselect_all");
  else
    h5_check(H5Sselect_none(space), file, "H5Sselect_none");
  return memory_space(all ? n : 0, file);
}

// Writes every buffer whole as /buffers/<name> (its owner's values) with
// its checksum (collective).
template <class T>
void write_buffers(hid_t root, Communicator const* comm, std::vector<ModelBuffer<T>> const& bufs,
                   std::vector<std::uint64_t> const& sums, std::string const& tmp) {
  if (bufs.empty())
    return;
  H5Handle g(h5_check(H5Gcreate2(root, "/buffers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), tmp,
                      "H5Gcreate2"),
             H5Gclose);
  auto dxpl = h5_dxpl(comm, true, tmp);
  for (std::size_t i = 0; i < bufs.size(); ++i)
    agreed(comm, [&] { // as the tensors: a failed write stops every rank here
      hsize_t dim = bufs[i].size;
      H5Handle space(h5_check(H5Screate_simple(1, &dim, nullptr), tmp, "H5Screate_simple"),
                     H5Sclose);
      std::string const dname = "/buffers/" + bufs[i].name;
      H5Handle d(h5_check(H5Dcreate2(root, dname.c_str(), h5_type<T>(), space.get(), H5P_DEFAULT,
                                     H5P_DEFAULT, H5P_DEFAULT),
                          tmp, "H5Dcreate2"),
                 H5Dclose);
      auto mem = select_whole(space.get(), bufs[i].owner, bufs[i].size, tmp);
      T scratch{};
      h5_check(H5Dwrite(d.get(), h5_type<T>(), mem.get(), space.get(), dxpl.get(),
                        bufs[i].owner ? bufs[i].values.data() : &scratch),
               tmp, ("H5Dwrite " + dname).c_str());
      h5_write_attr<std::uint64_t>(d.get(), "checksum", sums[i], tmp);
    });
}

// Reads every buffer this rank holds from /buffers/<name>; `expected`
// gets the files' checksums (collective).
template <class T>
void read_buffers(hid_t fid, Communicator const* comm, std::vector<ModelBuffer<T>>& bufs,
                  std::vector<std::uint64_t>& expected, std::string const& at,
                  std::string const& file) {
  auto dxpl = h5_dxpl(comm, false, file);
  expected.assign(bufs.size(), 0);
  for (std::size_t i = 0; i < bufs.size(); ++i) {
    std::string const dname = "/buffers/" + bufs[i].name;
    std::string const dat = at + "buffer " + dname + ": ";
    hid_t const did = H5Lexists(fid, "/buffers", H5P_DEFAULT) > 0
                          ? H5Dopen2(fid, dname.c_str(), H5P_DEFAULT)
                          : hid_t(-1);
    if (did < 0)
      throw CheckpointError(dat + "missing or unreadable (a checkpoint of a model without it?)");
    H5Handle d(did, H5Dclose);
    H5Handle space(H5Dget_space(did), H5Sclose);
    hsize_t dim = 0;
    if (space.get() < 0 || H5Sget_simple_extent_ndims(space.get()) != 1 ||
        H5Sget_simple_extent_dims(space.get(), &dim, nullptr) < 0 || dim != bufs[i].size)
      throw CheckpointError(dat + "its shape is not the model's " + shape_str({bufs[i].size}));
    if (!h5_read_attr<std::uint64_t>(did, "checksum", expected[i]))
      throw CheckpointError(dat + "no checksum");
    bool const held = !bufs[i].values.empty();
    auto mem = select_whole(space.get(), held, bufs[i].size, file);
    T scratch{};
    if (H5Dread(did, h5_type<T>(), mem.get(), space.get(), dxpl.get(),
                held ? bufs[i].values.data() : &scratch) < 0)
      throw CheckpointError(dat + "read failed (truncated or corrupted file?)");
  }
}

// Bytes the file system of `dir` gives this user (-1 when unknown).
inline long long free_bytes(std::string const& dir) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0)
    return -1;
  return (long long)st.f_bavail * (long long)st.f_frsize;
}

// The tensors' bytes in a checkpoint (parameters, optimizer state, buffers);
// HDF5's metadata comes on top.
template <class T>
long long checkpoint_bytes(ModelPieces const& m, std::vector<ModelBuffer<T>> const& bufs) {
  long long n = 0;
  for (auto const& shape : m.shapes) {
    long long e = 1;
    for (auto d : shape)
      e *= (long long)d;
    n += e * (1 + (long long)m.state_size);
  }
  for (auto const& b : bufs)
    n += (long long)b.size;
  return n * (long long)sizeof(T);
}

// "no space left on DIR (needs about N bytes, F free)" when `dir` has less
// than `needed` bytes free, else "".
inline std::string no_space(std::string const& dir, long long needed) {
  long long const free = free_bytes(dir);
  if (free < 0 || free >= needed)
    return {};
  return "telar::save_checkpoint: no space left on " + dir + " (needs about " +
         std::to_string(needed) + " bytes, " + std::to_string(free) + " free)";
}

// Writes the temporary file (agreed(comm, write(reserve))) with `headroom`
// bytes held for HDF5's metadata (space_reserve.hpp); when that fails, rank
// 0 removes the partial file and every rank throws one message: "no space
// left" when the disk filled up (HDF5 only says that a write failed), else
// the failure's own.
template <class Write>
void removing_on_failure(Communicator const* comm, int rank, std::string const& tmp,
                         std::string const& dir, long long needed, long long headroom,
                         Write&& write) {
  SpaceReserve reserve;
  try {
    agreed(comm, [&] { // before HDF5 opens anything: a full disk stops it here
      if (int const err = rank == 0 ? reserve.take(tmp + ".reserve", headroom) : 0; err != 0)
        throw CheckpointError("telar::save_checkpoint: cannot reserve " + std::to_string(headroom) +
                              " bytes in " + dir + ": " + std::strerror(err));
    });
    agreed(comm, [&] { write(reserve); });
  } catch (CheckpointError const& e) {
    std::string const failed = e.what();
    agreed(comm, [&] {
      if (rank != 0)
        return;
      reserve.release();
      std::error_code ec;
      std::filesystem::remove(tmp, ec); // first: the partial file holds the space
      std::string const full = no_space(dir, needed + headroom);
      throw CheckpointError(full.empty() ? failed : full);
    });
  }
}

// Runs body(), then closes `file` (the temporary checkpoint) with room for
// its metadata: rank 0 frees the reserve and, when body failed, the partial
// file's data. A close that met a full disk would leave HDF5 a file it
// crashes on at MPI_Finalize (space_reserve.hpp).
template <class Body>
void close_with_room(Communicator const* comm, int rank, H5Handle& file, std::string const& tmp,
                     SpaceReserve& reserve, Body&& body) {
  std::exception_ptr failed;
  try {
    body();
  } catch (...) {
    failed = std::current_exception();
  }
  agreed(comm, [&] {
    if (rank != 0)
      return;
    if (failed)
      (void)::truncate(tmp.c_str(), 0);
    reserve.release();
  });
  bool const closed = file.reset();
  if (failed)
    std::rethrow_exception(failed);
  if (!closed)
    throw CheckpointError("telar::save_checkpoint: " + tmp + ": H5Fclose failed");
}

inline void fsync_dir(std::string const& dir) {
  int const fd = ::open(dir.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

} // namespace detail

/*! \brief The newest complete checkpoint in \p dir ("DIR/step-000120.h5"),
 *  if any. Files still being written (".step-*.h5.tmp") are never returned.
 *  \param dir checkpoint directory */
inline std::optional<std::string> latest_checkpoint(std::string const& dir) {
  auto const all = detail::list_checkpoints(dir);
  if (all.empty())
    return std::nullopt;
  return all.rbegin()->second;
}

/*! \brief Saves \p trainer's whole training state to DIR/step-NNNNNN.h5
 *  (collective over the trainer's ranks): parameters and optimizer state as
 *  whole tensors, the step count, \p position and a description of the run.
 *  Written under a temporary name and renamed once every rank has closed it;
 *  then all but the newest options.keep checkpoints are deleted.
 *  \param trainer a telar::Trainer or telar::SlabDataParallel
 *  \param dir directory (created if missing)
 *  \param position the data pipeline's position, returned by load_checkpoint
 *  \param options how many checkpoints to keep
 *  \return the checkpoint's path
 *  \throws CheckpointError (on every rank) when \p dir cannot be written */
template <class Trainer>
std::string save_checkpoint(Trainer& trainer, std::string const& dir,
                            RunPosition const& position = {},
                            CheckpointOptions const& options = {}) {
  using T = typename Trainer::value_type;
  using Access = typename detail::checkpoint_io<Trainer>::access; // the optimizer's shard, state
  using View = typename detail::checkpoint_io<Trainer>::view;     // the rest
  detail::H5Quiet const quiet;
  Communicator const* comm = View::comm(trainer);
  int const rank = comm ? comm->rank() : 0;
  std::string const name = detail::checkpoint_file_name(trainer.steps());
  std::string const path = (std::filesystem::path(dir) / name).string();
  std::string const tmp = (std::filesystem::path(dir) / ("." + name + ".tmp")).string();
  detail::agreed(comm, [&] {
    if (rank != 0)
      return;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec || ::access(dir.c_str(), W_OK) != 0)
      throw CheckpointError("telar::save_checkpoint: cannot write to directory '" + dir + "'" +
                            (ec ? ": " + ec.message() : std::string()));
  });
  detail::ModelPieces const m = View::pieces(trainer);
  auto const buffers = View::buffers(trainer);
  long long const needed = detail::checkpoint_bytes(m, buffers);
  detail::agreed(comm, [&] { // a full disk is refused before anything is written
    if (std::string const full = detail::no_space(dir, needed); rank == 0 && !full.empty())
      throw CheckpointError(full);
  });
  std::vector<T> const values = Access::values(trainer);
  std::vector<T> const state = Access::state(trainer);
  std::size_t const parts = 1 + std::size_t(m.state_size), nt = m.names.size();
  // Checksums of every dataset: each rank sums over the elements it owns.
  std::vector<std::uint64_t> sums(parts * nt, 0);
  auto base = [&](std::size_t part) {
    return part == 0 ? values.data() : state.data() + (part - 1) * m.shard_size;
  };
  for (auto const& p : m.pieces)
    for (std::size_t part = 0; part < parts; ++part)
      sums[part * nt + p.tensor] += detail::piece_hash(m, p, base(part) + p.shard_offset);
  if (comm && comm->size() > 1 && !sums.empty())
    comm->allreduce(sums.data(), sums.size());
  auto const buffer_sums = detail::buffer_sums(comm, buffers);
  std::string const tensors = detail::signature(m);
  long long const headroom = detail::metadata_headroom(nt * parts + buffers.size(),
                                                       tensors.size() + position.config.size());
  detail::removing_on_failure(comm, rank, tmp, dir, needed, headroom, [&](auto& reserve) {
    auto fapl = detail::h5_fapl(comm, tmp);
    detail::h5_check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST), tmp,
                     "H5Pset_libver_bounds");
    detail::H5Handle f(
        detail::h5_check(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), tmp,
                         "H5Fcreate"),
        H5Fclose);
    hid_t const root = f.get();
    detail::close_with_room(comm, rank, f, tmp, reserve, [&] {
      detail::agreed(comm, [&] { // every block the file will use, before any write
        if (int const err = rank == 0 ? detail::preallocate(tmp, needed + headroom) : 0; err != 0)
          throw CheckpointError("telar::save_checkpoint: cannot allocate " +
                                std::to_string(needed + headroom) + " bytes for " + tmp + ": " +
                                std::strerror(err));
      });
      detail::h5_write_attr_str(root, "format", "telar-checkpoint", tmp);
      detail::h5_write_attr<long long>(root, "version", 1, tmp);
      detail::h5_write_attr<long long>(root, "step", trainer.steps(), tmp);
      // The optimizer's own step count is step - skipped_steps (NonFinite::skip).
      detail::h5_write_attr<long long>(root, "skipped_steps", trainer.skipped_steps(), tmp);
      detail::h5_write_attr<long long>(root, "epoch", position.epoch, tmp);
      detail::h5_write_attr<long long>(root, "batch", position.batch, tmp);
      detail::h5_write_attr<std::uint64_t>(root, "data_seed", position.seed, tmp);
      detail::h5_write_attr_str(root, "run_config", position.config, tmp);
      detail::h5_write_attr<std::uint64_t>(root, "model_seed", View::seed(trainer), tmp);
      detail::h5_write_attr_str(root, "layout", trainer.layout(), tmp);
      detail::h5_write_attr_str(root, "strategy", trainer.strategy_name(), tmp);
      detail::h5_write_attr_str(root, "optimizer", View::template optimizer_name<Trainer>(), tmp);
      detail::h5_write_attr<long long>(root, "state_slots", m.state_size, tmp);
      detail::h5_write_attr_str(root, "value_type", sizeof(T) == 4 ? "float32" : "float64", tmp);
      detail::h5_write_attr_str(root, "tensors", tensors, tmp);
      std::vector<detail::H5Handle> groups;
      auto group = [&](std::string const& g) {
        groups.emplace_back(
            detail::h5_check(H5Gcreate2(root, g.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                             tmp, "H5Gcreate2"),
            H5Gclose);
      };
      group("/params");
      if (parts > 1)
        group("/optim");
      for (std::size_t k = 1; k < parts; ++k)
        group("/optim/slot" + std::to_string(k - 1));
      auto dxpl = detail::h5_dxpl(comm, true, tmp);
      std::size_t written = 0;
      for (std::size_t t = 0; t < nt; ++t)
        for (std::size_t part = 0; part < parts; ++part) {
          // Agreed dataset by dataset: a rank whose write failed (a full disk)
          // must not leave the others in the next collective HDF5 call.
          detail::agreed(comm, [&] {
            auto const& shape = m.shapes[t];
            std::vector<hsize_t> dims(shape.begin(), shape.end());
            detail::H5Handle space(
                detail::h5_check(H5Screate_simple(int(dims.size()), dims.data(), nullptr), tmp,
                                 "H5Screate_simple"),
                H5Sclose);
            std::string const dname = detail::part_path(m.names, t, part);
            detail::H5Handle d(
                detail::h5_check(H5Dcreate2(root, dname.c_str(), detail::h5_type<T>(), space.get(),
                                            H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                                 tmp, "H5Dcreate2"),
                H5Dclose);
            std::size_t const n = detail::select_pieces(m, t, true, space.get(), tmp);
            auto mem = detail::memory_space(n, tmp);
            auto const* p = detail::piece_of(m, t);
            T const* src = n > 0 ? base(part) + p->shard_offset : base(0);
            detail::h5_check(
                H5Dwrite(d.get(), detail::h5_type<T>(), mem.get(), space.get(), dxpl.get(), src),
                tmp, ("H5Dwrite " + dname).c_str());
            detail::h5_write_attr<std::uint64_t>(d.get(), "checksum", sums[part * nt + t], tmp);
          });
          detail::maybe_die(comm, ++written);
        }
      groups.clear();
      detail::write_buffers(root, comm, buffers, buffer_sums, tmp);
    });
  });
  // Complete on every rank: rank 0 publishes it under its final name.
  detail::agreed(comm, [&] {
    if (rank != 0)
      return;
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec)
      throw CheckpointError("telar::save_checkpoint: cannot rename " + tmp + " to " + path + ": " +
                            ec.message());
    detail::fsync_dir(dir);
    if (options.keep > 0) {
      auto all = detail::list_checkpoints(dir);
      while (all.size() > std::size_t(options.keep)) {
        std::filesystem::remove(all.begin()->second, ec);
        all.erase(all.begin());
      }
    }
  });
  return path;
}

/*! \brief Restores \p trainer's training state from a checkpoint written
 *  by save_checkpoint under any layout the model fits (collective). The
 *  model's tensors (names and global shapes), the optimizer and its state
 *  slots, the value type and every dataset's checksum are verified before
 *  anything is changed.
 *  \param trainer a telar::Trainer or telar::SlabDataParallel (freshly built
 *  or trained: all is replaced)
 *  \param path a checkpoint file, or a directory: its newest complete checkpoint
 *  \return the RunPosition saved with it
 *  \throws CheckpointError (the same on every rank) naming the file and, for
 *  a mismatch or a corrupted dataset, the tensor and the shapes */
template <class Trainer>
RunPosition load_checkpoint(Trainer& trainer, std::string const& path) {
  using T = typename Trainer::value_type;
  using Access = typename detail::checkpoint_io<Trainer>::access; // the optimizer's shard, state
  using View = typename detail::checkpoint_io<Trainer>::view;     // the rest
  detail::H5Quiet const quiet;
  Communicator const* comm = View::comm(trainer);
  std::string file = path;
  std::string const where = "telar::load_checkpoint: ";
  detail::agreed(comm, [&] {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
      throw CheckpointError(where + "'" + path + "' does not exist");
    if (std::filesystem::is_directory(path, ec)) {
      auto last = latest_checkpoint(path);
      if (!last)
        throw CheckpointError(where + "no complete checkpoint (step-*.h5) in '" + path + "'");
      file = *last;
    }
  });
  detail::ModelPieces const m = View::pieces(trainer);
  std::size_t const parts = 1 + std::size_t(m.state_size), nt = m.names.size();
  std::vector<T> values = Access::values(trainer);
  std::vector<T> state = Access::state(trainer);
  RunPosition pos;
  long long step = 0, skipped = 0;
  std::vector<std::uint64_t> sums(parts * nt, 0), expected(parts * nt, 0);
  auto buffers = View::buffers(trainer);
  std::vector<std::uint64_t> buffers_expected;
  detail::agreed(comm, [&] {
    std::string const at = where + file + ": ";
    auto fapl = detail::h5_fapl(comm, file);
    hid_t const fid = H5Fopen(file.c_str(), H5F_ACC_RDONLY, fapl.get());
    if (fid < 0)
      throw CheckpointError(at + "not a readable HDF5 file (truncated or corrupted?)");
    detail::H5Handle f(fid, H5Fclose);
    std::string format, optimizer, vtype, sig;
    long long slots = -1;
    if (!detail::h5_read_attr_str(fid, "format", format) || format != "telar-checkpoint")
      throw CheckpointError(at + "not a Telar checkpoint (no format attribute)");
    if (!detail::h5_read_attr<long long>(fid, "step", step) ||
        !detail::h5_read_attr<long long>(fid, "epoch", pos.epoch) ||
        !detail::h5_read_attr<long long>(fid, "batch", pos.batch) ||
        !detail::h5_read_attr<std::uint64_t>(fid, "data_seed", pos.seed) ||
        !detail::h5_read_attr_str(fid, "optimizer", optimizer) ||
        !detail::h5_read_attr<long long>(fid, "state_slots", slots) ||
        !detail::h5_read_attr_str(fid, "value_type", vtype) ||
        !detail::h5_read_attr_str(fid, "tensors", sig))
      throw CheckpointError(at + "attributes missing or unreadable");
    if (!detail::h5_read_attr<long long>(fid, "skipped_steps", skipped))
      skipped = 0; // written before steps could be skipped
    if (!detail::h5_read_attr_str(fid, "run_config", pos.config))
      pos.config.clear(); // written before runs described themselves
    std::string const want_type = sizeof(T) == 4 ? "float32" : "float64";
    if (vtype != want_type)
      throw CheckpointError(at + "values are " + vtype + ", the model's " + want_type);
    if (optimizer != View::template optimizer_name<Trainer>() || slots != m.state_size)
      throw CheckpointError(at + "written with optimizer '" + optimizer + "' (" +
                            std::to_string(slots) + " state slots), the trainer uses '" +
                            View::template optimizer_name<Trainer>() + "' (" +
                            std::to_string(m.state_size) + ")");
    if (auto const diff = detail::signature_mismatch(sig, detail::signature(m)); !diff.empty())
      throw CheckpointError(at + "made for another model: " + diff);
    auto dxpl = detail::h5_dxpl(comm, false, file);
    for (std::size_t t = 0; t < nt; ++t)
      for (std::size_t part = 0; part < parts; ++part) {
        std::string const dname = detail::part_path(m.names, t, part);
        std::string const dat = at + "dataset " + dname + ": ";
        hid_t const did = H5Dopen2(fid, dname.c_str(), H5P_DEFAULT);
        if (did < 0)
          throw CheckpointError(dat + "missing or unreadable");
        detail::H5Handle d(did, H5Dclose);
        detail::H5Handle space(H5Dget_space(did), H5Sclose);
        std::vector<hsize_t> dims(m.shapes[t].size());
        if (space.get() < 0 || H5Sget_simple_extent_ndims(space.get()) != int(dims.size()) ||
            H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0 ||
            !std::equal(dims.begin(), dims.end(), m.shapes[t].begin()))
          throw CheckpointError(dat + "its shape is not the model's " +
                                detail::shape_str(m.shapes[t]));
        if (!detail::h5_read_attr<std::uint64_t>(did, "checksum", expected[part * nt + t]))
          throw CheckpointError(dat + "no checksum");
        std::size_t const n = detail::select_pieces(m, t, false, space.get(), file);
        auto mem = detail::memory_space(n, file);
        auto const* p = detail::piece_of(m, t);
        T* dst = part == 0 ? values.data() : state.data() + (part - 1) * m.shard_size;
        if (n > 0)
          dst += p->shard_offset;
        T scratch{};
        if (H5Dread(did, detail::h5_type<T>(), mem.get(), space.get(), dxpl.get(),
                    n > 0 ? dst : &scratch) < 0)
          throw CheckpointError(dat + "read failed (truncated or corrupted file?)");
        if (n > 0)
          sums[part * nt + t] = detail::piece_hash(m, *p, static_cast<T const*>(dst));
      }
    detail::read_buffers(fid, comm, buffers, buffers_expected, at, file);
  });
  if (comm && comm->size() > 1 && !sums.empty())
    comm->allreduce(sums.data(), sums.size());
  for (std::size_t i = 0; i < sums.size(); ++i)
    if (sums[i] != expected[i]) // the same sums and attributes on every rank
      throw CheckpointError(
          where + file + ": dataset " + detail::part_path(m.names, i % nt, i / nt) + " " +
          detail::shape_str(m.shapes[i % nt]) + " fails its checksum (the file is corrupted)");
  auto const buffers_sums = detail::buffer_sums(comm, buffers);
  for (std::size_t i = 0; i < buffers.size(); ++i)
    if (buffers_sums[i] != buffers_expected[i])
      throw CheckpointError(where + file + ": buffer /buffers/" + buffers[i].name +
                            " fails its checksum (the file is corrupted)");
  Access::restore(trainer, values, state, step, skipped);
  View::set_buffers(trainer, buffers);
  return pos;
}

} // namespace telar
