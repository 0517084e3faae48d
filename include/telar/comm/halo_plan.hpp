#pragma once
/*! \file
 *  \brief telar::HaloPlan: the rows one rank of a split axis exchanges with
 *  its neighbours (plain integers, no MPI: the decomposition computes it,
 *  telar::HaloExchange carries it out).
 */
#include <cstddef>

namespace telar {

/*! \brief Rows one rank exchanges with its neighbours along the split axis.
 *
 *  The local slab has `rows` rows; the extended slab (what a layer reads) is
 *  `recv_lo` rows from rank - 1, the local rows [own_begin, own_end), then
 *  `recv_hi` rows from rank + 1. The first `send_lo` local rows go to rank - 1
 *  and the last `send_hi` to rank + 1 (what those ranks receive). */
struct HaloPlan {
  std::size_t rows = 0;      //!< rows of the local slab
  std::size_t own_begin = 0; //!< first local row the extended slab keeps
  std::size_t own_end = 0;   //!< one past the last local row it keeps
  std::size_t recv_lo = 0;   //!< rows received from rank - 1 (before the local ones)
  std::size_t recv_hi = 0;   //!< rows received from rank + 1 (after the local ones)
  std::size_t send_lo = 0;   //!< first local rows sent to rank - 1
  std::size_t send_hi = 0;   //!< last local rows sent to rank + 1

  /*! \brief Rows of the extended slab. */
  std::size_t extended_rows() const { return recv_lo + (own_end - own_begin) + recv_hi; }
  /*! \brief Rows sent and received in one exchange (0: nothing travels). */
  std::size_t exchanged_rows() const { return send_lo + send_hi + recv_lo + recv_hi; }
};

} // namespace telar
