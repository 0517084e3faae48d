#pragma once
/*! \file
 *  \brief telar::HaloExchange: the boundary rows of a tensor split along one
 *  axis over a communicator, sent to the neighbour ranks with nonblocking MPI
 *  (post, compute, finish), and the reverse exchange that adds halo
 *  gradients back to the rows' owners.
 *
 *  Rank r of the communicator owns rows [begin_r, end_r) of the split axis;
 *  rank r - 1 holds the rows before, rank r + 1 those after (no wrap-around).
 *  A telar::HaloPlan says how many rows go each way; telar::conv_halo_plan
 *  (telar/parallel/spatial_decomposition.hpp) computes it for a convolution.
 */
#include <telar/comm/communicator.hpp>
#include <telar/comm/detail/halo_rows.hpp>
#include <telar/comm/halo_plan.hpp>
#include <telar/comm/request.hpp>
#include <telar/core/tensor.hpp>
#include <telar/profile/trace.hpp>

#include <Kokkos_Core.hpp>

#include <chrono>
#include <cstddef>
#include <type_traits>
#include <vector>

namespace telar {

/*! \brief What this process's halo exchanges did since the counters were
 *  last reset (telar::halo_tally(); reset by assigning `{}`): for halo
 *  figures (docs/spatial.md), not for control. */
struct HaloTally {
  std::size_t exchanges = 0;  //!< exchanges posted (forward and reverse)
  std::size_t bytes_sent = 0; //!< bytes this rank sent to its neighbours
  double window_s = 0;        //!< seconds between post returning and finish being called
  double exposed_s = 0;       //!< seconds finish waited for messages (the exposed halo time)
};

/*! \brief The process's telar::HaloTally (one per process: the exchanges of
 *  every layer add to it). */
inline HaloTally& halo_tally() {
  static HaloTally t;
  return t;
}

/*! \brief Where slabs (and their halos) live: the default memory space
 *  when the host can read it, else host memory (halo buffers are read by
 *  MPI directly; device staging is not implemented, so a device build runs
 *  spatial layers on the host). */
using SlabMemorySpace = std::conditional_t<
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, DefaultMemorySpace>::accessible,
    DefaultMemorySpace, Kokkos::HostSpace>;
/*! \brief The execution space that runs on telar::SlabMemorySpace. */
using SlabExecutionSpace =
    std::conditional_t<std::is_same_v<SlabMemorySpace, DefaultMemorySpace>,
                       Kokkos::DefaultExecutionSpace, Kokkos::DefaultHostExecutionSpace>;

/*! \brief Exchanges the halo rows of tensors [n, C * rows * plane] split
 *  along rows over a communicator: post() starts the messages, the caller
 *  computes what needs no halo, finish() completes them.
 *
 *  Forward: post() packs the rows the neighbours need, starts the sends and
 *  receives, and copies the kept local rows into the extended slab while the
 *  messages travel; finish() waits (bounded by the communicator's timeout)
 *  and places the received rows. Reverse (for gradients): post_reverse()
 *  sends the gradient of the halo rows of an extended slab back to their
 *  owners and writes the gradient of the kept local rows; finish_reverse()
 *  adds what the neighbours sent. One exchange in flight per object.
 *  \code
 *  telar::HaloExchange<double> halo(sp_comm);
 *  halo.post(exec, plan, x.data(), n * C, H * W, ext.data());
 *  // ... work that does not read the halo rows ...
 *  halo.finish(exec);
 *  \endcode
 *  \tparam T value type
 *  \tparam MemorySpace where the tensors live (host-accessible: MPI reads the
 *  buffers directly) */
template <class T, class MemorySpace = DefaultMemorySpace>
class HaloExchange {
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible,
                "telar::HaloExchange: the memory space must be host-accessible (device "
                "staging is not implemented yet)");

public:
  /*! \brief Exchanges over \p comm (the spatial group; kept by reference,
   *  it must outlive this object). \param comm the communicator
   *  \param tag first of the two message tags used */
  explicit HaloExchange(Communicator const& comm, int tag = 7100) : comm_(&comm), tag_(tag) {}

