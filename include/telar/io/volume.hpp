#pragma once
/*! \file
 *  \brief Volumes larger than a rank: a synthetic 3-D segmentation data set
 *  in HDF5 (telar::write_synthetic_volumes) and telar::VolumeReader, which
 *  reads only a rank's depth slab (and halos) of each sample with collective
 *  parallel-HDF5 hyperslab reads, and prefetches the next batch.
 *
 *  File layout: `/images [N, C, D, H, W]` float32 and `/labels [N, D, H, W]`
 *  integers (uint8 from the generator) with an attribute `classes`.
 *  docs/volumes.md has the layout, the bytes each rank reads and how the
 *  prefetch works. Needs a parallel HDF5 (TELAR_HAVE_HDF5; target Telar::hdf5).
 */
#include <telar/comm/communicator.hpp>
#include <telar/data/error.hpp>
#include <telar/io/detail/agree.hpp>
#include <telar/io/detail/volume_read.hpp>
#include <telar/io/detail/volume_synth.hpp>
#include <telar/parallel/spatial_decomposition.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace telar {

/*! \brief A rank's part of one axis of a volume: the planes it owns,
 *  `[begin, end)`, and the halo planes it also reads below and above them
 *  (zero at the volume's faces). */
struct SlabRange {
  long long begin = 0;   //!< first owned plane
  long long end = 0;     //!< one past the last owned plane
  long long halo_lo = 0; //!< planes read below `begin` (0 at the lower face)
  long long halo_hi = 0; //!< planes read from `end` on (0 at the upper face)
  /*! \brief Owned planes. */
  long long size() const noexcept { return end - begin; }
  /*! \brief First plane read (`begin - halo_lo`). */
  long long read_begin() const noexcept { return begin - halo_lo; }
  /*! \brief Planes read, halos included. */
  long long read_size() const noexcept { return size() + halo_lo + halo_hi; }
};

/*! \brief Part `part` of `parts` near-equal slabs of an axis of `extent`
 *  planes (the first `extent % parts` slabs one plane thicker), with `halo`
 *  planes on each side that has a neighbour.
 *  \param extent the axis' length (the volume's depth, say)
 *  \param parts number of slabs \param part this slab, in `[0, parts)`
 *  \param halo halo width (>= 0)
 *  \param axis the axis' name, for messages
 *  \throws DataError (the same for every part) when a slab would be empty
 *  or thinner than the halo (a neighbour's halo would reach past it)
 *  \throws std::invalid_argument if `parts`, `part` or `halo` is out of range */
inline SlabRange split_extent(long long extent, int parts, int part, long long halo,
                              char const* axis = "depth") {
  if (parts < 1 || part < 0 || part >= parts || halo < 0)
    throw std::invalid_argument("telar::split_extent: part " + std::to_string(part) + " of " +
                                std::to_string(parts) + " with halo " + std::to_string(halo) +
                                " is out of range");
  std::string const what = std::string("telar::split_extent: ") + axis + " " +
                           std::to_string(extent) + " split into " + std::to_string(parts) +
                           " slabs";
  long long const base = extent / parts;
  if (base == 0)
    throw DataError(what + ": a slab would be empty");
  if (parts > 1 && base < halo)
    throw DataError(what + " gives slabs of " + std::to_string(base) +
                    " planes, thinner than the halo of " + std::to_string(halo));
  // The planes a rank owns are the spatial decomposition's, so that a slab
  // read from the file is the slab the split layers compute on.
  Slab const owned = split_extent(std::size_t(extent), parts, part);
  SlabRange r;
  r.begin = static_cast<long long>(owned.begin);
  r.end = static_cast<long long>(owned.end);
  r.halo_lo = part > 0 ? halo : 0;
  r.halo_hi = part + 1 < parts ? halo : 0;
  return r;
}

/*! \brief What a rank reads of every sample: a depth slab, and optionally a
 *  height range (2-D decompositions); the width is always whole. */
