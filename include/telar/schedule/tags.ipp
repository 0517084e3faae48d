// What telar/schedule/tags.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/schedule/tags.hpp>

namespace telar {
namespace detail {

TELAR_DECL std::string normalized(std::string s) {
  for (char& c : s)
    c = c == '_' ? '-' : char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

TELAR_DECL std::string known_names() {
  std::string known, also;
  auto underscored = [](std::string s) {
    for (char& c : s)
      c = c == '-' ? '_' : c;
    return s;
  };
  for_each_tag([&](auto tag) {
    known += (known.empty() ? "" : ", ") + std::string(tag.name());
    for (std::string const n : {std::string(tag.alias()), std::string(tag.name())})
      if (!n.empty() && underscored(n) != tag.name())
        also += (also.empty() ? "" : ", ") + underscored(n);
  });
  return known + "; also accepted: " + also + ", in any case";
}

} // namespace detail
} // namespace telar

namespace telar {
namespace schedule {

TELAR_DECL std::vector<std::string> schedule_names() {
  std::vector<std::string> out;
  telar::detail::for_each_tag([&](auto tag) { out.push_back(tag.name()); });
  return out;
}

TELAR_DECL std::string canonical_name(std::string const& name) {
  std::string const n = telar::detail::normalized(name);
  std::string found;
  telar::detail::for_each_tag([&](auto tag) {
    if (n == tag.name() || (*tag.alias() != 0 && n == tag.alias()))
      found = tag.name();
  });
  if (found.empty())
    throw std::invalid_argument("telar::schedule: unknown schedule \"" + name +
                                "\" (known: " + telar::detail::known_names() + ")");
  return found;
}

TELAR_DECL Schedule generate(std::string const& name, int p, int m, int v) {
  std::string const canonical = canonical_name(name);
  Schedule out;
  telar::detail::for_each_tag([&](auto tag) {
    if (canonical == tag.name())
      out = tag.make(p, m, v);
  });
  return out;
}

} // namespace schedule
} // namespace telar