  /*! \brief Records each exchange on \p trace (null: none): "halo wait",
   *  the time finish waited (lane 0, inside the caller's span), and "halo",
   *  from the post's messages leaving to the end of that wait (lane 1).
   *  \param trace the rank's recorder, kept by pointer */
  void set_trace(TraceRecorder* trace) { trace_ = trace; }

  /*! \brief Starts the forward exchange of the local slab \p x into the
   *  extended slab \p ext. \param exec execution space instance
   *  \param plan rows exchanged \param x local slab, `outer` blocks of
   *  plan.rows rows \param outer blocks (samples times channels)
   *  \param plane elements per row \param ext extended slab, `outer` blocks of
   *  plan.extended_rows() rows */
  template <class Exec>
  void post(Exec const& exec, HaloPlan const& plan, T const* x, std::size_t outer,
            std::size_t plane, T* ext) {
    start(plan, outer, plane, ext);
    std::size_t const R = plan.rows, E = plan.extended_rows();
    detail::copy_rows<T>(exec, {x, R, 0}, {send_lo_.data(), plan.send_lo, 0}, plan.send_lo, outer,
                         plane, false);
    detail::copy_rows<T>(exec, {x, R, R - plan.send_hi}, {send_hi_.data(), plan.send_hi, 0},
                         plan.send_hi, outer, plane, false);
    exec.fence(); // the send buffers must be complete before MPI reads them
    exchange(plan.send_lo, plan.send_hi, plan.recv_lo, plan.recv_hi);
    detail::copy_rows<T>(exec, {x, R, plan.own_begin}, {ext, E, plan.recv_lo},
                         plan.own_end - plan.own_begin, outer, plane, false);
    mark_posted();
  }

  /*! \brief Completes post(): waits and places the received rows.
   *  \param exec execution space instance */
  template <class Exec>
  void finish(Exec const& exec) {
    wait();
    HaloPlan const& p = plan_;
    std::size_t const E = p.extended_rows();
    detail::copy_rows<T>(exec, {recv_lo_.data(), p.recv_lo, 0}, {ext_, E, 0}, p.recv_lo, outer_,
                         plane_, false);
    detail::copy_rows<T>(exec, {recv_hi_.data(), p.recv_hi, 0}, {ext_, E, E - p.recv_hi}, p.recv_hi,
                         outer_, plane_, false);
  }

  /*! \brief Starts the reverse exchange: the gradient \p dext of an extended
   *  slab goes back to the rows' owners; \p dx gets the gradient of the kept
   *  local rows (zero for the others) until finish_reverse() adds the rest.
   *  \param exec execution space instance \param plan rows exchanged (the
   *  forward plan) \param dext gradient of the extended slab \param outer
   *  blocks \param plane elements per row \param dx gradient of the local slab */
  template <class Exec>
  void post_reverse(Exec const& exec, HaloPlan const& plan, T const* dext, std::size_t outer,
                    std::size_t plane, T* dx) {
    start(plan, outer, plane, dx);
    std::size_t const R = plan.rows, E = plan.extended_rows();
    // The halo rows travel back the way they came: the send buffers of the
    // forward exchange receive, its receive buffers send.
    detail::copy_rows<T>(exec, {dext, E, 0}, {recv_lo_.data(), plan.recv_lo, 0}, plan.recv_lo,
                         outer, plane, false);
    detail::copy_rows<T>(exec, {dext, E, E - plan.recv_hi}, {recv_hi_.data(), plan.recv_hi, 0},
                         plan.recv_hi, outer, plane, false);
    exec.fence();
    exchange(plan.recv_lo, plan.recv_hi, plan.send_lo, plan.send_hi, true);
    detail::zero_rows<T>(exec, {dx, R, 0}, plan.own_begin, outer, plane);
    detail::copy_rows<T>(exec, {dext, E, plan.recv_lo}, {dx, R, plan.own_begin},
                         plan.own_end - plan.own_begin, outer, plane, false);
    detail::zero_rows<T>(exec, {dx, R, plan.own_end}, R - plan.own_end, outer, plane);
    mark_posted();
  }