struct VolumeSlab {
  SlabRange depth;                 //!< along D
  std::optional<SlabRange> height; //!< along H; none: the whole height, no halo
};

/*! \brief The extents of a volume file and its number of classes. */
struct VolumeShape {
  long long samples = 0;  //!< N
  long long channels = 0; //!< C
  long long depth = 0;    //!< D
  long long height = 0;   //!< H
  long long width = 0;    //!< W
  int classes = 0;        //!< labels lie in `[0, classes)`
};

/*! \brief What write_synthetic_volumes makes: the file's shape (by
 *  default 8 samples of one channel, 64^3, 2 classes: background and
 *  `classes - 1` lesion classes, at most 255), and its lesions. */
struct SyntheticVolumeOptions : VolumeShape {
  SyntheticVolumeOptions() : VolumeShape{8, 1, 64, 64, 64, 2} {}
  int max_lesions = 3;    //!< lesions per volume: 1 .. max_lesions
  std::uint64_t seed = 0; //!< the file is a function of the options and the seed
};

namespace detail {

inline void check_options(SyntheticVolumeOptions const& o) {
  if (o.samples < 1 || o.channels < 1 || o.depth < 1 || o.height < 1 || o.width < 1 ||
      o.classes < 2 || o.classes > 255 || o.max_lesions < 1)
    throw std::invalid_argument(
        "telar::write_synthetic_volumes: needs samples, channels, depth, height, width and "
        "max_lesions >= 1 and classes in [2, 255], got " +
        std::to_string(o.samples) + " x " + std::to_string(o.channels) + " x " +
        std::to_string(o.depth) + " x " + std::to_string(o.height) + " x " +
        std::to_string(o.width) + ", " + std::to_string(o.classes) + " classes, " +
        std::to_string(o.max_lesions) + " lesions");
}

// Creates a dataset whose bytes depend on its contents only: space
// allocated at creation, no fill, no modification time.
inline H5Handle create_dataset(hid_t file, char const* name, hid_t type,
                               std::vector<hsize_t> const& dims, std::string const& path) {
  H5Handle space(
      h5v(H5Screate_simple(int(dims.size()), dims.data(), nullptr), path, "H5Screate_simple"),
      H5Sclose);
  H5Handle dcpl(h5v(H5Pcreate(H5P_DATASET_CREATE), path, "H5Pcreate"), H5Pclose);
  h5v(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), path, "H5Pset_alloc_time");
  h5v(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), path, "H5Pset_fill_time");
  h5v(H5Pset_obj_track_times(dcpl.get(), false), path, "H5Pset_obj_track_times");
  return H5Handle(
      h5v(H5Dcreate2(file, name, type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), path,
          "H5Dcreate2"),
      H5Dclose);
}

// Writes buf into the block starting at sample n of dataset d (independent I/O).
inline void write_sample(hid_t d, hid_t mem_type, long long n, void const* buf, hid_t dxpl,
                         std::string const& path) {
  H5Handle fs(h5v(H5Dget_space(d), path, "H5Dget_space"), H5Sclose);
  int const rank = H5Sget_simple_extent_ndims(fs.get());
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank)), start(dims.size(), 0);
  H5Sget_simple_extent_dims(fs.get(), dims.data(), nullptr);
  start[0] = hsize_t(n);
  dims[0] = 1;
  h5v(H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, start.data(), nullptr, dims.data(), nullptr),
      path, "H5Sselect_hyperslab");
  H5Handle ms(h5v(H5Screate_simple(rank, dims.data(), nullptr), path, "H5Screate_simple"),
              H5Sclose);
  h5v(H5Dwrite(d, mem_type, ms.get(), fs.get(), dxpl, buf), path, "H5Dwrite");
}

} // namespace detail

