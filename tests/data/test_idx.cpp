// The IDX reader: good files round-trip, raw or gzipped; every kind of broken
// file throws telar::DataError naming the path and the reason; the real
// Fashion-MNIST loads when installed.
#include <telar/data/idx.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using Catch::Matchers::ContainsSubstring;
using Bytes = std::vector<unsigned char>;

namespace {

// A fresh directory, removed with everything in it at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    auto const tick = std::chrono::steady_clock::now().time_since_epoch().count();
    path = fs::temp_directory_path() /
           ("telar-data-test-" + std::to_string(tick) + "-" + std::to_string(std::rand()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(std::string const& name) const { return (path / name).string(); }
};

Bytes idx_bytes(std::uint32_t magic, std::vector<std::uint32_t> const& dims, Bytes const& payload) {
  Bytes b;
  auto put32 = [&](std::uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      b.push_back(static_cast<unsigned char>(v >> shift));
    }
  };
  put32(magic);
  for (auto d : dims) {
    put32(d);
  }
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

void write_raw(std::string const& path, Bytes const& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<char const*>(bytes.data()), std::streamsize(bytes.size()));
  REQUIRE(out.good());
}

void write_gz(std::string const& path, Bytes const& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!bytes.empty()) {
    REQUIRE(gzwrite(f, bytes.data(), unsigned(bytes.size())) == int(bytes.size()));
  }
  REQUIRE(gzclose(f) == Z_OK);
}

Bytes read_all(std::string const& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// 3 images of 2 x 4 pixels and their labels.
Bytes const pixels = {0,  255, 1,  2,  3,   4,  5,  6,  //
                      7,  8,   9,  10, 11,  12, 13, 14, //
                      15, 16,  17, 18, 128, 19, 20, 21};
Bytes const labels = {3, 0, 9};

// Pseudo-random bytes, which deflate cannot shrink much: corruption then hits
// real compressed data rather than a tiny back-reference.
Bytes noise(std::size_t n) {
  Bytes b(n);
  std::uint32_t x = 12345;
  for (auto& v : b) {
    x = x * 1103515245u + 12345u;
    v = static_cast<unsigned char>(x >> 24);
  }
  return b;
}

// The message of the DataError `f` throws; fails the test if it throws none.
template <class F>
std::string data_error(F&& f) {
  try {
    f();
  } catch (telar::DataError const& e) {
    return e.what();
  }
  FAIL("expected telar::DataError, none was thrown");
  return {};
}

} // namespace

TEST_CASE("load_idx round-trips raw and gzipped files", "[data][idx]") {
  TempDir dir;
  for (bool gz : {false, true}) {
    INFO("gzip: " << gz);
    std::string const img = dir / (gz ? "img.gz" : "img");
    std::string const lab = dir / (gz ? "lab.gz" : "lab");
    auto const write = gz ? write_gz : write_raw;
    write(img, idx_bytes(0x803, {3, 2, 4}, pixels));
    write(lab, idx_bytes(0x801, {3}, labels));

    telar::IdxArray const a = telar::read_idx(img);
    CHECK(a.magic == telar::idx_images_magic);
    CHECK(a.dims == std::vector<std::size_t>{3, 2, 4});
    CHECK(a.data == std::vector<std::uint8_t>(pixels.begin(), pixels.end()));
    CHECK(a.path == img);

    telar::Dataset const d = telar::load_idx(img, lab, 10);
    CHECK(d.size == 3);
    CHECK(d.features == 8);
    CHECK(d.classes == 10);
    CHECK(d.shape == std::vector<std::size_t>{2, 4});
    CHECK(d.name == img);
    REQUIRE(d.x.size() == 24);
    for (std::size_t i = 0; i < 24; ++i) {
      CHECK(d.x[i] == float(pixels[i]) / 255.0f);
    }
    CHECK(d.x[0] == 0.0f);
    CHECK(d.x[1] == 1.0f);
    CHECK(d.y == std::vector<std::int32_t>{3, 0, 9});
  }
}

