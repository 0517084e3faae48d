// What telar/data/idx.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/data/idx.hpp>

namespace telar {
namespace detail {

TELAR_DECL std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", unsigned(v));
  return buf;
}

TELAR_DECL char const* idx_type_name(unsigned code) {
  switch (code) {
  case 0x08:
    return "unsigned byte";
  case 0x09:
    return "signed byte";
  case 0x0B:
    return "16-bit integer";
  case 0x0C:
    return "32-bit integer";
  case 0x0D:
    return "32-bit float";
  case 0x0E:
    return "64-bit float";
  default:
    return "not an IDX type";
  }
}

TELAR_DECL std::string idx_magic_meaning(std::uint32_t magic) {
  if (magic == idx_images_magic) {
    return "IDX unsigned-byte images";
  }
  if (magic == idx_labels_magic) {
    return "IDX unsigned-byte labels";
  }
  return "IDX unsigned-byte, " + std::to_string(magic & 0xFFu) + " dimensions";
}

TELAR_DECL std::string dims_string(std::vector<std::size_t> const& dims) {
  std::string s;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    s += (i ? "x" : "") + std::to_string(dims[i]);
  }
  return s;
}

TELAR_DECL IdxArray read_idx_impl(std::string const& path, std::uint32_t expected_magic) {
  ByteReader in(path, "telar::read_idx");
  IdxArray a;
  a.path = path;

  unsigned char head[4];
  std::size_t got = in.read(head, 4);
  if (got < 4) {
    in.fail("truncated header: the file holds " + std::to_string(got) +
            " bytes, an IDX header needs at least 4 (magic number) + 4 per dimension");
  }
  a.magic = std::uint32_t(head[0]) << 24 | std::uint32_t(head[1]) << 16 |
            std::uint32_t(head[2]) << 8 | std::uint32_t(head[3]);
  unsigned const type = head[2];
  unsigned const ndims = head[3];
  std::string const expected = expected_magic != 0 ? ", expected " + hex32(expected_magic) + " (" +
                                                         idx_magic_meaning(expected_magic) + ")"
                                                   : std::string();
  if (head[0] != 0 || head[1] != 0) {
    in.fail("bad magic " + hex32(a.magic) + expected +
            ": not an IDX file (its first two bytes must be zero)");
  }
  if (type != 0x08) {
    char code[8];
    std::snprintf(code, sizeof code, "0x%02X", type);
    in.fail("bad magic " + hex32(a.magic) + expected + ": element type " + code + " (" +
            idx_type_name(type) + "), Telar reads only 0x08 (unsigned byte)");
  }
  if (ndims == 0) {
    in.fail("bad magic " + hex32(a.magic) + expected + ": 0 dimensions");
  }
  if (expected_magic != 0 && a.magic != expected_magic) {
    in.fail("bad magic " + hex32(a.magic) + expected + ": wrong number of dimensions, " +
            std::to_string(ndims) + " instead of " + std::to_string(expected_magic & 0xFFu));
  }

  std::vector<unsigned char> dim_bytes(4 * std::size_t(ndims));
  got = in.read(dim_bytes.data(), dim_bytes.size());
  if (got < dim_bytes.size()) {
    in.fail("truncated header: " + std::to_string(ndims) + " dimensions need " +
            std::to_string(4 + dim_bytes.size()) + " header bytes, the file holds only " +
            std::to_string(4 + got));
  }
  std::uint64_t total = 1;
  for (unsigned d = 0; d < ndims; ++d) {
    unsigned char const* b = &dim_bytes[4 * d];
    std::uint32_t const v = std::uint32_t(b[0]) << 24 | std::uint32_t(b[1]) << 16 |
                            std::uint32_t(b[2]) << 8 | std::uint32_t(b[3]);
    if (v == 0) {
      in.fail("dimension " + std::to_string(d) + " of " + std::to_string(ndims) +
              " is 0 (header: " + dims_string(a.dims) + (d ? "x" : "") + "0...)");
    }
    if (v > 0x7FFFFFFFu) {
      in.fail("dimension " + std::to_string(d) + " is " + std::to_string(v) +
              ", more than 2^31-1 (negative as IDX's signed 32-bit size): corrupt header");
    }
    if (total > idx_max_bytes / v) {
      a.dims.push_back(v);
      in.fail("header says " + dims_string(a.dims) + (d + 1 < ndims ? "x..." : "") +
              ", more than Telar's limit of " + std::to_string(idx_max_bytes) +
              " bytes: corrupt header?");
    }
    total *= v;
    a.dims.push_back(v);
  }

  // Grow the buffer as data arrives, so a corrupt header that claims gigabytes
  // in a small file fails as truncated instead of allocating them.
  std::size_t const header = 4 + dim_bytes.size();
  std::string const says = "header says " + dims_string(a.dims) +
                           (ndims > 1 ? " = " + std::to_string(total) : std::string()) +
                           " bytes of " + idx_payload_noun(a.magic);
  std::size_t done = 0;
  while (done < total) {
    std::size_t const want =
        std::size_t(std::min<std::uint64_t>(total - done, std::max<std::size_t>(done, 1 << 20)));
    a.data.resize(done + want);
    std::size_t const n = in.read(a.data.data() + done, want);
    done += n;
    if (n < want) {
      in.fail("truncated: " + says + ", the file holds only " + std::to_string(done) +
              " after its " + std::to_string(header) + "-byte header");
    }
  }
  std::uint64_t const extra = in.drain();
  if (extra != 0) {
    in.fail("trailing garbage: " + says + ", the file has " + std::to_string(extra) +
            " more after them");
  }
  return a;
}

