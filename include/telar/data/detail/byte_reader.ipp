// What telar/data/detail/byte_reader.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/data/detail/byte_reader.hpp>

namespace telar::detail {

TELAR_DECL ByteReader::ByteReader(std::string path, std::string who)
    : path_(std::move(path)), who_(std::move(who)) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto const status = fs::status(path_, ec);
  if (status.type() == fs::file_type::not_found) {
    fail("no such file");
  }
  if (ec) {
    fail("cannot access: " + ec.message());
  }
  if (fs::is_directory(status)) {
    fail("is a directory, expected a file");
  }
  file_ = std::fopen(path_.c_str(), "rb");
  if (file_ == nullptr) {
    fail(std::string("cannot open: ") + std::strerror(errno));
  }
  in_.resize(1 << 16);
  fill_input();
  if (avail_ == 0) {
    fail("empty file (0 bytes)");
  }
  gzip_ = avail_ >= 2 && in_[0] == 0x1f && in_[1] == 0x8b;
  if (!gzip_ && ends_with(path_, ".gz")) {
    char first[64];
    std::snprintf(first, sizeof first, "0x%02x 0x%02x", unsigned(in_[0]),
                  avail_ >= 2 ? unsigned(in_[1]) : 0u);
    fail(std::string("named .gz but not gzip-compressed (starts with ") + first +
         ", gzip starts with 0x1f 0x8b); the file is damaged or misnamed");
  }
  if (gzip_) {
    std::memset(&zs_, 0, sizeof zs_);
    // 16 + MAX_WBITS: gzip wrapper only, with its CRC-32 and length checks.
    if (inflateInit2(&zs_, 16 + MAX_WBITS) != Z_OK) {
      fail("zlib inflateInit2 failed (out of memory?)");
    }
    zs_open_ = true;
  }
}

TELAR_DECL ByteReader::~ByteReader() {
  if (zs_open_) {
    inflateEnd(&zs_);
  }
  if (file_ != nullptr) {
    std::fclose(file_);
  }
}

TELAR_DECL std::size_t ByteReader::read(unsigned char* dst, std::size_t n) {
  std::size_t done = 0;
  while (done < n) {
    std::size_t const got =
        gzip_ ? read_gzip(dst + done, n - done) : read_raw(dst + done, n - done);
    if (got == 0) {
      break;
    }
    done += got;
  }
  return done;
}

TELAR_DECL std::uint64_t ByteReader::drain() {
  unsigned char sink[1 << 14];
  std::uint64_t total = 0;
  for (;;) {
    std::size_t const got = read(sink, sizeof sink);
    total += got;
    if (got < sizeof sink) {
      return total;
    }
  }
}

TELAR_DECL void ByteReader::fill_input() {
  if (avail_ > 0 && pos_ > 0) {
    std::memmove(in_.data(), in_.data() + pos_, avail_);
  }
  pos_ = 0;
  while (avail_ < in_.size() && !file_eof_) {
    std::size_t const got = std::fread(in_.data() + avail_, 1, in_.size() - avail_, file_);
    if (got == 0) {
      if (std::ferror(file_)) {
        fail(std::string("read error: ") + std::strerror(errno));
      }
      file_eof_ = true;
    }
    avail_ += got;
    file_bytes_ += got;
  }
}

TELAR_DECL std::size_t ByteReader::read_raw(unsigned char* dst, std::size_t n) {
  if (avail_ == 0) {
    fill_input();
  }
  std::size_t const got = std::min(n, avail_);
  std::memcpy(dst, in_.data() + pos_, got);
  pos_ += got;
  avail_ -= got;
  return got;
}

TELAR_DECL std::size_t ByteReader::read_gzip(unsigned char* dst, std::size_t n) {
  std::size_t const out = std::min<std::size_t>(n, 1u << 30);
  // Loops only while inflate eats input (headers) without giving output.
  while (!gz_done_) {
    if (avail_ == 0) {
      fill_input();
    }
    if (avail_ == 0) {
      fail("truncated gzip stream: it ends after " + std::to_string(file_bytes_) +
           " bytes without its end marker and checksum (incomplete download?)");
    }
    zs_.next_in = in_.data() + pos_;
    zs_.avail_in = static_cast<uInt>(avail_);
    zs_.next_out = dst;
    zs_.avail_out = static_cast<uInt>(out);
    int const rc = inflate(&zs_, Z_NO_FLUSH);
    std::size_t const consumed = avail_ - zs_.avail_in;
    pos_ += consumed;
    avail_ -= consumed;
    std::size_t const produced = out - zs_.avail_out;
    if (rc == Z_STREAM_END) {
      next_member();
    } else if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT) {
      // zlib says e.g. "incorrect data check" for a CRC mismatch.
      fail(std::string("corrupt gzip stream: ") + (zs_.msg != nullptr ? zs_.msg : "invalid data") +
           " (near compressed byte " + std::to_string(compressed_bytes_read()) + ")");
    } else if (rc == Z_MEM_ERROR) {
      fail("zlib ran out of memory");
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      fail("zlib inflate failed with code " + std::to_string(rc));
    }
    if (produced > 0) {
      return produced;
    }
    if (consumed == 0 && !gz_done_) {
      fail("zlib inflate made no progress (code " + std::to_string(rc) + ")");
    }
  }
  return 0;
}

TELAR_DECL void ByteReader::next_member() {
  if (avail_ < 2) {
    fill_input();
  }
  if (avail_ == 0) {
    gz_done_ = true;
    return;
  }
  if (avail_ >= 2 && in_[pos_] == 0x1f && in_[pos_ + 1] == 0x8b) {
    inflateReset(&zs_);
    return;
  }
  std::uint64_t extra = avail_;
  unsigned char sink[1 << 14];
  for (std::size_t got; (got = std::fread(sink, 1, sizeof sink, file_)) > 0;) {
    extra += got;
  }
  fail("trailing garbage: " + std::to_string(extra) +
       " bytes after the end of the gzip stream that are not another gzip member");
}

} // namespace telar::detail