TEST_CASE("read_idx accepts gzip content without .gz and concatenated members", "[data][idx]") {
  TempDir dir;
  Bytes const all = idx_bytes(0x803, {3, 2, 4}, pixels);
  // gzip content under a plain name: recognised by its magic bytes.
  write_gz(dir / "plain-name", all);
  CHECK(telar::read_idx(dir / "plain-name").data.size() == 24);
  // `cat a.gz b.gz` is a valid gzip file holding both parts.
  Bytes const head(all.begin(), all.begin() + 10), tail(all.begin() + 10, all.end());
  write_gz(dir / "a.gz", head);
  write_gz(dir / "b.gz", tail);
  Bytes both = read_all(dir / "a.gz");
  Bytes const b = read_all(dir / "b.gz");
  both.insert(both.end(), b.begin(), b.end());
  write_raw(dir / "both.gz", both);
  CHECK(telar::read_idx(dir / "both.gz").data ==
        std::vector<std::uint8_t>(pixels.begin(), pixels.end()));
}

TEST_CASE("read_idx handles a payload larger than its buffers", "[data][idx]") {
  TempDir dir;
  Bytes const big = noise(3 << 20); // crosses the reader's 1 MiB first chunk and 64 KiB input
  write_gz(dir / "big.gz", idx_bytes(0x803, {3, 1024, 1024}, big));
  write_raw(dir / "big", idx_bytes(0x803, {3, 1024, 1024}, big));
  CHECK(telar::read_idx(dir / "big.gz").data == std::vector<std::uint8_t>(big.begin(), big.end()));
  CHECK(telar::read_idx(dir / "big").data == std::vector<std::uint8_t>(big.begin(), big.end()));
}