TELAR_DECL std::string find_first_file(std::string const& dir,
                                       std::vector<std::string> const& names) {
  for (auto const& name : names) {
    std::error_code ec;
    auto const p = std::filesystem::path(dir) / name;
    if (std::filesystem::is_regular_file(p, ec)) {
      return p.string();
    }
  }
  return {};
}

TELAR_DECL std::vector<std::string> idx_file_names(std::string const& base) {
  std::string dotted = base;
  auto const dash = dotted.find("-idx");
  if (dash != std::string::npos) {
    dotted[dash] = '.';
  }
  return {base + ".gz", base, dotted + ".gz", dotted};
}

} // namespace detail
} // namespace telar

namespace telar {

TELAR_DECL IdxArray read_idx(std::string const& path, std::uint32_t expected_magic) {
  if ((expected_magic & 0xFFFFFF00u) != 0x00000800u || (expected_magic & 0xFFu) == 0) {
    throw std::invalid_argument("telar::read_idx: expected magic " + detail::hex32(expected_magic) +
                                " is not an unsigned-byte IDX magic (0x000008NN, NN > 0)");
  }
  return detail::read_idx_impl(path, expected_magic);
}

TELAR_DECL Dataset load_idx(std::string const& images_path, std::string const& labels_path,
                            int classes) {
  if (classes < 1 || classes > 256) {
    throw std::invalid_argument("telar::load_idx: classes = " + std::to_string(classes) +
                                ", expected 1..256 (IDX labels are bytes)");
  }
  // Labels first: small, so a broken pair fails fast.
  IdxArray const labels = read_idx(labels_path, idx_labels_magic);
  IdxArray const images = read_idx(images_path, idx_images_magic);
  std::size_t const n = images.dims[0];
  if (labels.dims[0] != n) {
    throw DataError("telar::load_idx: count mismatch: " + images_path + " holds " +
                    std::to_string(n) + " images but " + labels_path + " holds " +
                    std::to_string(labels.dims[0]) + " labels");
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (int(labels.data[i]) >= classes) {
      throw DataError("telar::load_idx: " + labels_path + ": label " +
                      std::to_string(int(labels.data[i])) + " of sample " + std::to_string(i) +
                      " is out of range for " + std::to_string(classes) + " classes (0.." +
                      std::to_string(classes - 1) + ")");
    }
  }
  Dataset d;
  d.size = n;
  d.shape = {images.dims[1], images.dims[2]};
  d.features = images.dims[1] * images.dims[2];
  d.classes = classes;
  d.name = images_path;
  d.x.resize(images.data.size());
  for (std::size_t i = 0; i < images.data.size(); ++i) {
    d.x[i] = float(images.data[i]) / 255.0f;
  }
  d.y.assign(labels.data.begin(), labels.data.end());
  return d;
}

TELAR_DECL std::string default_fashion_mnist_dir() {
  char const* env = std::getenv("TELAR_FASHION_MNIST_DIR");
  return env != nullptr && *env != '\0' ? std::string(env)
                                        : std::string("/usr/share/datasets/fashion-mnist");
}

TELAR_DECL bool has_fashion_mnist(std::string const& dir) {
  for (char const* base : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                           "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    if (detail::find_first_file(dir, detail::idx_file_names(base)).empty()) {
      return false;
    }
  }
  return true;
}

} // namespace telar

namespace telar {
namespace detail {

TELAR_DECL std::string fashion_mnist_file(std::string const& dir, std::string const& base) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw DataError(
        "telar::load_fashion_mnist: " + dir +
        (std::filesystem::exists(dir, ec) ? ": not a directory" : ": no such directory") + "; " +
        fashion_mnist_install_hint);
  }
  auto const names = idx_file_names(base);
  std::string path = find_first_file(dir, names);
  if (path.empty()) {
    throw DataError("telar::load_fashion_mnist: " + dir + ": no " + names[0] + " or " + names[1] +
                    " in it; " + fashion_mnist_install_hint);
  }
  return path;
}

} // namespace detail
} // namespace telar

namespace telar {

TELAR_DECL FashionMnist load_fashion_mnist(std::string const& dir) {
  auto const find = [&](char const* base) { return detail::fashion_mnist_file(dir, base); };
  FashionMnist f;
  f.train = load_idx(find("train-images-idx3-ubyte"), find("train-labels-idx1-ubyte"), 10);
  f.test = load_idx(find("t10k-images-idx3-ubyte"), find("t10k-labels-idx1-ubyte"), 10);
  // Checked here, not at the first evaluation, an epoch of training later.
  if (f.test.shape != f.train.shape) {
    auto const hw = [](Dataset const& d) {
      return std::to_string(d.shape[0]) + " x " + std::to_string(d.shape[1]);
    };
    throw DataError("telar::load_fashion_mnist: " + dir + ": the test images (" + f.test.name +
                    ") are " + hw(f.test) + " pixels, the training images (" + f.train.name + ") " +
                    hw(f.train) + ": one model cannot take both");
  }
  f.train.name = "fashion-mnist/train";
  f.test.name = "fashion-mnist/test";
  return f;
}

} // namespace telar
