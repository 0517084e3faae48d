#pragma once
// Internals of telar::VolumeReader: checking a volume file's layout, the
// hyperslab of a rank's slab, and the POSIX reads of the prefetch thread.
#include <telar/data/error.hpp>
#include <telar/io/detail/hdf5.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace telar::detail {

inline hid_t h5v(hid_t id, std::string const& file, char const* call) {
  return h5_check_as<DataError>(id, "telar::VolumeReader", file, call);
}

inline std::string dims_str(std::vector<hsize_t> const& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i)
    s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// A dataset's extents, or an error naming it when it is absent.
inline std::vector<hsize_t> dataset_dims(hid_t file, char const* name, std::string const& path) {
  if (H5Lexists(file, name, H5P_DEFAULT) <= 0)
    throw DataError(
        "telar::VolumeReader: " + path + ": no dataset /" + name +
        " (a segmentation file holds /images [N, C, D, H, W] and /labels [N, D, H, W])");
  H5Handle d(h5v(H5Dopen2(file, name, H5P_DEFAULT), path, "H5Dopen2"), H5Dclose);
  H5Handle s(h5v(H5Dget_space(d.get()), path, "H5Dget_space"), H5Sclose);
  int const rank = H5Sget_simple_extent_ndims(s.get());
  std::vector<hsize_t> dims(std::size_t(rank > 0 ? rank : 0));
  H5Sget_simple_extent_dims(s.get(), dims.data(), nullptr);
  return dims;
}

inline H5T_class_t dataset_class(hid_t dset) {
  H5Handle t(H5Dget_type(dset), H5Tclose);
  return t.get() < 0 ? H5T_NO_CLASS : H5Tget_class(t.get());
}

// Open MPI 4.1.0 to 4.1.4's ompio returns wrong data (zeros) from some
// collective reads through its data sieving (open-mpi/ompi#10546, fixed in
// 4.1.5): HDF5's collective reads of chunked datasets hit it at 4 ranks.
constexpr bool ompio_read_sieving_bug() {
#if defined(OPEN_MPI) && OMPI_MAJOR_VERSION == 4 && OMPI_MINOR_VERSION == 1 &&                     \
    OMPI_RELEASE_VERSION < 5
  return true;
#else
  return false;
#endif
}

inline bool is_contiguous(hid_t dset) {
  H5Handle dcpl(H5Dget_create_plist(dset), H5Pclose);
  return dcpl.get() >= 0 && H5Pget_layout(dcpl.get()) == H5D_CONTIGUOUS;
}

// The first label outside [0, classes) in n labels of sample `sample`, as a
// message, or "".
inline std::string bad_label(std::vector<std::int32_t> const& lab, long long sample, long long H,
                             long long W, int classes, std::string const& path) {
  for (std::size_t i = 0; i < lab.size(); ++i)
    if (lab[i] < 0 || lab[i] >= classes) {
      long long const v = (long long)i, d = v / (H * W), h = v / W % H, w = v % W;
      return "telar::VolumeReader: " + path + ": /labels: sample " + std::to_string(sample) +
             " has label " + std::to_string(lab[i]) + " at (d, h, w) = (" + std::to_string(d) +
             ", " + std::to_string(h) + ", " + std::to_string(w) + "), outside [0, " +
             std::to_string(classes) + ")";
    }
  return {};
}

// Where a dataset's elements start in the file, and how wide one is on disk,
// when a thread may read it with pread: contiguous, allocated, in the
// host's own format (float images; any native integer labels). -1 otherwise.
struct RawLayout {
  long long offset = -1;
  std::size_t size = 0;
  bool is_signed = false;
};
inline RawLayout raw_layout(hid_t dset, bool is_float) {
  RawLayout r;
  H5Handle type(H5Dget_type(dset), H5Tclose);
  if (type.get() < 0 || !is_contiguous(dset))
    return r;
  haddr_t const off = H5Dget_offset(dset);
  if (off == HADDR_UNDEF)
    return r;
  r.size = H5Tget_size(type.get());
  if (is_float) {
    if (H5Tequal(type.get(), H5T_NATIVE_FLOAT) <= 0)
      return r;
  } else {
    H5Handle native(H5Tget_native_type(type.get(), H5T_DIR_DEFAULT), H5Tclose);
    if (native.get() < 0 || H5Tequal(type.get(), native.get()) <= 0 || r.size > 8)
      return r;
    r.is_signed = H5Tget_sign(type.get()) == H5T_SGN_2;
  }
  r.offset = (long long)off;
  return r;
}

// Reads `bytes` at `offset` of fd; "" or the error.
inline std::string pread_all(int fd, void* dst, std::size_t bytes, long long offset) {
  auto* p = static_cast<char*>(dst);
  while (bytes > 0) {
    ssize_t const got = ::pread(fd, p, bytes, off_t(offset));
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      return got < 0 ? std::strerror(errno) : "unexpected end of file";
    p += got, bytes -= std::size_t(got), offset += got;
  }
  return {};
}

template <class T>
long long load_as(char const* e) {
  T v;
  std::memcpy(&v, e, sizeof v);
  return (long long)v;
}

// Native integers of width `size` (1, 2, 4 or 8 bytes) to int32.
inline void widen_labels(char const* src, std::size_t n, std::size_t size, bool is_signed,
                         std::int32_t* dst) {
  for (std::size_t i = 0; i < n; ++i) {
    char const* e = src + i * size;
    long long const v =
        size == 1   ? (is_signed ? load_as<std::int8_t>(e) : load_as<std::uint8_t>(e))
        : size == 2 ? (is_signed ? load_as<std::int16_t>(e) : load_as<std::uint16_t>(e))
        : size == 4 ? (is_signed ? load_as<std::int32_t>(e) : load_as<std::uint32_t>(e))
                    : load_as<std::int64_t>(e);
    dst[i] = std::int32_t(v);
  }
}

} // namespace telar::detail
