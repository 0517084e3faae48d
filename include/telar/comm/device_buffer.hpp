#pragma once
/*! \file
 *  \brief telar::HostBuffer: a host-accessible pointer to a Kokkos::View's
 *         data for MPI, staging through a host mirror when needed.
 */

#include <telar/config.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace telar {

/*! \brief Gives MPI a pointer to the data of a contiguous Kokkos::View.
 *
 *  If the view's memory is host-accessible, or \p DevicePointers is true
 *  (by default when Telar was configured with `TELAR_ENABLE_GPU_AWARE_MPI`),
 *  data() is the view's own pointer and no copy happens. Otherwise a host
 *  mirror is allocated; the constructor copies the view into it (unless told
 *  not to) and copy_back() copies it back.
 *
 *  The default suits point-to-point transfers and MPI's own collectives, where
 *  a GPU-aware MPI reads and writes device memory itself. Telar's
 *  point-to-point allreduce algorithms also add on the host: buffers for them
 *  are telar::AllreduceBuffer (telar/comm/allreduce.hpp), which stages device
 *  memory whatever MPI can do.
 *
 *  \code
 *  telar::HostBuffer<decltype(act)> out(act);                // copy in
 *  comm.send(out.data(), out.size(), next);
 *  telar::HostBuffer<decltype(act)> in(act, false);          // receive only
 *  comm.recv(in.data(), in.size(), prev);
 *  in.copy_back();                                           // copy out
 *  \endcode
 *  \tparam View a Kokkos::View with contiguous layout
 *  \tparam DevicePointers whether whoever uses data() accepts a pointer to
 *          memory the host cannot access
 */
template <class View, bool DevicePointers = TELAR_ENABLE_GPU_AWARE_MPI != 0>
class HostBuffer {
  static_assert(Kokkos::is_view<View>::value, "telar::HostBuffer: View must be a Kokkos::View");

public:
  /*! \brief Element type. */
  using value_type = typename View::value_type;
  /*! \brief True when no staging copy is needed for this view type. */
  static constexpr bool direct =
      DevicePointers ||
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename View::memory_space>::accessible;

  /*! \brief Wraps \p view; stages it on the host unless `direct`.
   *  \param view    contiguous view (kept by reference count)
   *  \param copy_in copy the view's values into the staging buffer (false for receive-only use)
   *  \throws std::invalid_argument if the view is not contiguous
   */
  explicit HostBuffer(View const& view, bool copy_in = true) : view_(view) {
    if (!view.span_is_contiguous())
      throw std::invalid_argument("telar::HostBuffer: the view must be contiguous");
    if constexpr (!direct) {
      mirror_ = Kokkos::create_mirror_view(view_);
      if (copy_in)
        Kokkos::deep_copy(mirror_, view_);
    }
  }

  /*! \brief Host-accessible pointer to the view's elements (or their copy). */
  value_type* data() const {
    if constexpr (direct)
      return view_.data();
    else
      return mirror_.data();
  }
  /*! \brief Number of elements. */
  std::size_t size() const { return view_.span(); }

  /*! \brief Copies the staged values back into the view (no-op when `direct`). */
  void copy_back() const {
    if constexpr (!direct)
      Kokkos::deep_copy(view_, mirror_);
  }

private:
  // The mirror type, spelled without View::HostMirror (renamed in Kokkos 4).
  using mirror_type = decltype(Kokkos::create_mirror_view(std::declval<View const&>()));

  View view_;
  mirror_type mirror_;
};

} // namespace telar