TEST_CASE("broken IDX files throw DataError naming the path and the reason", "[data][idx]") {
  TempDir dir;
  std::string const good_lab = dir / "good-labels";
  std::string const good_img = dir / "good-images";
  write_raw(good_lab, idx_bytes(0x801, {3}, labels));
  write_raw(good_img, idx_bytes(0x803, {3, 2, 4}, pixels));

  // Each case: a file (raw or gzipped), which argument of load_idx it is, and
  // the words the message must contain.
  struct Case {
    char const* name;
    Bytes content;
    bool gz;
    bool is_labels;
    std::vector<std::string> reasons;
  };
  Bytes const short_payload(pixels.begin(), pixels.begin() + 10);
  Bytes const extra = [] {
    Bytes b = pixels;
    b.insert(b.end(), {1, 2, 3, 4, 5});
    return b;
  }();
  std::vector<Case> const cases = {
      {"truncated-payload",
       idx_bytes(0x803, {3, 2, 4}, short_payload),
       false,
       false,
       {"truncated: header says 3x2x4 = 24 bytes of pixels, the file holds only 10 after its "
        "16-byte header"}},
      {"truncated-payload.gz",
       idx_bytes(0x803, {3, 2, 4}, short_payload),
       true,
       false,
       {"truncated: header says 3x2x4 = 24 bytes of pixels, the file holds only 10"}},
      {"truncated-header",
       Bytes{0, 0, 8, 3, 0, 0, 0, 3, 0, 0},
       false,
       false,
       {"truncated header", "3 dimensions need 16 header bytes, the file holds only 10"}},
      {"truncated-magic", Bytes{0, 0}, false, false, {"truncated header", "holds 2 bytes"}},
      {"empty", Bytes{}, false, false, {"empty file"}},
      {"bad-magic",
       idx_bytes(0x12340803, {3, 2, 4}, pixels),
       false,
       false,
       {"bad magic 0x12340803", "not an IDX file"}},
      {"wrong-dims",
       idx_bytes(0x802, {3, 8}, pixels),
       false,
       false,
       {"bad magic 0x00000802, expected 0x00000803 (IDX unsigned-byte images)",
        "wrong number of dimensions, 2 instead of 3"}},
      {"labels-as-images",
       idx_bytes(0x803, {3, 1, 1}, labels),
       false,
       true,
       {"bad magic 0x00000803, expected 0x00000801 (IDX unsigned-byte labels)"}},
      {"float-type",
       idx_bytes(0x0D03, {3, 2, 4}, pixels),
       false,
       false,
       {"bad magic 0x00000D03", "element type 0x0D (32-bit float)", "only 0x08"}},
      {"zero-dims", idx_bytes(0x800, {}, {}), false, false, {"0 dimensions"}},
      {"zero-dim", idx_bytes(0x803, {3, 0, 4}, {}), false, false, {"dimension 1 of 3 is 0"}},
      {"negative-dim",
       idx_bytes(0x803, {0x80000000u, 2, 4}, pixels),
       false,
       false,
       {"dimension 0 is 2147483648, more than 2^31-1"}},
      {"huge",
       idx_bytes(0x803, {0x7FFFFFFF, 0x7FFFFFFF, 4}, pixels),
       false,
       false,
       {"header says 2147483647x2147483647", "more than Telar's limit"}},
      {"huge-header-small-file",
       idx_bytes(0x803, {60000, 1000, 100}, pixels),
       false,
       false,
       {"truncated: header says 60000x1000x100 = 6000000000 bytes of pixels, the file holds only "
        "24"}},
      {"trailing",
       idx_bytes(0x803, {3, 2, 4}, extra),
       false,
       false,
       {"trailing garbage: header says 3x2x4 = 24 bytes of pixels, the file has 5 more"}},
      {"trailing.gz",
       idx_bytes(0x803, {3, 2, 4}, extra),
       true,
       false,
       {"trailing garbage", "has 5 more"}},
      {"trailing-labels",
       idx_bytes(0x801, {3}, Bytes{1, 2, 3, 4}),
       false,
       true,
       {"trailing garbage: header says 3 bytes of labels, the file has 1 more"}},
  };
  for (auto const& c : cases) {
    std::string const path = dir / c.name;
    (c.gz ? write_gz : write_raw)(path, c.content);
    std::string const msg = data_error(
        [&] { c.is_labels ? telar::load_idx(good_img, path) : telar::load_idx(path, good_lab); });
    INFO("case " << c.name);
    CHECK_THAT(msg, ContainsSubstring("telar::read_idx: " + path + ": "));
    for (auto const& reason : c.reasons) {
      CHECK_THAT(msg, ContainsSubstring(reason));
    }
  }
}

TEST_CASE("mismatched or out-of-range labels throw DataError", "[data][idx]") {
  TempDir dir;
  std::string const img = dir / "img", lab4 = dir / "lab4", lab_bad = dir / "lab-bad";
  write_raw(img, idx_bytes(0x803, {3, 2, 4}, pixels));
  write_raw(lab4, idx_bytes(0x801, {4}, Bytes{1, 2, 3, 4}));
  write_raw(lab_bad, idx_bytes(0x801, {3}, Bytes{1, 12, 3}));

  std::string msg = data_error([&] { telar::load_idx(img, lab4); });
  CHECK_THAT(msg, ContainsSubstring("count mismatch"));
  CHECK_THAT(msg, ContainsSubstring(img + " holds 3 images but " + lab4 + " holds 4 labels"));

  msg = data_error([&] { telar::load_idx(img, lab_bad, 10); });
  CHECK_THAT(msg, ContainsSubstring(lab_bad));
  CHECK_THAT(msg, ContainsSubstring("label 12 of sample 1 is out of range for 10 classes (0..9)"));
  CHECK(telar::load_idx(img, lab_bad, 13).y[1] == 12);

  CHECK_THROWS_AS(telar::load_idx(img, lab4, 0), std::invalid_argument);
  CHECK_THROWS_AS(telar::load_idx(img, lab4, 257), std::invalid_argument);
}

