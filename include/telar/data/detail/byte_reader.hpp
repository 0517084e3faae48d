#pragma once
// A sequential reader of a file that may be gzip-compressed, with errors that
// say what went wrong. zlib's gzread is not used on purpose: it ignores
// trailing garbage after the last gzip member and reports a truncated stream
// only through gzerror's Z_BUF_ERROR, both easy to miss; inflate tells us
// exactly.

#include <telar/core/detail/decl.hpp>
#include <telar/data/error.hpp>

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace telar::detail {

inline bool ends_with(std::string const& s, std::string const& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

class ByteReader {
public:
  // `who` prefixes every message ("telar::read_idx").
  TELAR_DECL ByteReader(std::string path, std::string who);

  ByteReader(ByteReader const&) = delete;
  ByteReader& operator=(ByteReader const&) = delete;

  TELAR_DECL ~ByteReader();

  bool gzip() const { return gzip_; }
  std::string const& path() const { return path_; }

  [[noreturn]] void fail(std::string const& what) const {
    throw DataError(who_ + ": " + path_ + ": " + what);
  }

  // Reads up to n bytes into dst; fewer only at the end of the (decompressed)
  // data. Throws DataError on a read error or a corrupt or truncated stream.
  TELAR_DECL std::size_t read(unsigned char* dst, std::size_t n);

  // Reads and counts whatever is left (bounded memory).
  TELAR_DECL std::uint64_t drain();

  std::uint64_t compressed_bytes_read() const { return file_bytes_ - avail_; }

private:
  TELAR_DECL void fill_input();

  TELAR_DECL std::size_t read_raw(unsigned char* dst, std::size_t n);

  TELAR_DECL std::size_t read_gzip(unsigned char* dst, std::size_t n);

  // After a gzip member ends: another member may follow (as `cat a.gz b.gz`
  // makes), anything else is garbage.
  TELAR_DECL void next_member();

  std::string path_;
  std::string who_;
  std::FILE* file_ = nullptr;
  std::vector<unsigned char> in_;
  std::size_t pos_ = 0;   // first unread byte in in_
  std::size_t avail_ = 0; // unread bytes in in_
  std::uint64_t file_bytes_ = 0;
  bool file_eof_ = false;
  bool gzip_ = false;
  bool gz_done_ = false;
  bool zs_open_ = false;
  z_stream zs_{};
};

} // namespace telar::detail

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/data/detail/byte_reader.ipp>
#endif
