#pragma once
// A counter that every group's leader draws the next configuration from
// (MPI-3 passive-target fetch-and-add on world rank 0), so a group that is
// done with a configuration takes the next one nobody has started.
#include <telar/comm/communicator.hpp>
#include <telar/comm/error.hpp>

#include <mpi.h>

#include <string>

namespace telar::detail {

class WorkCounter {
public:
  // Collective over world.
  explicit WorkCounter(Communicator const& world) : rank_(world.rank()) {
    MPI_Aint const bytes = rank_ == 0 ? MPI_Aint(sizeof(long long)) : 0;
    check(MPI_Win_allocate(bytes, int(sizeof(long long)), MPI_INFO_NULL, world.native(), &value_,
                           &win_),
          "MPI_Win_allocate");
    if (rank_ == 0)
      *value_ = 0;
    check(MPI_Win_lock_all(0, win_), "MPI_Win_lock_all");
    check(MPI_Win_sync(win_), "MPI_Win_sync");
    world.barrier(); // the zero is in place before anyone adds
  }
  WorkCounter(WorkCounter const&) = delete;
  WorkCounter& operator=(WorkCounter const&) = delete;
  // Collective: every rank leaves the search together.
  ~WorkCounter() {
    MPI_Win_unlock_all(win_);
    MPI_Win_free(&win_);
  }

  // The counter's value before this rank added one.
  long long next() {
    long long const one = 1;
    long long got = 0;
    check(MPI_Fetch_and_op(&one, &got, MPI_LONG_LONG, 0, 0, MPI_SUM, win_), "MPI_Fetch_and_op");
    check(MPI_Win_flush(0, win_), "MPI_Win_flush");
    return got;
  }

private:
  void check(int rc, char const* op) const {
    if (rc != MPI_SUCCESS)
      throw CommError("telar::successive_halving: " + std::string(op) + " failed on rank " +
                          std::to_string(rank_),
                      rank_, op);
  }
  int rank_;
  long long* value_ = nullptr;
  MPI_Win win_ = MPI_WIN_NULL;
};

} // namespace telar::detail