/*! \brief Writes a synthetic 3-D segmentation data set to `path`:
 *  `/images [N, C, D, H, W]` float32 (a smooth background gradient,
 *  low-frequency waves and white noise, brighter in ellipsoidal lesions of
 *  random size and contrast) and `/labels [N, D, H, W]` uint8 (0 background,
 *  `1 .. classes-1` the lesion's class) with attribute `classes`.
 *
 *  Collective over `comm`: rank r makes and writes samples r, r + P, ... with
 *  MPI-IO (pass a communicator of one rank to write alone). Sample n depends
 *  only on (options, n): the file's bytes are the same for the same options
 *  whatever the number of ranks. Written as `path.part` and renamed when
 *  complete. \param path the file \param options what to make \param comm
 *  the writers \throws DataError (the same on every rank) if it cannot be
 *  written \throws std::invalid_argument for options out of range */
inline void write_synthetic_volumes(std::string const& path, SyntheticVolumeOptions const& options,
                                    Communicator const& comm) {
  detail::check_options(options);
  detail::H5Quiet quiet;
  std::string const part = path + ".part";
  detail::agreed_as<DataError>(&comm, "telar::write_synthetic_volumes: unknown error", [&] {
    auto const& o = options;
    detail::H5Handle fapl = detail::h5_fapl(&comm, part);
    detail::H5Handle file(
        detail::h5v(H5Fcreate(part.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), part,
                    "H5Fcreate (cannot create the file)"),
        H5Fclose);
    auto const n = hsize_t(o.samples), c = hsize_t(o.channels), d = hsize_t(o.depth),
               h = hsize_t(o.height), w = hsize_t(o.width);
    detail::H5Handle images =
        detail::create_dataset(file.get(), "images", H5T_IEEE_F32LE, {n, c, d, h, w}, part);
    detail::H5Handle labels =
        detail::create_dataset(file.get(), "labels", H5T_STD_U8LE, {n, d, h, w}, part);
    detail::h5_write_attr<long long>(labels.get(), "classes", o.classes, part);
    detail::H5Handle dxpl = detail::h5_dxpl(&comm, false, part);
    detail::VolumeParams const p{o.channels, o.depth,       o.height, o.width,
                                 o.classes,  o.max_lesions, o.seed};
    std::vector<float> img(std::size_t(o.channels * o.depth * o.height * o.width));
    std::vector<std::uint8_t> lab(std::size_t(o.depth * o.height * o.width));
    for (long long s = comm.rank(); s < o.samples; s += comm.size()) {
      detail::make_volume(p, s, img.data(), lab.data());
      detail::write_sample(images.get(), H5T_NATIVE_FLOAT, s, img.data(), dxpl.get(), part);
      detail::write_sample(labels.get(), H5T_NATIVE_UINT8, s, lab.data(), dxpl.get(), part);
    }
    images.reset(), labels.reset();
    if (!file.reset())
      throw DataError("telar::write_synthetic_volumes: " + part + ": closing failed");
  });
  detail::agreed_as<DataError>(&comm, "telar::write_synthetic_volumes: unknown error", [&] {
    if (comm.rank() == 0 && std::rename(part.c_str(), path.c_str()) != 0)
      throw DataError("telar::write_synthetic_volumes: cannot rename " + part + " to " + path);
  });
}

