// What telar/schedule/svg.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/schedule/svg.hpp>

namespace telar::schedule {

TELAR_DECL void write_svg(Timeline const& tl, std::ostream& os, SvgOptions const& opt) {
  using detail::fmt;
  TimelineStats const st = analyze(tl);
  int const rows = std::max(st.ranks, 1);
  int chunks = 1;
  for (auto const& e : tl.events)
    chunks = std::max(chunks, e.chunk + 1);
  double const range = st.makespan > 0 ? st.makespan : 1.0;
  double const left = 72, top = 46, right = 24;
  double const row = opt.row_height, box_h = row - 6;
  double const scale = opt.width / range;
  double const axis_y = top + rows * row + 4;
  double const legend_y = axis_y + 40;
  double const total_w = left + opt.width + right;
  double const total_h = legend_y + 30;
  auto x_of = [&](double t) { return left + (t - st.start) * scale; };

  std::string title = opt.title;
  if (title.empty())
    title = (tl.name.empty() ? std::string("schedule") : tl.name) + " - " + std::to_string(rows) +
            (rows == 1 ? " rank" : " ranks") + " - bubble fraction " +
            fmt(100.0 * st.bubble_fraction, 1) +
            "% (iterations overlapped: " + fmt(100.0 * st.period_bubble_fraction, 1) + "%)";

  os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
     << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << fmt(total_w) << "\" height=\""
     << fmt(total_h) << "\" viewBox=\"0 0 " << fmt(total_w) << ' ' << fmt(total_h)
     << "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
     << "<rect class=\"background\" x=\"0\" y=\"0\" width=\"" << fmt(total_w) << "\" height=\""
     << fmt(total_h) << "\" fill=\"#ffffff\"/>\n"
     << "<text class=\"title\" x=\"" << fmt(left) << "\" y=\"26\" font-size=\"15\" "
     << "font-weight=\"bold\">" << detail::xml_escape(title) << "</text>\n";

  for (int r = 0; r < rows; ++r) {
    double const y = top + r * row;
    os << "<rect class=\"row\" x=\"" << fmt(left) << "\" y=\"" << fmt(y) << "\" width=\""
       << fmt(opt.width) << "\" height=\"" << fmt(row) << "\" fill=\""
       << (r % 2 ? "#f4f4f4" : "#fbfbfb") << "\"/>\n"
       << "<text class=\"rank\" x=\"" << fmt(left - 8) << "\" y=\"" << fmt(y + row / 2 + 4)
       << "\" text-anchor=\"end\">rank " << r << "</text>\n";
  }

  std::vector<char> seen(static_cast<int>(Op::OptimizerStep) + 2, 0); // ops, then "comm"
  for (auto const& e : tl.events) {
    bool const comm = !is_compute(e.op);
    if (e.rank < 0 || !(e.duration() > 0) || (comm && !opt.show_communication))
      continue;
    seen[comm ? seen.size() - 1 : static_cast<std::size_t>(e.op)] = 1;
    double const x = x_of(e.start), w = e.duration() * scale;
    double const y = top + e.rank * row + 3;
    double const h = comm ? box_h / 3 : box_h; // waits drawn thin, below the work
    double const yy = comm ? y + box_h - h : y;
    double const shade = chunks > 1 ? 0.5 * e.chunk / (chunks - 1) : 0.0;
    os << "<rect class=\"box " << short_name(e.op) << "\" x=\"" << fmt(x) << "\" y=\"" << fmt(yy)
       << "\" width=\"" << fmt(w) << "\" height=\"" << fmt(h) << "\" fill=\""
       << detail::lighten(detail::op_colour(e.op), shade)
       << "\" stroke=\"#ffffff\" stroke-width=\"0.5\"><title>" << name(e.op);
    if (e.microbatch >= 0)
      os << " micro-batch " << e.microbatch << " chunk " << e.chunk;
    os << " on rank " << e.rank << ": " << fmt(e.start, 4) << " to " << fmt(e.end, 4)
       << "</title></rect>\n";
    if (opt.show_labels && !comm && e.microbatch >= 0) {
      std::string const label = std::to_string(e.microbatch);
      double const font = std::min(11.0, box_h * 0.6);
      if (w >= 0.62 * font * static_cast<double>(label.size()) + 2)
        os << "<text class=\"label\" x=\"" << fmt(x + w / 2) << "\" y=\""
           << fmt(y + box_h / 2 + font * 0.36) << "\" font-size=\"" << fmt(font)
           << "\" text-anchor=\"middle\" fill=\"#ffffff\">" << label << "</text>\n";
    }
  }

  // Time axis.
  os << "<line class=\"axis\" x1=\"" << fmt(left) << "\" y1=\"" << fmt(axis_y) << "\" x2=\""
     << fmt(left + opt.width) << "\" y2=\"" << fmt(axis_y) << "\" stroke=\"#333333\"/>\n";
  double const step = detail::tick_step(range, 10);
  for (int i = 0; i * step <= range * (1 + 1e-9); ++i) {
    double const x = left + i * step * scale;
    os << "<line class=\"tick\" x1=\"" << fmt(x) << "\" y1=\"" << fmt(axis_y) << "\" x2=\""
       << fmt(x) << "\" y2=\"" << fmt(axis_y + 5) << "\" stroke=\"#333333\"/>\n"
       << "<text class=\"tick\" x=\"" << fmt(x) << "\" y=\"" << fmt(axis_y + 18)
       << "\" text-anchor=\"middle\" font-size=\"10\">" << fmt(i * step, 4) << "</text>\n";
  }
  os << "<text class=\"axis-label\" x=\"" << fmt(left - 8) << "\" y=\"" << fmt(axis_y + 18)
     << "\" text-anchor=\"end\" font-size=\"10\">time</text>\n";

  // Legend: only what the chart shows.
  double lx = left;
  for (std::size_t k = 0; k < seen.size(); ++k) {
    if (!seen[k])
      continue;
    Op const op = k + 1 == seen.size() ? Op::RecvActivation : static_cast<Op>(k);
    std::string const text = detail::op_legend(op);
    os << "<rect class=\"legend\" x=\"" << fmt(lx) << "\" y=\"" << fmt(legend_y - 10)
       << "\" width=\"12\" height=\"12\" fill=\"" << detail::op_colour(op) << "\"/>\n"
       << "<text class=\"legend\" x=\"" << fmt(lx + 16) << "\" y=\"" << fmt(legend_y) << "\">"
       << detail::xml_escape(text) << "</text>\n";
    lx += 30 + 6.5 * static_cast<double>(text.size());
  }
  if (chunks > 1)
    os << "<text class=\"legend\" x=\"" << fmt(lx) << "\" y=\"" << fmt(legend_y)
       << "\">(lighter: later model chunk)</text>\n";
  os << "</svg>\n";
}

TELAR_DECL void write_svg(Timeline const& tl, std::string const& path, SvgOptions const& opt) {
  std::ofstream file(path);
  if (!file)
    throw std::runtime_error("telar::schedule::write_svg: cannot open \"" + path +
                             "\" for writing");
  write_svg(tl, file, opt);
  file.close();
  if (!file)
    throw std::runtime_error("telar::schedule::write_svg: writing \"" + path + "\" failed");
}

} // namespace telar::schedule
