#pragma once
/*! \file
 *  \brief Byte-level text for language models: telar::load_fortunes reads
 *  the fortune files of Debian's `fortunes` package (fortunes separated by
 *  lines holding only `%`) and splits them deterministically into training
 *  and validation text; telar::TextWindows cuts a text into windows of
 *  context + 1 bytes (inputs and next-byte targets).
 *
 *  \code
 *  telar::TextSplit text = telar::load_fortunes(telar::default_fortunes_dir());
 *  telar::TextWindows train(text.train, 128);       // windows of 129 bytes
 *  std::vector<float> x(128); std::vector<int> y(128);
 *  train.window(0, x.data(), y.data());             // y[i] = x[i + 1], as bytes
 *  \endcode
 */
#include <telar/data/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <vector>

namespace telar {

/*! \brief Byte-level vocabulary: every byte value is a token. */
constexpr std::size_t byte_vocab = 256;

/*! \brief $TELAR_FORTUNES_DIR, else Debian's /usr/share/games/fortunes. */
inline std::string default_fortunes_dir() {
  char const* env = std::getenv("TELAR_FORTUNES_DIR");
  return env != nullptr && *env != 0 ? env : "/usr/share/games/fortunes";
}

/*! \brief Training and validation text, fortunes joined by "%\n". */
struct TextSplit {
  std::string train;        //!< every fortune but each n-th
  std::string validation;   //!< each n-th fortune (the 0th, n-th, 2n-th, ...)
  std::size_t fortunes = 0; //!< fortunes read
  std::size_t files = 0;    //!< files read
};

namespace detail {

// The fortune files of a directory, sorted: regular files without a dot in
// their name (skips the .dat indexes, the .u8 links and the off/ directory).
inline std::vector<std::string> fortune_files(std::string const& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr)
    throw DataError("telar::load_fortunes: " + dir +
                    ": no such directory (install Debian's 'fortunes' package, or set "
                    "TELAR_FORTUNES_DIR / --data)");
  std::vector<std::string> out;
  for (dirent* e = readdir(d); e != nullptr; e = readdir(d)) {
    std::string const name = e->d_name;
    struct stat st {};
    if (name.find('.') != std::string::npos || stat((dir + "/" + name).c_str(), &st) != 0 ||
        !S_ISREG(st.st_mode))
      continue;
    out.push_back(dir + "/" + name);
  }
  closedir(d);
  std::sort(out.begin(), out.end()); // readdir's order is the file system's
  return out;
}

} // namespace detail

/*! \brief Reads every fortune file of \p dir and puts every \p every-th
 *  fortune (in file-name order) into validation, the rest into training.
 *  \param dir the fortunes directory \param every validation stride (>= 2)
 *  \throws DataError naming the path when the directory is missing or holds no fortunes */
inline TextSplit load_fortunes(std::string const& dir, std::size_t every = 20) {
  if (every < 2)
    throw DataError("telar::load_fortunes: every must be at least 2, got " + std::to_string(every));
  TextSplit out;
  for (auto const& path : detail::fortune_files(dir)) {
    std::ifstream in(path, std::ios::binary);
    if (!in)
      throw DataError("telar::load_fortunes: cannot read " + path);
    ++out.files;
    std::string line, fortune;
    auto flush = [&] {
      if (fortune.find_first_not_of(" \t\n") != std::string::npos)
        (out.fortunes++ % every == 0 ? out.validation : out.train) += fortune + "%\n";
      fortune.clear();
    };
    while (std::getline(in, line)) {
      if (line == "%")
        flush();
      else
        fortune += line + "\n";
    }
    flush();
  }
  if (out.fortunes < every)
    throw DataError(
        "telar::load_fortunes: " + dir + ": " + std::to_string(out.fortunes) +
        " fortunes found, too few to split (is it the 'fortunes' package's directory?)");
  return out;
}

/*! \brief Non-overlapping windows of context + 1 bytes of a text: window i
 *  starts at byte i * context; its first context bytes are the input and the
 *  next context bytes (shifted by one) the targets. */
class TextWindows {
public:
  /*! \brief \param text the bytes \param context tokens per input
   *  \throws DataError when the text is shorter than one window */
  TextWindows(std::string text, std::size_t context) : text_(std::move(text)), context_(context) {
    if (context_ == 0 || text_.size() < context_ + 1)
      throw DataError("telar::TextWindows: a text of " + std::to_string(text_.size()) +
                      " bytes has no window of context " + std::to_string(context_) + " + 1");
  }
  /*! \brief Number of windows. */
  std::size_t size() const { return (text_.size() - 1) / context_; }
  /*! \brief Tokens per input. */
  std::size_t context() const { return context_; }
  /*! \brief The text. */
  std::string const& text() const { return text_; }
  /*! \brief Writes window \p i: x[p] = byte i * context + p, y[p] = the byte after it.
   *  \param i window \param x context token ids \param y context target ids */
  template <class X, class Y>
  void window(std::size_t i, X* x, Y* y) const {
    std::size_t const b = i * context_;
    for (std::size_t p = 0; p < context_; ++p) {
      x[p] = X(static_cast<unsigned char>(text_[b + p]));
      y[p] = Y(static_cast<unsigned char>(text_[b + p + 1]));
    }
  }

private:
  std::string text_;
  std::size_t context_;
};

namespace detail {

// The length of the well-formed UTF-8 sequence at s[i] that encodes a
// printable character (not U+0080 to U+009F, the C1 controls a terminal
// may act on), or 0: a stray continuation byte, a truncated, overlong or
// surrogate sequence, or a code point past U+10FFFF.
inline std::size_t printable_utf8_length(std::string const& s, std::size_t i) {
  auto const b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char const c = b(i);
  std::size_t const n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
  if (n == 0 || c > 0xF4 || i + n > s.size())
    return 0;
  unsigned code = c & (0x7F >> n);
  for (std::size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80)
      return 0;
    code = (code << 6) | (b(i + k) & 0x3F);
  }
  static unsigned const lowest[] = {0, 0, 0xA0, 0x800, 0x10000}; // no overlong forms
  if (code < lowest[n] || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF)
    return 0;
  return n;
}

} // namespace detail

/*! \brief \p text made safe to print on a terminal: control characters
 *  other than newline and tab, and bytes that are not part of well-formed
 *  UTF-8, become `\xNN`; a backslash becomes `\\`. A byte-level model's
 *  samples can hold any byte, and raw ones garble or reprogram the terminal
 *  (an escape sequence) or break a log's encoding.
 *  \param text any bytes \return printable UTF-8 */
inline std::string escape_for_terminal(std::string const& text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    unsigned char const c = static_cast<unsigned char>(text[i]);
    if (c == '\\') {
      out += "\\\\";
      ++i;
    } else if ((c >= 0x20 && c < 0x7F) || c == '\n' || c == '\t') {
      out += char(c);
      ++i;
    } else if (std::size_t const n = c >= 0x80 ? detail::printable_utf8_length(text, i) : 0) {
      out.append(text, i, n);
      i += n;
    } else {
      static char const hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
      ++i;
    }
  }
  return out;
}

} // namespace telar
