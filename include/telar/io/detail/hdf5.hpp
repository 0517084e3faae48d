#pragma once
// Thin RAII over the HDF5 C API: handles that close themselves, and every
// return code checked (a CheckpointError naming the file and the call).
// HDF5's own error stack printing is switched off: Telar's message says it.
#include <telar/comm/communicator.hpp>
#include <telar/io/error.hpp>

#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if !defined(H5_HAVE_PARALLEL)
#error "telar/io/checkpoint.hpp needs a parallel HDF5 (built with MPI); see docs/checkpoints.md"
#endif

namespace telar::detail {

class H5Handle {
public:
  using Closer = herr_t (*)(hid_t);
  H5Handle() = default;
  H5Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  H5Handle(H5Handle&& o) noexcept : id_(std::exchange(o.id_, -1)), close_(o.close_) {}
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      close_ = o.close_;
    }
    return *this;
  }
  H5Handle(H5Handle const&) = delete;
  H5Handle& operator=(H5Handle const&) = delete;
  ~H5Handle() { reset(); }
  hid_t get() const { return id_; }
  // Closes now; false when HDF5 reports a failure (a file's final flush).
  bool reset() {
    bool ok = true;
    if (id_ >= 0 && close_ != nullptr)
      ok = close_(id_) >= 0;
    id_ = -1;
    return ok;
  }

private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

struct H5Quiet { // no HDF5 error stack on stderr
  H5Quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }
};

// Throws E("<api>: <file>: <call> failed") on a negative code.
template <class E>
hid_t h5_check_as(hid_t id, char const* api, std::string const& file, char const* call) {
  if (id < 0)
    throw E(std::string(api) + ": " + file + ": " + call + " failed");
  return id;
}

// The checkpoints' h5_check_as: a CheckpointError.
inline hid_t h5_check(hid_t id, std::string const& file, char const* call) {
  return h5_check_as<CheckpointError>(id, "telar::checkpoint", file, call);
}

template <class T>
hid_t h5_type() {
  return sizeof(T) == 4 ? H5T_NATIVE_FLOAT : H5T_NATIVE_DOUBLE;
}

// File access: MPI-IO over comm (the default driver without one).
inline H5Handle h5_fapl(Communicator const* comm, std::string const& file) {
  H5Handle p(h5_check(H5Pcreate(H5P_FILE_ACCESS), file, "H5Pcreate"), H5Pclose);
  if (comm != nullptr)
    h5_check(H5Pset_fapl_mpio(p.get(), comm->native(), MPI_INFO_NULL), file, "H5Pset_fapl_mpio");
  return p;
}

// Dataset transfer: collective MPI-IO for writes, independent for reads (a
// rank that fails can stop without leaving the others in a collective).
inline H5Handle h5_dxpl(Communicator const* comm, bool collective, std::string const& file) {
  H5Handle p(h5_check(H5Pcreate(H5P_DATASET_XFER), file, "H5Pcreate"), H5Pclose);
  if (comm != nullptr)
    h5_check(H5Pset_dxpl_mpio(p.get(), collective ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT),
             file, "H5Pset_dxpl_mpio");
  return p;
}

// Scalar and string attributes (every rank writes the same value).
template <class T>
void h5_write_attr(hid_t obj, char const* name, T value, std::string const& file) {
  hid_t const type = std::is_same_v<T, double>          ? H5T_NATIVE_DOUBLE
                     : std::is_same_v<T, std::uint64_t> ? H5T_NATIVE_UINT64
                                                        : H5T_NATIVE_LLONG;
  H5Handle space(h5_check(H5Screate(H5S_SCALAR), file, "H5Screate"), H5Sclose);
  H5Handle a(h5_check(H5Acreate2(obj, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT), file,
                      "H5Acreate2"),
             H5Aclose);
  h5_check(H5Awrite(a.get(), type, &value), file, "H5Awrite");
}
inline void h5_write_attr_str(hid_t obj, char const* name, std::string const& value,
                              std::string const& file) {
  H5Handle type(h5_check(H5Tcopy(H5T_C_S1), file, "H5Tcopy"), H5Tclose);
  h5_check(H5Tset_size(type.get(), value.empty() ? 1 : value.size()), file, "H5Tset_size");
  H5Handle space(h5_check(H5Screate(H5S_SCALAR), file, "H5Screate"), H5Sclose);
  H5Handle a(h5_check(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                      file, "H5Acreate2"),
             H5Aclose);
  std::string v = value.empty() ? std::string(1, '\0') : value;
  h5_check(H5Awrite(a.get(), type.get(), v.data()), file, "H5Awrite");
}

// Reading attributes: false when absent or unreadable.
template <class T>
bool h5_read_attr(hid_t obj, char const* name, T& value) {
  if (H5Aexists(obj, name) <= 0)
    return false;
  hid_t const type = std::is_same_v<T, double>          ? H5T_NATIVE_DOUBLE
                     : std::is_same_v<T, std::uint64_t> ? H5T_NATIVE_UINT64
                                                        : H5T_NATIVE_LLONG;
  H5Handle a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  return a.get() >= 0 && H5Aread(a.get(), type, &value) >= 0;
}
inline bool h5_read_attr_str(hid_t obj, char const* name, std::string& value) {
  if (H5Aexists(obj, name) <= 0)
    return false;
  H5Handle a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (a.get() < 0)
    return false;
  H5Handle type(H5Aget_type(a.get()), H5Tclose);
  if (type.get() < 0 || H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()))
    return false;
  std::size_t const n = H5Tget_size(type.get());
  std::string buf(n, '\0');
  if (H5Aread(a.get(), type.get(), buf.data()) < 0)
    return false;
  value = buf.substr(0, buf.find('\0'));
  return true;
}

} // namespace telar::detail