namespace detail {

inline H5Handle open_volume_file(std::string const& path, Communicator const& comm) {
  H5Handle fapl = h5_fapl(&comm, path);
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  if (file.get() < 0)
    throw DataError("telar::VolumeReader: " + path +
                    ": cannot open (missing, unreadable or not HDF5)");
  return file;
}

// The extents of a volume file, checked: /images [N, C, D, H, W] of floats
// and /labels [N, D, H, W] of integers; classes from the caller or from the
// attribute `classes` of /labels.
inline VolumeShape volume_shape(hid_t file, std::string const& path, int classes) {
  std::string const where = "telar::VolumeReader: " + path + ": ";
  auto const img = dataset_dims(file, "images", path);
  auto const lab = dataset_dims(file, "labels", path);
  if (img.size() != 5 || lab.size() != 4)
    throw DataError(where + "/images " + dims_str(img) + " and /labels " + dims_str(lab) +
                    " should have rank 5 [N, C, D, H, W] and rank 4 [N, D, H, W]");
  if (lab[0] != img[0] || lab[1] != img[2] || lab[2] != img[3] || lab[3] != img[4])
    throw DataError(where + "/images " + dims_str(img) + " and /labels " + dims_str(lab) +
                    " disagree: /labels should be " + dims_str({img[0], img[2], img[3], img[4]}));
  H5Handle images(h5v(H5Dopen2(file, "images", H5P_DEFAULT), path, "H5Dopen2"), H5Dclose);
  H5Handle labels(h5v(H5Dopen2(file, "labels", H5P_DEFAULT), path, "H5Dopen2"), H5Dclose);
  if (dataset_class(images.get()) != H5T_FLOAT || dataset_class(labels.get()) != H5T_INTEGER)
    throw DataError(where + "/images must hold floats and /labels integers");
  long long file_classes = 0;
  if (classes == 0 && !h5_read_attr(labels.get(), "classes", file_classes))
    throw DataError(where +
                    "/labels has no 'classes' attribute: pass VolumeReaderOptions::classes");
  VolumeShape s{(long long)img[0], (long long)img[1], (long long)img[2],
                (long long)img[3], (long long)img[4], classes == 0 ? int(file_classes) : classes};
  if (s.classes < 1)
    throw DataError(where + "classes = " + std::to_string(s.classes) + ", expected >= 1");
  return s;
}

} // namespace detail

/*! \brief The extents and classes of a volume file, checked as VolumeReader
 *  checks them (collective over `comm`), to choose the slabs before opening
 *  a reader. \param path the file \param comm the ranks that will read it
 *  \param classes classes the model predicts (0: the file's attribute)
 *  \throws DataError naming the file, the dataset and the shapes, the same
 *  on every rank */
inline VolumeShape read_volume_shape(std::string const& path, Communicator const& comm,
                                     int classes = 0) {
  detail::H5Quiet quiet;
  VolumeShape s;
  detail::agreed_as<DataError>(&comm, "telar::VolumeReader: unknown error", [&] {
    detail::H5Handle file = detail::open_volume_file(path, comm);
    s = detail::volume_shape(file.get(), path, classes);
  });
  return s;
}

/*! \brief One rank's slabs of a batch of samples, on the host.
 *
 *  `images` is `[samples, channels, depth, height, width]` with depth and
 *  height including the halos; `labels` is `[samples, label_depth,
 *  label_height, width]`, the owned planes only (no halo: the loss is
 *  computed where a rank owns the output). Row-major. */
struct VolumeBatch {
  std::vector<std::size_t> indices; //!< the samples, in the order asked for
  long long channels = 0;           //!< C
  long long depth = 0;              //!< owned depth planes plus both halos
  long long height = 0;             //!< owned height rows plus both halos
  long long width = 0;              //!< W
  long long label_depth = 0;        //!< owned depth planes
  long long label_height = 0;       //!< owned height rows
  std::vector<float> images;        //!< `[samples, C, depth, height, W]`
  std::vector<std::int32_t> labels; //!< `[samples, label_depth, label_height, W]`
  /*! \brief Samples in the batch. */
  std::size_t samples() const noexcept { return indices.size(); }
};

/*! \brief How a VolumeReader checks the file. */
struct VolumeReaderOptions {
  /*! \brief Classes the model predicts; 0 takes the file's `classes`
   *  attribute of `/labels`. */
  int classes = 0;
  /*! \brief Scan every label once at construction (each rank a share of the
   *  samples), so a label outside `[0, classes)` stops every rank before
   *  training; costs one read of `/labels`. */
  bool check_labels = true;
  /*! \brief Collective MPI-IO transfers for `read` (two-phase I/O: a few
   *  aggregator ranks read large blocks and scatter them); false reads
   *  independently, which can be faster for 1-D slabs (each a few
   *  contiguous runs) on a local disk. Built against Open MPI 4.1.0 to
   *  4.1.4, reads of a chunked file are independent whatever this says: its
   *  ompio returned zeros from collective reads of chunked datasets
   *  (open-mpi/ompi#10546, fixed in 4.1.5). */
  bool collective = true;
};

