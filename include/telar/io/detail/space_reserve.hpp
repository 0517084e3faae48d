#pragma once
// Room for a checkpoint's HDF5 metadata on a disk that may fill up.
//
// Parallel HDF5 1.10 (Debian's 1.10.8) survives no write that meets a full
// disk: once a metadata flush has failed every later one fails ("slist
// already enabled?"), H5Fclose fails and leaves the file's id valid but half
// closed, and MPI_Finalize closes it again and crashes (MPICH: a segfault at
// one rank); a collective data write that fails on one rank leaves the
// others in MPI_File_set_view (a hang). So save_checkpoint lets no write
// meet it: it reserves room for the metadata in a sibling file before HDF5
// creates the checkpoint, then allocates the whole file's blocks (data and
// metadata) before writing; when that allocation fails, the reserve freed
// just before H5Fclose gives the close the room it needs.
#include <telar/io/detail/hdf5.hpp>

#include <fcntl.h>
#include <linux/falloc.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <string>
#include <utility>

namespace telar::detail {

// Bytes of HDF5 metadata a checkpoint may need, generously: object headers,
// links and checksums per dataset, the string attributes, the superblock.
inline long long metadata_headroom(std::size_t datasets, std::size_t attribute_bytes) {
  return 64 * 1024 + 2 * 1024 * (long long)datasets + 2 * (long long)attribute_bytes;
}

// A file holding `bytes` of disk until release() (or destruction) removes it.
class SpaceReserve {
public:
  SpaceReserve() = default;
  SpaceReserve(SpaceReserve const&) = delete;
  SpaceReserve& operator=(SpaceReserve const&) = delete;
  ~SpaceReserve() { release(); }

  // 0, or the errno of the failure (ENOSPC: the disk is too full).
  int take(std::string path, long long bytes) {
    int const fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0)
      return errno;
    path_ = std::move(path);
    int const err = ::posix_fallocate(fd, 0, off_t(bytes));
    ::close(fd);
    if (err != 0)
      release();
    return err;
  }
  void release() {
    if (!path_.empty())
      ::unlink(path_.c_str());
    path_.clear();
  }

private:
  std::string path_;
};

// Allocates disk blocks for the first `bytes` of the file at `path` without
// changing its size (fallocate KEEP_SIZE), so that HDF5's writes there,
// data and metadata, cannot meet a full disk. 0, or the errno of the
// failure; a file system without fallocate gives 0 (nothing reserved).
inline int preallocate(std::string const& path, long long bytes) {
  int const fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return errno;
  int const err = ::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, off_t(bytes)) == 0 ? 0 : errno;
  ::close(fd);
  return err == EOPNOTSUPP || err == ENOSYS ? 0 : err;
}

} // namespace telar::detail