  /*! \brief Completes post_reverse(): adds the neighbours' halo gradients to
   *  the local rows they read. \param exec execution space instance */
  template <class Exec>
  void finish_reverse(Exec const& exec) {
    wait();
    HaloPlan const& p = plan_;
    detail::copy_rows<T>(exec, {send_lo_.data(), p.send_lo, 0}, {ext_, p.rows, 0}, p.send_lo,
                         outer_, plane_, true);
    detail::copy_rows<T>(exec, {send_hi_.data(), p.send_hi, 0}, {ext_, p.rows, p.rows - p.send_hi},
                         p.send_hi, outer_, plane_, true);
  }

private:
  using Buffer = Kokkos::View<T*, MemorySpace>;
  using Clock = std::chrono::steady_clock;

  // Remembers the call and sizes the four buffers.
  void start(HaloPlan const& plan, std::size_t outer, std::size_t plane, T* target) {
    plan_ = plan, outer_ = outer, plane_ = plane, ext_ = target;
    fit(send_lo_, plan.send_lo), fit(send_hi_, plan.send_hi);
    fit(recv_lo_, plan.recv_lo), fit(recv_hi_, plan.recv_hi);
  }
  void fit(Buffer& b, std::size_t rows) const {
    std::size_t const size = rows * outer_ * plane_;
    if (b.extent(0) < size)
      b = Buffer(Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::HaloExchange::buffer"),
                 size);
  }

  // Sends `out_lo` rows to rank - 1 and `out_hi` to rank + 1, receives
  // `in_lo` from rank - 1 and `in_hi` from rank + 1 (forward: out = send_*,
  // in = recv_*; reverse: the other way round, into the other buffers).
  void exchange(std::size_t out_lo, std::size_t out_hi, std::size_t in_lo, std::size_t in_hi,
                bool reverse = false) {
    Buffer& so_lo = reverse ? recv_lo_ : send_lo_;
    Buffer& so_hi = reverse ? recv_hi_ : send_hi_;
    Buffer& si_lo = reverse ? send_lo_ : recv_lo_;
    Buffer& si_hi = reverse ? send_hi_ : recv_hi_;
    int const r = comm_->rank(), down = tag_, up = tag_ + 1;
    std::size_t const block = outer_ * plane_;
    HaloTally& tally = halo_tally();
    ++tally.exchanges;
    tally.bytes_sent += (out_lo + out_hi) * block * sizeof(T);
    // Tag `down` travels to rank - 1, tag `up` to rank + 1.
    if (in_lo > 0)
      reqs_.push_back(comm_->irecv(si_lo.data(), in_lo * block, r - 1, up));
    if (in_hi > 0)
      reqs_.push_back(comm_->irecv(si_hi.data(), in_hi * block, r + 1, down));
    if (out_lo > 0)
      reqs_.push_back(comm_->isend(so_lo.data(), out_lo * block, r - 1, down));
    if (out_hi > 0)
      reqs_.push_back(comm_->isend(so_hi.data(), out_hi * block, r + 1, up));
  }
  void mark_posted() {
    posted_ = Clock::now();
    if (trace_)
      posted_at_ = trace_->now();
  }
  void wait() {
    auto const t0 = Clock::now();
    double const began = trace_ ? trace_->now() : 0;
    wait_all(reqs_);
    reqs_.clear();
    HaloTally& tally = halo_tally();
    tally.window_s += std::chrono::duration<double>(t0 - posted_).count();
    tally.exposed_s += std::chrono::duration<double>(Clock::now() - t0).count();
    if (trace_) {
      double const done = trace_->now();
      trace_->add("halo wait", "comm", began, done, 0);
      trace_->add("halo", "comm", posted_at_, done, 1);
    }
  }

  Communicator const* comm_;
  int tag_;
  HaloPlan plan_{};
  std::size_t outer_ = 0, plane_ = 0;
  T* ext_ = nullptr;
  Buffer send_lo_, send_hi_, recv_lo_, recv_hi_;
  std::vector<Request> reqs_;
  Clock::time_point posted_{}; // when post returned (the window's start)
  TraceRecorder* trace_ = nullptr;
  double posted_at_ = 0; // posted_ on trace_'s clock
};

} // namespace telar
