#pragma once

#include <cmath>
#include <cstdio>
#include <locale>
#include <sstream>
#include <string>

namespace telar::schedule::detail {

//! Fixed-point number with at most `digits` decimals and no trailing zeros; independent of the
//! global locale, so SVG coordinates always use '.'.
inline std::string fmt(double x, int digits = 2) {
  std::ostringstream os;
  os.imbue(std::locale::classic());
  os.setf(std::ios::fixed);
  os.precision(digits);
  os << (std::abs(x) < 0.5 * std::pow(10.0, -digits) ? 0.0 : x);
  std::string s = os.str();
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0')
      s.pop_back();
    if (s.back() == '.')
      s.pop_back();
  }
  return s;
}

//! Escapes the five XML special characters.
inline std::string xml_escape(std::string const& in) {
  std::string out;
  out.reserve(in.size());
  for (char c : in) {
    char const* const entity = c == '&'    ? "&amp;"
                               : c == '<'  ? "&lt;"
                               : c == '>'  ? "&gt;"
                               : c == '"'  ? "&quot;"
                               : c == '\'' ? "&apos;"
                                           : nullptr;
    if (entity != nullptr)
      out += entity;
    else
      out += c;
  }
  return out;
}

//! Mixes colour "#rrggbb" with white; `t` = 0 keeps it, 1 gives white.
inline std::string lighten(char const* hex, double t) {
  unsigned rgb = 0;
  std::sscanf(hex + 1, "%6x", &rgb);
  auto mix = [t](unsigned c) { return static_cast<unsigned>(std::lround(c + (255.0 - c) * t)); };
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", mix((rgb >> 16) & 255u), mix((rgb >> 8) & 255u),
                mix(rgb & 255u));
  return buf;
}

} // namespace telar::schedule::detail