/*! \brief Reads a rank's slab (and halos) of a batch of volumes from a file
 *  laid out as write_synthetic_volumes writes it.
 *
 *  Every rank of `comm` opens the file with MPI-IO and reads, per sample,
 *  only the hyperslab `[n, 0:C, depth.read_begin() +: depth.read_size(),
 *  height rows, 0:W]` of `/images` and the owned part of `/labels`, with
 *  collective transfers (read and wait are collective on `comm`; ranks may
 *  ask for different samples and different numbers of them, even none).
 *
 *  Prefetch: MPI is initialised without thread support by Telar's programs
 *  and Debian's parallel HDF5 is not thread-safe, so no thread may call MPI
 *  or HDF5 beside the training loop. When both datasets are contiguous and
 *  in the host's format (the generator's files are), `prefetch` starts a
 *  thread that reads the same slab bytes with POSIX `pread` at the offsets
 *  HDF5 reported at construction, while the caller trains; `wait` joins it
 *  (and agrees on errors). Otherwise `wait` reads collectively then.
 *
 *  \code
 *  telar::VolumeReader reader(path, slab, comm);
 *  telar::BatchLoader loader({reader.shape().samples, dp, dp_rank, seed}, batch);
 *  telar::VolumeBatch b;
 *  reader.prefetch(loader.batch(0).indices);
 *  for (std::size_t s = 0; s < loader.size(); ++s) {
 *    reader.wait(b);                                  // step s's slabs
 *    if (s + 1 < loader.size()) reader.prefetch(loader.batch(s + 1).indices);
 *    train_step(b);                                   // overlaps the next read
 *  }
 *  \endcode */
class VolumeReader {
public:
  /*! \brief Opens `path` on every rank of `comm` (collective) and checks it:
   *  both datasets present, of rank 5 and 4 with matching extents, this
   *  rank's slab non-empty and inside the volume, and (by default) every
   *  label in `[0, classes)`.
   *  \param path the file \param slab this rank's part of each sample
   *  \param comm the ranks reading the file together \param options checks
   *  \throws DataError naming the file, the dataset, the rank and the shapes,
   *  the same on every rank */
  VolumeReader(std::string path, VolumeSlab slab, Communicator const& comm,
               VolumeReaderOptions options = {})
      : path_(std::move(path)), slab_(slab), comm_(comm.dup("telar::volumes")),
        collective_(options.collective) {
    detail::H5Quiet quiet;
    detail::agreed_as<DataError>(&comm_, "telar::VolumeReader: unknown error", [&] {
      open(options.classes);
      check_slab();
    });
    if (options.check_labels)
      detail::agreed_as<DataError>(&comm_, "telar::VolumeReader: unknown error",
                                   [&] { check_labels(); });
  }

  VolumeReader(VolumeReader const&) = delete;            //!< not copyable
  VolumeReader& operator=(VolumeReader const&) = delete; //!< not copyable
  /*! \brief Waits for a prefetch in flight and closes the file (collective
   *  with MPI-IO: destroy the readers of all ranks together). */
  ~VolumeReader() {
    if (worker_.joinable())
      worker_.join();
    if (fd_ >= 0)
      ::close(fd_);
  }

  /*! \brief The file's extents and classes. */
  VolumeShape const& shape() const noexcept { return shape_; }
  /*! \brief This rank's slab. */
  VolumeSlab const& slab() const noexcept { return slab_; }
  /*! \brief Whether `prefetch` reads in a background thread (see the class). */
  bool prefetch_in_background() const noexcept { return fd_ >= 0; }
  /*! \brief Bytes this rank reads per sample: images with halos, labels
   *  as stored. */
  std::size_t bytes_per_sample() const noexcept {
    return std::size_t(image_elems()) * sizeof(float) + std::size_t(label_elems()) * label_bytes_;
  }

