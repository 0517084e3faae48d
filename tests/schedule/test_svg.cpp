// SVG charts are well-formed XML with one box per drawn event.
#include <telar/schedule/generators.hpp>
#include <telar/schedule/simulate.hpp>
#include <telar/schedule/svg.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

using namespace telar::schedule;
using Catch::Matchers::ContainsSubstring;

namespace {

// A small XML well-formedness check: balanced, properly nested tags, quoted attributes, one
// root, and no stray '<' or '&' in text or attribute values. Returns "" or the first problem.
std::string xml_problem(std::string const& x) {
  std::vector<std::string> open;
  int roots = 0;
  auto bad_text = [](std::string const& t) -> bool {
    for (std::size_t i = 0; i < t.size(); ++i) {
      if (t[i] == '<')
        return true;
      if (t[i] == '&') {
        auto const semi = t.find(';', i);
        if (semi == std::string::npos || semi - i > 8)
          return true;
        std::string const ent = t.substr(i + 1, semi - i - 1);
        if (ent != "amp" && ent != "lt" && ent != "gt" && ent != "quot" && ent != "apos" &&
            ent.rfind("#", 0) != 0)
          return true;
      }
    }
    return false;
  };
  std::size_t i = 0;
  while (i < x.size()) {
    if (x[i] != '<') {
      auto const next = x.find('<', i);
      std::string const text = x.substr(i, next - i);
      if (bad_text(text))
        return "bad text: " + text;
      if (open.empty() && text.find_first_not_of(" \t\r\n") != std::string::npos)
        return "text outside the root";
      i = next == std::string::npos ? x.size() : next;
      continue;
    }
    if (x.compare(i, 5, "<?xml") == 0) {
      i = x.find("?>", i);
      if (i == std::string::npos)
        return "unterminated declaration";
      i += 2;
      continue;
    }
    auto const close = x.find('>', i);
    if (close == std::string::npos)
      return "unterminated tag";
    std::string tag = x.substr(i + 1, close - i - 1);
    i = close + 1;
    if (!tag.empty() && tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1))
        return "mismatched </" + tag.substr(1) + ">";
      open.pop_back();
      continue;
    }
    bool const self_closing = !tag.empty() && tag.back() == '/';
    if (self_closing)
      tag.pop_back();
    std::size_t k = 0;
    while (k < tag.size() && !std::isspace(static_cast<unsigned char>(tag[k])))
      ++k;
    std::string const name = tag.substr(0, k);
    if (name.empty())
      return "empty tag name";
    // attributes: name="value"
    while (k < tag.size()) {
      while (k < tag.size() && std::isspace(static_cast<unsigned char>(tag[k])))
        ++k;
      if (k == tag.size())
        break;
      auto const eq = tag.find('=', k);
      if (eq == std::string::npos || tag[eq + 1] != '"')
        return "unquoted attribute in <" + name + ">";
      auto const end = tag.find('"', eq + 2);
      if (end == std::string::npos)
        return "unterminated attribute in <" + name + ">";
      if (bad_text(tag.substr(eq + 2, end - eq - 2)))
        return "bad attribute value in <" + name + ">";
      k = end + 1;
    }
    if (open.empty())
      ++roots;
    if (!self_closing)
      open.push_back(name);
  }
  if (!open.empty())
    return "unclosed <" + open.back() + ">";
  return roots == 1 ? "" : "expected one root element";
}

std::size_t occurrences(std::string const& s, std::string const& what) {
  std::size_t n = 0;
  for (auto pos = s.find(what); pos != std::string::npos; pos = s.find(what, pos + 1))
    ++n;
  return n;
}

std::string svg_of(Timeline const& tl, SvgOptions const& opt = {}) {
  std::ostringstream os;
  write_svg(tl, os, opt);
  return os.str();
}

} // namespace

TEST_CASE("svg: the checker itself catches broken XML", "[schedule]") {
  CHECK(xml_problem("<svg><rect a=\"1\"/></svg>").empty());
  CHECK_FALSE(xml_problem("<svg><g></svg>").empty());
  CHECK_FALSE(xml_problem("<svg><rect a=1/></svg>").empty());
  CHECK_FALSE(xml_problem("<svg>a & b</svg>").empty());
  CHECK_FALSE(xml_problem("<svg/><svg/>").empty());
}

TEST_CASE("svg: well-formed chart with one box per event", "[schedule]") {
  for (auto const& s : {zb_h1(4, 8), one_f_one_b(3, 5), interleaved_1f1b(2, 4, 2), gpipe(1, 3)}) {
    INFO(s.name);
    auto const r = simulate(s, CostModel::uniform(1, 1, 1));
    std::size_t compute = 0, waits = 0;
    for (auto const& e : r.timeline.events) {
      if (is_compute(e.op) && e.duration() > 0)
        ++compute;
      if (!is_compute(e.op) && e.duration() > 0)
        ++waits;
    }
    int const per_mb = s.name.rfind("zb-", 0) == 0 ? 3 : 2;
    CHECK(compute == static_cast<std::size_t>(per_mb * s.stages * s.microbatches * s.chunks));

    SvgOptions plain;
    plain.show_communication = false;
    std::string const svg = svg_of(r.timeline, plain);
    INFO(svg.substr(0, 400));
    CHECK(xml_problem(svg).empty());
    CHECK(occurrences(svg, "<rect class=\"box ") == compute);
    CHECK(occurrences(svg, "<text class=\"rank\"") == static_cast<std::size_t>(s.stages));
    CHECK_THAT(svg, ContainsSubstring("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    CHECK_THAT(svg, ContainsSubstring(s.name + " - "));
    CHECK_THAT(svg, ContainsSubstring("bubble fraction " +
                                      detail::fmt(100.0 * r.bubble_fraction, 1) + "%"));
    CHECK_THAT(svg, ContainsSubstring("class=\"axis\""));
    CHECK_THAT(svg, ContainsSubstring("F: Forward"));

    std::string const with_comm = svg_of(r.timeline);
    CHECK(xml_problem(with_comm).empty());
    CHECK(occurrences(with_comm, "<rect class=\"box ") == compute + waits);
  }
}

TEST_CASE("svg: title, escaping and files", "[schedule]") {
  auto r = simulate(zb_h2(2, 3));
  r.timeline.name = "a<b & \"c\"";
  std::string const svg = svg_of(r.timeline);
  CHECK(xml_problem(svg).empty());
  CHECK_THAT(svg, ContainsSubstring("a&lt;b &amp; &quot;c&quot; - 2 ranks"));
  SvgOptions titled;
  titled.title = "custom";
  CHECK_THAT(svg_of(r.timeline, titled), ContainsSubstring(">custom</text>"));
  CHECK(xml_problem(svg_of(Timeline{})).empty()); // an empty run still draws

  std::string const path = "telar_test_schedule_chart.svg";
  write_svg(r.timeline, path);
  std::ifstream in(path);
  std::string const file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(file == svg);
  in.close();
  std::remove(path.c_str());
  CHECK_THROWS_AS(write_svg(r.timeline, std::string("/nonexistent-dir/x.svg")), std::runtime_error);
}