TEST_CASE("damaged gzip streams throw DataError instead of giving zeros", "[data][idx]") {
  TempDir dir;
  std::string const good = dir / "good.gz";
  write_gz(good, idx_bytes(0x803, {4, 64, 64}, noise(4 * 64 * 64)));
  Bytes const gz = read_all(good);
  REQUIRE(gz.size() > 1000);
  REQUIRE_NOTHROW(telar::read_idx(good));

  auto check = [&](char const* name, Bytes const& content, std::vector<std::string> reasons) {
    std::string const path = dir / name;
    write_raw(path, content);
    std::string const msg = data_error([&] { telar::read_idx(path, telar::idx_images_magic); });
    INFO("case " << name);
    CHECK_THAT(msg, ContainsSubstring("telar::read_idx: " + path + ": "));
    for (auto const& r : reasons) {
      CHECK_THAT(msg, ContainsSubstring(r));
    }
  };

  Bytes body = gz;
  for (std::size_t i = gz.size() / 2; i < gz.size() / 2 + 16; ++i) {
    body[i] ^= 0x5A;
  }
  check("corrupt-body.gz", body, {"corrupt gzip stream"});

  Bytes crc = gz; // the trailer is CRC-32 then the length, little-endian
  crc[gz.size() - 8] ^= 0x01;
  check("corrupt-crc.gz", crc, {"corrupt gzip stream", "incorrect data check"});

  Bytes len = gz;
  len[gz.size() - 4] ^= 0x01;
  check("corrupt-length.gz", len, {"corrupt gzip stream", "incorrect length check"});

  check("cut.gz", Bytes(gz.begin(), gz.begin() + std::ptrdiff_t(gz.size() / 2)),
        {"truncated gzip stream"});
  check("cut-trailer.gz", Bytes(gz.begin(), gz.end() - 3), {"truncated gzip stream"});

  Bytes junk = gz;
  junk.insert(junk.end(), {'j', 'u', 'n', 'k'});
  check("junk-after.gz", junk, {"trailing garbage: 4 bytes after the end of the gzip stream"});

  check("not-gzip.gz", idx_bytes(0x803, {3, 2, 4}, pixels),
        {"named .gz but not gzip-compressed", "starts with 0x00 0x00"});

  Bytes header = gz;
  header[3] = 0xE0; // reserved gzip flag bits must be zero
  check("bad-header.gz", header, {"corrupt gzip stream"});
}

TEST_CASE("missing files and directories throw DataError", "[data][idx]") {
  TempDir dir;
  std::string const missing = dir / "nope-images-idx3-ubyte.gz";
  std::string msg = data_error([&] { telar::read_idx(missing); });
  CHECK_THAT(msg, ContainsSubstring("telar::read_idx: " + missing + ": no such file"));

  msg = data_error([&] { telar::read_idx(dir.path.string()); });
  CHECK_THAT(msg, ContainsSubstring(dir.path.string() + ": is a directory"));

  CHECK_THROWS_AS(telar::read_idx(missing, 0x00000903), std::invalid_argument);
}

