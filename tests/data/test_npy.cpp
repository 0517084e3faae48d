// NumPy .npy files: what write_npy writes reads back (shapes of rank 0 to 4,
// the header 64-byte aligned as numpy writes it); float64 files convert;
// a file of another type, in Fortran order, truncated or not .npy throws
// telar::DataError naming the file and the reason. numpy's own files are
// read in tests/onnx (onnx_train --predict against PyTorch).
#include <telar/data/npy.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;

namespace {

std::string temp_file(std::string const& name) {
  return (std::filesystem::temp_directory_path() / ("telar-npy-" + name)).string();
}

// A file holding a version-1.0 header `dict` (padded as numpy pads it) and `bytes`.
void write_raw(std::string const& path, std::string dict, std::string const& bytes) {
  std::size_t const total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  char const len[2] = {char(dict.size() & 0xff), char(dict.size() >> 8)};
  out.write(len, 2);
  out << dict << bytes;
}

} // namespace

TEST_CASE("write_npy and read_npy round-trip float32 arrays", "[data][npy]") {
  std::string const path = temp_file("round.npy");
  for (std::vector<std::size_t> const& shape :
       {std::vector<std::size_t>{}, {4}, {2, 3}, {2, 1, 3, 2}}) {
    std::size_t n = 1;
    for (std::size_t e : shape)
      n *= e;
    std::vector<float> values(n);
    for (std::size_t i = 0; i < n; ++i)
      values[i] = 0.5f * float(i) - 1.25f;
    telar::write_npy(path, shape, values);
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    CHECK((std::size_t(in.tellg()) - n * 4) % 64 == 0); // the header is aligned
    telar::NpyArray const a = telar::read_npy(path);
    CHECK(a.shape == shape);
    CHECK(a.values == values);
  }
  std::remove(path.c_str());
}

TEST_CASE("read_npy converts float64 and refuses what it cannot read", "[data][npy]") {
  std::string const path = temp_file("bad.npy");
  double const d[3] = {1.5, -2.0, 1e-3};
  write_raw(path, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }",
            std::string(reinterpret_cast<char const*>(d), sizeof d));
  telar::NpyArray const a = telar::read_npy(path);
  CHECK(a.shape == std::vector<std::size_t>{3});
  CHECK(a.values == std::vector<float>{1.5f, -2.0f, 1e-3f});

  write_raw(path, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", std::string(24, 0));
  CHECK_THROWS_WITH(telar::read_npy(path),
                    ContainsSubstring("bad.npy' holds '<i8' values; float32 ('<f4') or float64"));
  write_raw(path, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", std::string(16, 0));
  CHECK_THROWS_WITH(telar::read_npy(path), ContainsSubstring("is in Fortran order"));
  write_raw(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }",
            std::string(12, 0));
  CHECK_THROWS_WITH(telar::read_npy(path),
                    ContainsSubstring("truncated: fewer than the 4 values its shape holds"));
  write_raw(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (two,), }", "");
  CHECK_THROWS_WITH(telar::read_npy(path), ContainsSubstring("shape '(two,)' is not a tuple"));
  std::ofstream(path) << "not numpy";
  CHECK_THROWS_WITH(telar::read_npy(path), ContainsSubstring("is not a .npy file"));
  std::remove(path.c_str());
  CHECK_THROWS_WITH(telar::read_npy(path), ContainsSubstring("cannot open"));
  CHECK_THROWS_AS(telar::write_npy(path, {2, 2}, {1.0f}), telar::DataError);
}
