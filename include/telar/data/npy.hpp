#pragma once
/*! \file
 *  \brief NumPy's .npy files (format 1.0 to 3.0): telar::read_npy reads a
 *  C-ordered float32 or float64 array as float, telar::write_npy writes
 *  float32. What `numpy.save` and `numpy.load` exchange with Telar, e.g. the
 *  inputs and outputs of `onnx_train --predict`.
 */
#include <telar/data/error.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace telar {

/*! \brief An array read from a .npy file: its shape and its values in C
 *  order. */
struct NpyArray {
  std::vector<std::size_t> shape; //!< extents, outermost first ({} for a scalar)
  std::vector<float> values;      //!< the product of shape values, C order
};

namespace detail {

// The value of `key` in the header dict ("{'descr': '<f4', 'fortran_order':
// False, 'shape': (2, 3), }"), up to the next top-level comma or brace.
inline std::string npy_field(std::string const& header, std::string const& key) {
  std::size_t k = header.find("'" + key + "'");
  if (k == std::string::npos)
    return "";
  k = header.find(':', k);
  if (k == std::string::npos)
    return "";
  std::size_t e = k + 1;
  int depth = 0;
  for (; e < header.size(); ++e) {
    char const c = header[e];
    if (c == '(')
      ++depth;
    else if (c == ')')
      --depth;
    else if ((c == ',' || c == '}') && depth == 0)
      break;
  }
  std::string v = header.substr(k + 1, e - k - 1);
  std::size_t const b = v.find_first_not_of(" '"), l = v.find_last_not_of(" '");
  return b == std::string::npos ? "" : v.substr(b, l - b + 1);
}

inline std::vector<std::size_t> npy_shape(std::string const& text, std::string const& path) {
  if (text.size() < 2 || text.front() != '(' || text.back() != ')')
    throw DataError("telar::read_npy: '" + path + "': shape '" + text + "' is not a tuple");
  std::vector<std::size_t> shape;
  std::size_t i = 1;
  while (i + 1 < text.size()) {
    std::string const rest = text.substr(i, text.size() - 1 - i);
    if (rest.find_first_not_of(" ,") == std::string::npos)
      break;
    char* end = nullptr;
    unsigned long long const e = std::strtoull(rest.c_str(), &end, 10);
    std::size_t const used = std::size_t(end - rest.c_str());
    if (used == 0)
      throw DataError("telar::read_npy: '" + path + "': shape '" + text + "' is not a tuple");
    shape.push_back(std::size_t(e));
    i += used;
    while (i + 1 < text.size() && (text[i] == ',' || text[i] == ' '))
      ++i;
  }
  return shape;
}

} // namespace detail

/*! \brief Reads a .npy file of float32 ('<f4') or float64 ('<f8', converted)
 *  values in C order. \param path the file
 *  \throws DataError naming the file and what is wrong (missing, not .npy,
 *  another type, Fortran order, truncated) */
inline NpyArray read_npy(std::string const& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw DataError("telar::read_npy: cannot open '" + path + "'");
  char magic[8] = {};
  in.read(magic, 8);
  if (!in || std::memcmp(magic, "\x93NUMPY", 6) != 0 || magic[6] < 1 || magic[6] > 3)
    throw DataError("telar::read_npy: '" + path + "' is not a .npy file (format 1.0 to 3.0)");
  std::uint32_t len = 0;
  unsigned char b[4] = {};
  in.read(reinterpret_cast<char*>(b), magic[6] == 1 ? 2 : 4);
  len = std::uint32_t(b[0]) | std::uint32_t(b[1]) << 8 | std::uint32_t(b[2]) << 16 |
        std::uint32_t(b[3]) << 24;
  std::string header(len, '\0');
  in.read(header.data(), std::streamsize(len));
  if (!in)
    throw DataError("telar::read_npy: '" + path + "': truncated header");
  std::string const descr = detail::npy_field(header, "descr");
  if (descr != "<f4" && descr != "<f8")
    throw DataError("telar::read_npy: '" + path + "' holds '" + descr +
                    "' values; float32 ('<f4') or float64 ('<f8') expected");
  if (detail::npy_field(header, "fortran_order") != "False")
    throw DataError("telar::read_npy: '" + path + "' is in Fortran order; C order expected");
  NpyArray a;
  a.shape = detail::npy_shape(detail::npy_field(header, "shape"), path);
  std::size_t n = 1;
  for (std::size_t e : a.shape)
    n *= e;
  a.values.resize(n);
  if (descr == "<f4") {
    in.read(reinterpret_cast<char*>(a.values.data()), std::streamsize(n * sizeof(float)));
  } else {
    std::vector<double> d(n);
    in.read(reinterpret_cast<char*>(d.data()), std::streamsize(n * sizeof(double)));
    for (std::size_t i = 0; i < n; ++i)
      a.values[i] = float(d[i]);
  }
  if (!in)
    throw DataError("telar::read_npy: '" + path + "': truncated: fewer than the " +
                    std::to_string(n) + " values its shape holds");
  return a;
}

/*! \brief Writes \p values (C order) as a float32 .npy file of \p shape.
 *  \param path the file \param shape extents \param values their product of values
 *  \throws DataError when the file cannot be written or the sizes differ */
inline void write_npy(std::string const& path, std::vector<std::size_t> const& shape,
                      std::vector<float> const& values) {
  std::size_t n = 1;
  std::string dims;
  for (std::size_t e : shape) {
    n *= e;
    dims += std::to_string(e) + ", ";
  }
  if (n != values.size())
    throw DataError("telar::write_npy: '" + path + "': " + std::to_string(values.size()) +
                    " values for a shape of " + std::to_string(n));
  if (shape.size() != 1 && !dims.empty())
    dims.pop_back(), dims.pop_back(); // "(2, 3)"; a 1-D shape keeps its comma: "(4,)"
  else if (shape.size() == 1)
    dims.pop_back();
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic, version, length and header padded with spaces to a multiple of 64, then '\n'.
  std::size_t const total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  std::uint16_t const len = std::uint16_t(header.size());
  char const pre[10] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0, char(len & 0xff), char(len >> 8)};
  out.write(pre, 10);
  out.write(header.data(), std::streamsize(header.size()));
  out.write(reinterpret_cast<char const*>(values.data()), std::streamsize(n * sizeof(float)));
  if (!out)
    throw DataError("telar::write_npy: cannot write '" + path + "'");
}

} // namespace telar
