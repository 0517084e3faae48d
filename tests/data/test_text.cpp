// The fortunes reader: fortunes split on "%" lines, every n-th to validation
// in file-name order; .dat indexes, .u8 links and off/ skipped; a missing
// directory names the path and the package. Windows of context + 1 bytes.
#include <telar/data/text.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <filesystem>
#include <fstream>
#include <string>

namespace {

namespace fs = std::filesystem;

void write(fs::path const& p, std::string const& text) {
  std::ofstream(p, std::ios::binary) << text;
}

} // namespace

TEST_CASE("load_fortunes splits fortunes deterministically", "[data][text]") {
  fs::path const dir = fs::temp_directory_path() / "telar_test_fortunes";
  fs::remove_all(dir);
  fs::create_directories(dir / "off");
  write(dir / "b", "b1\n%\nb2\nmore\n%\n");
  write(dir / "a", "a1\n%\na2\n%\n\n%\na3");
  write(dir / "a.dat", "binary index");
  write(dir / "a.u8", "x1\n%\n");
  write(dir / "off" / "c", "c1\n%\n");
  telar::TextSplit const s = telar::load_fortunes(dir.string(), 2);
  CHECK(s.files == 2);
  CHECK(s.fortunes == 5); // a1 a2 a3 b1 b2; the blank one is dropped
  CHECK(s.validation == "a1\n%\na3\n%\nb2\nmore\n%\n");
  CHECK(s.train == "a2\n%\nb1\n%\n");
  fs::remove_all(dir);
}

TEST_CASE("load_fortunes names a missing directory and the package", "[data][text]") {
  CHECK_THROWS_WITH(
      telar::load_fortunes("/nonexistent/fortunes"),
      Catch::Matchers::ContainsSubstring("/nonexistent/fortunes: no such directory") &&
          Catch::Matchers::ContainsSubstring("'fortunes' package"));
  CHECK_THROWS_AS(telar::load_fortunes("/nonexistent/fortunes", 1), telar::DataError);
}

TEST_CASE("TextWindows cuts inputs and next-byte targets", "[data][text]") {
  telar::TextWindows const w("abcdefg\xff", 3);
  REQUIRE(w.size() == 2); // windows "abcd" and "defg"; "g\xff" is too short
  float x[3];
  int y[3];
  w.window(1, x, y);
  CHECK(x[0] == float('d'));
  CHECK(x[2] == float('f'));
  CHECK(y[0] == 'e');
  CHECK(y[2] == 'g');
  telar::TextWindows const last("abcdefg\xff", 7);
  int yy[7];
  float xx[7];
  last.window(0, xx, yy);
  CHECK(yy[6] == 255); // bytes are unsigned token ids
  CHECK_THROWS_AS(telar::TextWindows("abc", 3), telar::DataError);
}

TEST_CASE("the installed fortunes load when present", "[data][text]") {
  std::string const dir = telar::default_fortunes_dir();
  if (!fs::exists(dir))
    SKIP("fortunes not installed in " << dir);
  telar::TextSplit const s = telar::load_fortunes(dir);
  CHECK(s.fortunes > 10000);
  CHECK(s.validation.size() * 10 < s.train.size());
  CHECK(s.validation.size() * 40 > s.train.size());
}

TEST_CASE("escape_for_terminal keeps text and UTF-8, escapes the rest", "[data][text]") {
  using telar::escape_for_terminal;
  CHECK(escape_for_terminal("The cat\n\tsat.") == "The cat\n\tsat.");
  CHECK(escape_for_terminal("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") ==
        "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"); // é, €, an emoji: kept
  CHECK(escape_for_terminal(std::string("a\x1b[2Jb\x00"
                                        "c\x7f",
                                        9)) == "a\\x1b[2Jb\\x00c\\x7f");
  CHECK(escape_for_terminal("back\\slash") == "back\\\\slash");
  // A stray continuation byte, a truncated sequence, an overlong '/', a
  // surrogate, a C1 control (U+009B, CSI) and a byte never in UTF-8.
  CHECK(escape_for_terminal("\x80") == "\\x80");
  CHECK(escape_for_terminal("\xe2\x82") == "\\xe2\\x82");
  CHECK(escape_for_terminal("\xc0\xaf") == "\\xc0\\xaf");
  CHECK(escape_for_terminal("\xed\xa0\x80") == "\\xed\\xa0\\x80");
  CHECK(escape_for_terminal("\xc2\x9b") == "\\xc2\\x9b");
  CHECK(escape_for_terminal("\xff") == "\\xff");
}
