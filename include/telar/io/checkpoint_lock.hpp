#pragma once
/*! \file
 *  \brief telar::CheckpointLock: one run at a time in a checkpoint directory.
 *
 *  \code
 *  telar::CheckpointLock lock("ckpt"); // throws CheckpointError if another run holds it
 *  ... train, save_checkpoint(trainer, "ckpt", ...) ...
 *  \endcode
 *  Two runs saving into one directory would delete each other's checkpoints
 *  (keep K) and resume from each other's steps. The lock is an exclusive
 *  flock(2) on DIR/.telar.lock, whose text names the holder (host and pid);
 *  the kernel releases it when the holder exits, however it exits (a
 *  requeued Slurm job finds it free). One process takes it (rank 0 of a job).
 */
#include <telar/io/error.hpp>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#define TELAR_HAS_FLOCK 1
#endif

namespace telar {

/*! \brief An exclusive lock on a checkpoint directory, held while the
 *  object lives (see the file's description). */
class CheckpointLock {
public:
  /*! \brief Takes the lock of \p dir (which must exist).
   *  \throws CheckpointError naming \p dir and the holder when another
   *  process holds it, or when the lock file cannot be created. A file
   *  system without flock (some network mounts) leaves the lock unheld:
   *  warning() says so. */
  explicit CheckpointLock(std::string const& dir) : path_(dir + "/.telar.lock") {
#ifdef TELAR_HAS_FLOCK
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw CheckpointError("telar::CheckpointLock: cannot create " + path_ + ": " +
                            std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
      write_holder();
      return;
    }
    int const err = errno;
    if (err == EWOULDBLOCK) {
      std::string const holder = read_holder();
      release();
      throw CheckpointError("telar::CheckpointLock: checkpoint directory " + dir +
                            " is in use by another run (" + holder +
                            "): two runs writing one directory overwrite each other's "
                            "checkpoints; wait for that run to end or give this one another "
                            "directory");
    }
    warning_ = "telar::CheckpointLock: " + path_ + ": " + std::strerror(err) +
               " (no flock on this file system): nothing keeps a second run out of " + dir;
    release();
#endif
  }
  ~CheckpointLock() {
#ifdef TELAR_HAS_FLOCK
    if (fd_ >= 0) // no stale holder for the next reader ((void)!: a failure changes nothing)
      (void)!::ftruncate(fd_, 0);
#endif
    release();
  }
  CheckpointLock(CheckpointLock const&) = delete;
  CheckpointLock& operator=(CheckpointLock const&) = delete;
  /*! \brief Takes over \p o's lock (\p o then holds none). \param o the lock moved from */
  CheckpointLock(CheckpointLock&& o) noexcept
      : path_(std::move(o.path_)), warning_(std::move(o.warning_)), fd_(std::exchange(o.fd_, -1)) {}
  CheckpointLock& operator=(CheckpointLock&&) = delete;

  /*! \brief Whether this object holds the lock. */
  bool held() const {
    return fd_ >= 0;
  }
  /*! \brief Why the lock is not held (empty when it is). */
  std::string const& warning() const {
    return warning_;
  }

private:
  // "host node7, pid 1234": who holds it, for the other run's message.
  void write_holder() {
#ifdef TELAR_HAS_FLOCK
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0)
      host[0] = 0;
    std::string const text =
        std::string("host ") + host + ", pid " + std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, text.data(), text.size(), 0) > 0)
      ::fsync(fd_);
#endif
  }
  std::string read_holder() const {
    char buf[300] = {};
#ifdef TELAR_HAS_FLOCK
    ssize_t const n = ::pread(fd_, buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = 0;
    buf[std::strcspn(buf, "\n")] = 0;
#endif
    return buf[0] != 0 ? std::string(buf) : "holder unknown";
  }
  void release() {
#ifdef TELAR_HAS_FLOCK
    if (fd_ >= 0)
      ::close(fd_); // closing the last descriptor releases the flock
#endif
    fd_ = -1;
  }

  std::string path_, warning_;
  int fd_ = -1;
};

} // namespace telar
