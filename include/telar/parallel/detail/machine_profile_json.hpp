#pragma once
// A flat JSON object of strings and numbers: what a machine profile is, so a
// profile can be written by hand and read without a JSON library.
#include <telar/core/error.hpp>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace telar::detail {

struct FlatJsonValue {
  bool is_number = false;
  double number = 0;
  std::string text;
};

class FlatJsonWriter {
public:
  FlatJsonWriter& text(std::string const& key, std::string const& v) {
    std::string quoted;
    for (char c : v)
      quoted += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
    return add(key, "\"" + quoted + "\"");
  }
  // 6 significant digits: rates and costs; more for a date in seconds.
  FlatJsonWriter& number(std::string const& key, double v, int digits = 6) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    return add(key, buf);
  }
  std::string str() const { return "{" + body_ + "}"; }

private:
  FlatJsonWriter& add(std::string const& key, std::string const& v) {
    body_ += (body_.empty() ? "\"" : ",\"") + key + "\":" + v;
    return *this;
  }
  std::string body_;
};

// {"key": "text" | number, ...}; nesting is an error (a profile is flat).
inline std::vector<std::pair<std::string, FlatJsonValue>> parse_flat_json(std::string const& s) {
  std::vector<std::pair<std::string, FlatJsonValue>> out;
  std::size_t i = 0;
  auto fail = [&](char const* what) -> void {
    throw Error(std::string("telar::MachineProfile: ") + what + " at character " +
                std::to_string(i));
  };
  auto skip = [&] {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i])))
      ++i;
  };
  auto string = [&] {
    std::string v;
    if (s[i] != '"')
      fail("expected a string");
    for (++i; i < s.size() && s[i] != '"'; ++i)
      v += s[i] == '\\' && i + 1 < s.size() ? s[++i] : s[i];
    if (i >= s.size())
      fail("unterminated string");
    ++i;
    return v;
  };
  skip();
  if (i >= s.size() || s[i] != '{')
    fail("expected '{'");
  ++i;
  skip();
  while (i < s.size() && s[i] != '}') {
    std::string const key = string();
    skip();
    if (i >= s.size() || s[i] != ':')
      fail("expected ':'");
    ++i;
    skip();
    FlatJsonValue v;
    if (i < s.size() && s[i] == '"')
      v.text = string();
    else {
      char* end = nullptr;
      v.number = std::strtod(s.c_str() + i, &end);
      if (end == s.c_str() + i)
        fail("expected a string or a number");
      v.is_number = true;
      i = std::size_t(end - s.c_str());
    }
    out.emplace_back(key, v);
    skip();
    if (i < s.size() && s[i] == ',') {
      ++i;
      skip();
    }
  }
  if (i >= s.size())
    fail("expected '}'");
  return out;
}

} // namespace telar::detail