  /*! \brief Reads this rank's slabs of samples `indices` into `out`
   *  (collective on the reader's ranks; the same count is not needed).
   *  \param indices samples, each below shape().samples \param out the batch
   *  \throws DataError (on every rank) for an index past the file */
  void read(std::vector<std::size_t> const& indices, VolumeBatch& out) {
    detail::H5Quiet quiet;
    detail::agreed_as<DataError>(&comm_, "telar::VolumeReader: unknown error",
                                 [&] { check_indices(indices); });
    unsigned long long most = indices.size();
    comm_.allreduce(&most, 1, ReduceOp::max);
    shape_batch(out, indices);
    detail::agreed_as<DataError>(&comm_, "telar::VolumeReader: unknown error", [&] {
      detail::H5Handle dxpl = detail::h5_dxpl(&comm_, collective_, path_);
      for (std::size_t k = 0; k < most; ++k) // one collective read per position
        read_sample(k < indices.size() ? (long long)indices[k] : -1,
                    out.images.data() + k * image_elems(), out.labels.data() + k * label_elems(),
                    dxpl.get());
    });
  }

  /*! \brief Starts reading this rank's slabs of `indices` for the next
   *  `wait` (local: no MPI; a background thread when
   *  prefetch_in_background()). \param indices samples, each below
   *  shape().samples \throws std::logic_error if a prefetch is pending */
  void prefetch(std::vector<std::size_t> const& indices) {
    if (pending_)
      throw std::logic_error(
          "telar::VolumeReader::prefetch: the previous prefetch was not waited for");
    pending_ = true;
    prefetch_error_.clear();
    next_.indices = indices;
    if (!prefetch_in_background())
      return;
    try {
      check_indices(indices);
    } catch (DataError const& e) {
      prefetch_error_ = e.what(); // wait() reports it on every rank
      return;
    }
    shape_batch(next_, indices);
    worker_ = std::thread([this] { prefetch_error_ = pread_batch(next_); });
  }

  /*! \brief The batch of the last `prefetch`, into `out` (collective).
   *  \param out the batch \throws DataError (on every rank) if a read failed
   *  \throws std::logic_error if nothing was prefetched */
  void wait(VolumeBatch& out) {
    if (!pending_)
      throw std::logic_error("telar::VolumeReader::wait: nothing was prefetched");
    pending_ = false;
    if (!prefetch_in_background()) {
      read(next_.indices, out);
      return;
    }
    if (worker_.joinable())
      worker_.join();
    detail::agree_as<DataError>(&comm_, prefetch_error_);
    std::swap(out, next_);
  }

private:
  long long image_elems() const {
    return shape_.channels * slab_.depth.read_size() * rows().read_size() * shape_.width;
  }
  long long label_elems() const { return slab_.depth.size() * rows().size() * shape_.width; }
  SlabRange rows() const {
    return slab_.height ? *slab_.height : SlabRange{0, shape_.height, 0, 0};
  }
  std::string where() const { return "telar::VolumeReader: " + path_ + ": "; }

  void shape_batch(VolumeBatch& b, std::vector<std::size_t> const& indices) const {
    b.indices = indices;
    b.channels = shape_.channels, b.width = shape_.width;
    b.depth = slab_.depth.read_size(), b.height = rows().read_size();
    b.label_depth = slab_.depth.size(), b.label_height = rows().size();
    b.images.resize(std::size_t(image_elems()) * indices.size());
    b.labels.resize(std::size_t(label_elems()) * indices.size());
  }

