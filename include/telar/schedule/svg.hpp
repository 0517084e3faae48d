#pragma once

#include <telar/core/detail/decl.hpp>
#include <telar/schedule/detail/format.hpp>
#include <telar/schedule/detail/svg_style.hpp>
#include <telar/schedule/timeline.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

/*! \file
    \brief Gantt charts of a Timeline as SVG. */

namespace telar::schedule {

/*! \brief Appearance of write_svg() charts. */
struct SvgOptions {
  std::string title;              //!< chart title; empty: schedule name, ranks and bubble fraction
  double width = 960.0;           //!< width of the time area, in pixels
  double row_height = 26.0;       //!< height of one rank's row, in pixels
  bool show_communication = true; //!< draw Send/Recv events of positive duration (waits)
  bool show_labels = true;        //!< write the micro-batch number into boxes wide enough for it
};

/*! \brief Writes an SVG Gantt chart of `tl`: one row per rank, one box per event of positive
    duration, coloured by op (Forward, BackwardInput, BackwardWeight, fused Backward, optimizer,
    communication waits; later chunks lighter) and labelled with the micro-batch number, a time
    axis, a legend, and a title with the schedule name and bubble fraction (see analyze()).

    Boxes are `<rect class="box ...">` elements, each with a `<title>` tooltip; zero-length events
    (sends, free optimizer steps) are not drawn. */
TELAR_DECL void write_svg(Timeline const& tl, std::ostream& os, SvgOptions const& opt = {});

/*! \brief write_svg() into the file `path`.
    \throws std::runtime_error if the file cannot be written. */
TELAR_DECL void write_svg(Timeline const& tl, std::string const& path, SvgOptions const& opt = {});

} // namespace telar::schedule

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/schedule/svg.ipp>
#endif
