#pragma once
/*! \file
 *  \brief telar::SharedWindow: memory that the ranks of one node read and
 *  write directly (an MPI-3 shared-memory window). */
#include <telar/comm/communicator.hpp>
#include <telar/comm/error.hpp>

#include <mpi.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace telar {

/*! \brief One segment per rank of a node communicator, each addressable by
 *  every rank of it. Lets data-parallel ranks on one node reduce gradients
 *  straight out of each other's buffers and share one copy of the
 *  parameters, with no message copies at all.
 *
 *  Collective to create and to destroy. Between writes on one rank and reads
 *  on another call fence() on every rank (a memory barrier plus a bounded
 *  barrier).
 */
class SharedWindow {
public:
  /*! \brief No window. */
  SharedWindow() = default;
  /*! \brief Allocates \p bytes on this rank (collective over \p node).
   *  \param node ranks that share memory (Communicator::split_shared())
   *  \param bytes this rank's segment size (may differ per rank; 0 allowed)
   *  \throws CommError if MPI cannot allocate the window */
  SharedWindow(Communicator const& node, std::size_t bytes) : node_(&node) {
    // Page-sized segments keep every rank's segment aligned.
    std::size_t const padded = (bytes + 4095) / 4096 * 4096;
    void* base = nullptr;
    check(MPI_Win_allocate_shared(MPI_Aint(padded), 1, MPI_INFO_NULL, node.native(), &base, &win_),
          "MPI_Win_allocate_shared");
    check(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_), "MPI_Win_lock_all");
    bases_.resize(std::size_t(node.size()));
    for (int r = 0; r < node.size(); ++r) {
      MPI_Aint size = 0;
      int disp = 0;
      check(MPI_Win_shared_query(win_, r, &size, &disp, &bases_[std::size_t(r)]),
            "MPI_Win_shared_query");
    }
  }
  SharedWindow(SharedWindow const&) = delete;
  SharedWindow& operator=(SharedWindow const&) = delete;
  /*! \brief Takes over \p other's window. \param other left empty */
  SharedWindow(SharedWindow&& other) noexcept { swap(other); }
  /*! \brief Frees this window (collective), then takes over \p other's.
   *  \param other left empty */
  SharedWindow& operator=(SharedWindow&& other) noexcept {
    SharedWindow(std::move(other)).swap(*this); // the temporary releases what this held
    return *this;
  }
  /*! \brief Frees the window (collective, like its creation). */
  ~SharedWindow() { release(); }

  /*! \brief Whether a window exists. */
  bool valid() const { return win_ != MPI_WIN_NULL; }
  /*! \brief Start of rank \p rank's segment, valid in this process.
   *  \param rank rank in the node communicator */
  void* base(int rank) const { return bases_.at(std::size_t(rank)); }
  /*! \brief Makes every rank's earlier writes visible to every rank's later
   *  reads: memory barrier, bounded barrier, memory barrier (collective). */
  void fence() const {
    MPI_Win_sync(win_);
    node_->barrier();
    MPI_Win_sync(win_);
  }

private:
  void check(int code, char const* op) const {
    if (code != MPI_SUCCESS)
      throw CommError("telar::SharedWindow: rank " + std::to_string(node_->rank()) + ": " + op +
                          " failed: " + detail::mpi_error_string(code),
                      node_->rank(), op, -1, code);
  }
  void release() noexcept {
    if (win_ == MPI_WIN_NULL || detail::mpi_finalized())
      return;
    MPI_Win_unlock_all(win_);
    MPI_Win_free(&win_);
    win_ = MPI_WIN_NULL;
  }
  void swap(SharedWindow& o) noexcept {
    std::swap(node_, o.node_);
    std::swap(win_, o.win_);
    std::swap(bases_, o.bases_);
  }

  Communicator const* node_ = nullptr;
  MPI_Win win_ = MPI_WIN_NULL;
  std::vector<void*> bases_;
};

} // namespace telar