  void open(int classes) {
    file_ = detail::open_volume_file(path_, comm_);
    shape_ = detail::volume_shape(file_.get(), path_, classes);
    images_ = detail::H5Handle(
        detail::h5v(H5Dopen2(file_.get(), "images", H5P_DEFAULT), path_, "H5Dopen2"), H5Dclose);
    labels_ = detail::H5Handle(
        detail::h5v(H5Dopen2(file_.get(), "labels", H5P_DEFAULT), path_, "H5Dopen2"), H5Dclose);
    detail::H5Handle ltype(detail::h5v(H5Dget_type(labels_.get()), path_, "H5Dget_type"), H5Tclose);
    label_bytes_ = H5Tget_size(ltype.get());
    if (detail::ompio_read_sieving_bug() &&
        !(detail::is_contiguous(images_.get()) && detail::is_contiguous(labels_.get())))
      collective_ = false;
    open_raw();
  }

  // The pread path for prefetch; the same choice on every rank (same file).
  void open_raw() {
    image_raw_ = detail::raw_layout(images_.get(), true);
    label_raw_ = detail::raw_layout(labels_.get(), false);
    if (image_raw_.offset >= 0 && label_raw_.offset >= 0)
      fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  }

  void check_range(SlabRange const& r, long long extent, char const* axis) const {
    std::string const slab = std::string(axis) + " slab [" + std::to_string(r.begin) + ", " +
                             std::to_string(r.end) + ")";
    std::string const rank = "rank " + std::to_string(comm_.rank()) + ": ";
    if (r.size() <= 0)
      throw DataError(where() + rank + slab + " is empty");
    if (r.halo_lo < 0 || r.halo_hi < 0 || r.read_begin() < 0 ||
        r.read_begin() + r.read_size() > extent)
      throw DataError(where() + rank + slab + " with halos " + std::to_string(r.halo_lo) +
                      " below and " + std::to_string(r.halo_hi) + " above reads [" +
                      std::to_string(r.read_begin()) + ", " +
                      std::to_string(r.read_begin() + r.read_size()) + "), outside the volume's " +
                      axis + " [0, " + std::to_string(extent) + ")");
  }
  void check_slab() const {
    check_range(slab_.depth, shape_.depth, "depth");
    if (slab_.height)
      check_range(*slab_.height, shape_.height, "height");
  }