TEST_CASE("load_fashion_mnist finds the files or says how to get them", "[data][idx]") {
  TempDir dir;
  std::string const nodir = dir / "no-such-dir";
  std::string msg = data_error([&] { telar::load_fashion_mnist(nodir); });
  CHECK_THAT(msg, ContainsSubstring("telar::load_fashion_mnist: " + nodir + ": no such directory"));
  CHECK_THAT(msg, ContainsSubstring("install the Debian package dataset-fashion-mnist"));
  CHECK_THAT(msg, ContainsSubstring("--data DIR"));
  CHECK_FALSE(telar::has_fashion_mnist(nodir));
  CHECK(data_error([&] { telar::fashion_mnist_train_size(nodir); }) == msg);

  // A small stand-in with every naming the loader accepts.
  std::string const fm = dir / "fm";
  fs::create_directories(fm);
  write_gz(fm + "/train-images-idx3-ubyte.gz", idx_bytes(0x803, {3, 2, 4}, pixels));
  write_raw(fm + "/train-labels-idx1-ubyte", idx_bytes(0x801, {3}, labels));
  write_raw(fm + "/t10k-images.idx3-ubyte", idx_bytes(0x803, {2, 2, 4}, Bytes(16, 7)));
  CHECK_FALSE(telar::has_fashion_mnist(fm));
  CHECK(telar::fashion_mnist_train_size(fm) == 3); // the training labels are there
  msg = data_error([&] { telar::load_fashion_mnist(fm); });
  CHECK_THAT(msg,
             ContainsSubstring(fm + ": no t10k-labels-idx1-ubyte.gz or t10k-labels-idx1-ubyte"));
  CHECK_THAT(msg, ContainsSubstring("dataset-fashion-mnist"));

  write_gz(fm + "/t10k-labels.idx1-ubyte.gz", idx_bytes(0x801, {2}, Bytes{5, 6}));
  CHECK(telar::has_fashion_mnist(fm));
  telar::FashionMnist const f = telar::load_fashion_mnist(fm);
  CHECK(f.train.size == 3);
  CHECK(f.test.size == 2);
  CHECK(f.train.name == "fashion-mnist/train");
  CHECK(f.test.name == "fashion-mnist/test");
  CHECK(f.test.y == std::vector<std::int32_t>{5, 6});
  CHECK(std::string(telar::fashion_mnist_class_names[9]) == "Ankle boot");

  // The size comes from the labels file alone, read as strictly.
  write_raw(fm + "/train-labels-idx1-ubyte", idx_bytes(0x801, {4}, Bytes{1, 2, 3}));
  CHECK_THAT(data_error([&] { telar::fashion_mnist_train_size(fm); }),
             ContainsSubstring(fm + "/train-labels-idx1-ubyte: truncated"));
  write_raw(fm + "/train-labels-idx1-ubyte", idx_bytes(0x801, {3}, labels));

  // Test images of another size are refused at load time, naming both files.
  write_raw(fm + "/t10k-images.idx3-ubyte", idx_bytes(0x803, {2, 4, 4}, Bytes(32, 7)));
  msg = data_error([&] { telar::load_fashion_mnist(fm); });
  CHECK_THAT(msg,
             ContainsSubstring("telar::load_fashion_mnist: " + fm + ": the test images (" + fm +
                               "/t10k-images.idx3-ubyte) are 4 x 4 pixels, the training "
                               "images (" +
                               fm + "/train-images-idx3-ubyte.gz) 2 x 4"));
}

TEST_CASE("the installed Fashion-MNIST loads", "[data][idx][fashion-mnist]") {
  std::string const dir = telar::default_fashion_mnist_dir();
  if (!telar::has_fashion_mnist(dir)) {
    SKIP("Fashion-MNIST is not in " << dir << " (Debian package dataset-fashion-mnist)");
  }
  telar::FashionMnist const f = telar::load_fashion_mnist(dir);
  for (auto const* d : {&f.train, &f.test}) {
    INFO(d->name);
    CHECK(d->features == 784);
    CHECK(d->shape == std::vector<std::size_t>{28, 28});
    CHECK(d->classes == 10);
    REQUIRE(d->x.size() == d->size * 784);
    REQUIRE(d->y.size() == d->size);
    auto const [lo, hi] = std::minmax_element(d->x.begin(), d->x.end());
    CHECK(*lo == 0.0f);
    CHECK(*hi == 1.0f);
    double sum = 0;
    for (float v : d->x) {
      sum += v;
    }
    CHECK(std::abs(sum / double(d->x.size()) - 0.286) < 0.01); // the data set's known mean
    std::vector<std::size_t> per_class(10, 0);
    for (auto y : d->y) {
      REQUIRE(y >= 0);
      REQUIRE(y < 10);
      ++per_class[std::size_t(y)];
    }
    for (auto c : per_class) {
      CHECK(c == d->size / 10); // Fashion-MNIST is balanced
    }
  }
  CHECK(f.train.size == 60000);
  CHECK(f.test.size == 10000);
}