  // Rank r scans samples r, r + P, ... (independent reads).
  void check_labels() {
    detail::H5Handle dxpl = detail::h5_dxpl(&comm_, false, path_);
    hsize_t const dims[4] = {1, hsize_t(shape_.depth), hsize_t(shape_.height),
                             hsize_t(shape_.width)};
    std::vector<std::int32_t> lab(std::size_t(shape_.depth * shape_.height * shape_.width));
    detail::H5Handle ms(detail::h5v(H5Screate_simple(4, dims, nullptr), path_, "H5Screate_simple"),
                        H5Sclose);
    for (long long n = comm_.rank(); n < shape_.samples; n += comm_.size()) {
      detail::H5Handle fs(detail::h5v(H5Dget_space(labels_.get()), path_, "H5Dget_space"),
                          H5Sclose);
      hsize_t const start[4] = {hsize_t(n), 0, 0, 0};
      detail::h5v(H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, start, nullptr, dims, nullptr),
                  path_, "H5Sselect_hyperslab");
      detail::h5v(
          H5Dread(labels_.get(), H5T_NATIVE_INT32, ms.get(), fs.get(), dxpl.get(), lab.data()),
          path_, "H5Dread /labels");
      std::string const bad =
          detail::bad_label(lab, n, shape_.height, shape_.width, shape_.classes, path_);
      if (!bad.empty())
        throw DataError(bad);
    }
  }

  void check_indices(std::vector<std::size_t> const& indices) const {
    for (std::size_t const n : indices)
      if (n >= std::size_t(shape_.samples))
        throw DataError(where() + "rank " + std::to_string(comm_.rank()) + ": sample " +
                        std::to_string(n) + " is past the file's " +
                        std::to_string(shape_.samples) + " samples");
  }

  // One collective read of sample n's slab (n < 0: this rank joins with none).
  void read_sample(long long n, float* img, std::int32_t* lab, hid_t dxpl) {
    SlabRange const d = slab_.depth, h = rows();
    hsize_t const is[5] = {hsize_t(n < 0 ? 0 : n), 0, hsize_t(d.read_begin()),
                           hsize_t(h.read_begin()), 0};
    hsize_t const ic[5] = {1, hsize_t(shape_.channels), hsize_t(d.read_size()),
                           hsize_t(h.read_size()), hsize_t(shape_.width)};
    hsize_t const ls[4] = {is[0], hsize_t(d.begin), hsize_t(h.begin), 0};
    hsize_t const lc[4] = {1, hsize_t(d.size()), hsize_t(h.size()), hsize_t(shape_.width)};
    read_block(images_.get(), H5T_NATIVE_FLOAT, 5, is, ic, n >= 0, img, dxpl);
    read_block(labels_.get(), H5T_NATIVE_INT32, 4, ls, lc, n >= 0, lab, dxpl);
  }
  void read_block(hid_t dset, hid_t type, int rank, hsize_t const* start, hsize_t const* count,
                  bool any, void* buf, hid_t dxpl) {
    detail::H5Handle fs(detail::h5v(H5Dget_space(dset), path_, "H5Dget_space"), H5Sclose);
    detail::H5Handle ms(
        detail::h5v(H5Screate_simple(rank, count, nullptr), path_, "H5Screate_simple"), H5Sclose);
    if (any)
      detail::h5v(H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, start, nullptr, count, nullptr),
                  path_, "H5Sselect_hyperslab");
    else {
      H5Sselect_none(fs.get());
      H5Sselect_none(ms.get());
    }
    detail::h5v(H5Dread(dset, type, ms.get(), fs.get(), dxpl, buf), path_, "H5Dread");
  }

  // The prefetch thread: pread of every run of contiguous bytes of the
  // slabs (no MPI, no HDF5). Returns "" or the error.
  std::string pread_batch(VolumeBatch& b) const {
    SlabRange const d = slab_.depth, h = rows();
    long long const H = shape_.height, W = shape_.width, D = shape_.depth, C = shape_.channels;
    bool const whole = h.read_size() == H; // a (c, slab) block is one run
    std::vector<char> raw(std::size_t(label_elems()) * label_raw_.size);
    for (std::size_t k = 0; k < b.indices.size(); ++k) {
      auto const n = (long long)b.indices[k];
      float* img = b.images.data() + k * image_elems();
      for (long long c = 0; c < C; ++c)
        for (long long z = 0; z < (whole ? 1 : d.read_size()); ++z) {
          long long const run = whole ? d.read_size() * H * W : h.read_size() * W;
          long long const el = (((n * C + c) * D + d.read_begin() + z) * H + h.read_begin()) * W;
          std::string const e =
              detail::pread_all(fd_, img, std::size_t(run) * 4, image_raw_.offset + el * 4);
          if (!e.empty())
            return where() + "rank " + std::to_string(comm_.rank()) + ": reading /images: " + e;
          img += run;
        }
      for (long long z = 0; z < d.size(); ++z) {
        long long const run = h.size() * W, el = ((n * D + d.begin + z) * H + h.begin) * W;
        std::size_t const sz = label_raw_.size;
        std::string const e =
            detail::pread_all(fd_, raw.data() + z * run * sz, std::size_t(run) * sz,
                              label_raw_.offset + el * (long long)sz);
        if (!e.empty())
          return where() + "rank " + std::to_string(comm_.rank()) + ": reading /labels: " + e;
      }
      detail::widen_labels(raw.data(), std::size_t(label_elems()), label_raw_.size,
                           label_raw_.is_signed, b.labels.data() + k * label_elems());
    }
    return {};
  }

  std::string path_;
  VolumeSlab slab_;
  Communicator comm_;
  VolumeShape shape_;
  detail::H5Handle file_, images_, labels_;
  detail::RawLayout image_raw_, label_raw_;
  bool collective_ = true;
  std::size_t label_bytes_ = 1;
  int fd_ = -1;
  bool pending_ = false;
  VolumeBatch next_;
  std::thread worker_;
  std::string prefetch_error_;
};

} // namespace telar
