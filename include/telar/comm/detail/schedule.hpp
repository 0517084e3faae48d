#pragma once
// Telar's allreduce algorithms as data: each algorithm writes, per rank, the
// list of point-to-point transfers it performs in program order (sends,
// receives that overwrite, receives that are summed in), already cut into
// segments. One executor (ScheduleRun) runs any such list without blocking:
// it posts a transfer as soon as every earlier transfer touching an
// overlapping range allows it, so the reduction of one segment overlaps the
// transfer of the next, and the phases of a composed algorithm (e.g. the
// three of the hierarchical one) pipeline into each other.
//
// Matching: all transfers of one run on one communicator share a tag; MPI's
// non-overtaking rule then pairs the k-th send from a to b with the k-th
// receive b posts from a, because the executor posts sends, and receives,
// strictly in program order and the generators emit matching orders on both
// sides.
//
// Liveness: because sends and receives are each posted in program order, the
// messages in flight (limited per direction) and the scratch slots are always
// held by the earliest unfinished transfers; so the earliest unfinished
// transfer can always be posted once all earlier ones are done, and the
// executor makes at least the progress of running the list step by step,
// which is deadlock-free by construction of each algorithm. (Letting a later
// receive overtake a blocked earlier one can deadlock: it may take the last
// in-flight slot while waiting for data that depends on the earlier one.)

#include <telar/comm/detail/comm_handle.hpp>
#include <telar/comm/detail/mpi_type.hpp>
#include <telar/core/detail/decl.hpp>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace telar::detail {

struct Xfer {
  enum Kind : unsigned char { send, recv_copy, recv_reduce };
  Kind kind;
  unsigned char comm; // index into the run's communicators
  int peer;
  std::size_t off; // elements from the start of the buffer
  std::size_t cnt; // elements
};

struct Schedule {
  std::vector<Xfer> ops;
  std::size_t seg = static_cast<std::size_t>(-1); // max elements per message

  // Appends one logical transfer, cut into segments; empty ranges are
  // skipped on both sides since both compute the same sizes.
  TELAR_DECL void add(Xfer::Kind k, int comm, int peer, std::size_t off, std::size_t cnt);
};

// Block c of n elements split into p nearly equal blocks.
TELAR_DECL std::size_t block_begin(std::size_t n, int p, int c);
inline std::size_t block_size(std::size_t n, int p, int c) {
  return block_begin(n, p, c + 1) - block_begin(n, p, c);
}
inline int mod(int a, int p) {
  return ((a % p) + p) % p;
}

// Ring reduce-scatter of [base, base + n) over p ranks: p - 1 steps; at step t
// rank r sends block r - t to its right and sums block r - t - 1 from its left.
// Afterwards rank r holds block r + 1 fully reduced; returns that block.
TELAR_DECL int ring_reduce_scatter(Schedule& s, int comm, int r, int p, std::size_t base,
                                   std::size_t n);

// Ring allgather that follows ring_reduce_scatter: rank r starts with block
// r + 1 and passes blocks to the right, receiving straight into the buffer.
TELAR_DECL void ring_allgather(Schedule& s, int comm, int r, int p, std::size_t base,
                               std::size_t n);

// Rabenseifner: reduce-scatter by recursive halving, allgather by recursive
// doubling, among the largest power of two p2 <= p. The rem = p - p2 extra
// ranks are folded in first: among ranks 0 .. 2*rem-1, each even rank sends
// its whole vector to the odd rank after it and sits out; the odd rank later
// sends it the result.
TELAR_DECL void recursive_halving_doubling(Schedule& s, int comm, int r, int p, std::size_t n);

// dst += src, written so the compiler vectorises it.
template <class T>
inline void add_into(T* __restrict dst, T const* __restrict src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    dst[i] += src[i];
}

// Runs a Schedule on `data` without blocking; advance() makes all possible
// progress and returns whether anything changed.
template <class T>
class ScheduleRun {
public:
  struct Comm {
    MPI_Comm comm = MPI_COMM_NULL;
    int tag = 0;
    std::string name;
  };

  ScheduleRun(T* data, Schedule sched, std::vector<Comm> comms, int max_in_flight,
              std::shared_ptr<CommHandle> scratch_owner)
      : data_(data), ops_(std::move(sched.ops)), seg_(sched.seg), comms_(std::move(comms)),
        limit_(std::max(1, max_in_flight)), owner_(std::move(scratch_owner)) {
    std::size_t const nops = ops_.size();
    st_.assign(nops, pending);
    slot_of_.assign(nops, -1);
    queue_of_.resize(nops);
    queue_left_.assign(2, 0);
    std::size_t max_rr = 0;
    for (std::size_t i = 0; i < nops; ++i) {
      auto const& x = ops_[i];
      queue_of_[i] = x.kind == Xfer::send ? 0 : 1;
      ++queue_left_[static_cast<std::size_t>(queue_of_[i])];
      if (x.kind == Xfer::recv_reduce)
        max_rr = std::max(max_rr, x.cnt);
    }
    if (max_rr > 0) {
      int const nslots = limit_;
      slot_elems_ = (max_rr + 15) / 16 * 16; // keep slots 64-byte aligned
      scratch_ = owner_->take_scratch(slot_elems_ * sizeof(T) * static_cast<std::size_t>(nslots));
      for (int k = nslots - 1; k >= 0; --k)
        free_slots_.push_back(k);
    }
    std::size_t const cap = 2 * static_cast<std::size_t>(limit_);
    reqs_.assign(cap, MPI_REQUEST_NULL);
    req_op_.assign(cap, 0);
    indices_.resize(cap);
    statuses_.resize(cap);
    for (std::size_t k = cap; k-- > 0;)
      free_reqs_.push_back(static_cast<int>(k));
    blocked_.assign(queue_left_.size(), 0);
  }

  ScheduleRun(ScheduleRun const&) = delete;
  ScheduleRun& operator=(ScheduleRun const&) = delete;

  ~ScheduleRun() {
    release(0.05);
    if (owner_)
      owner_->give_scratch(std::move(scratch_));
  }

  bool finished() const noexcept { return done_ == ops_.size(); }

  bool advance() {
    if (finished())
      return false;
    bool changed = false;
    if (in_flight_ > 0) {
      int outcount = 0;
      int const rc = MPI_Testsome(static_cast<int>(reqs_.size()), reqs_.data(), &outcount,
                                  indices_.data(), statuses_.data());
      if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS)
        fail(rc, first_posted());
      if (outcount != MPI_UNDEFINED) {
        for (int k = 0; k < outcount; ++k) {
          int const slot = indices_[static_cast<std::size_t>(k)];
          std::size_t const i = req_op_[static_cast<std::size_t>(slot)];
          if (rc == MPI_ERR_IN_STATUS &&
              statuses_[static_cast<std::size_t>(k)].MPI_ERROR != MPI_SUCCESS)
            fail(statuses_[static_cast<std::size_t>(k)].MPI_ERROR, i);
          free_reqs_.push_back(slot);
          --in_flight_;
          if (ops_[i].kind == Xfer::send)
            --sends_in_flight_;
          else
            --recvs_in_flight_;
          if (ops_[i].kind == Xfer::recv_reduce) {
            st_[i] = arrived;
            arrived_.push_back(i);
          } else {
            complete(i);
          }
        }
        changed = outcount > 0;
      }
    }
    changed |= reduce_arrived();
    changed |= post();
    return changed;
  }

  // What the run waits for, for a timeout message.
  std::string describe() const {
    if (finished())
      return "nothing (finished)";
    std::size_t const i = first_;
    auto const& x = ops_[i];
    std::ostringstream os;
    os << (x.kind == Xfer::send ? "MPI_Send to" : "MPI_Recv from") << " rank " << x.peer
       << " of communicator '" << comms_[x.comm].name << "' (tag " << comms_[x.comm].tag << ", "
       << x.cnt << " elements at offset " << x.off << "), transfer " << i + 1 << " of "
       << ops_.size();
    if (st_[i] == pending)
      os << ", not yet posted";
    if (std::getenv("TELAR_COMM_DEBUG")) {
      os << "\n  in flight: " << sends_in_flight_ << " sends, " << recvs_in_flight_
         << " recvs; ops:";
      for (std::size_t j = 0; j < ops_.size(); ++j)
        os << "\n   " << j + 1 << ": kind " << int(ops_[j].kind) << " comm " << int(ops_[j].comm)
           << " peer " << ops_[j].peer << " [" << ops_[j].off << "," << ops_[j].off + ops_[j].cnt
           << ") state " << int(st_[j]) << " queue " << queue_of_[j];
    }
    return os.str();
  }
  int pending_peer() const { return finished() ? -1 : ops_[first_].peer; }

  // Cancels receives, gives sends `bound` seconds, then frees what is left,
  // so no request outlives the buffers.
  void release(double bound) noexcept {
    if (in_flight_ == 0 || mpi_finalized())
      return;
    for (std::size_t k = 0; k < reqs_.size(); ++k)
      if (reqs_[k] != MPI_REQUEST_NULL && ops_[req_op_[k]].kind != Xfer::send)
        MPI_Cancel(&reqs_[k]);
    try {
      wait_until(
          [&] {
            int flag = 0;
            MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE);
            return flag != 0;
          },
          bound, [](double) { throw 0; });
    } catch (...) {
    }
    for (auto& r : reqs_)
      if (r != MPI_REQUEST_NULL)
        MPI_Request_free(&r);
    in_flight_ = 0;
  }

private:
  enum State : unsigned char { pending, posted, arrived, done };

  static bool overlap(Xfer const& a, Xfer const& b) {
    return a.off < b.off + b.cnt && b.off < a.off + a.cnt;
  }

  // True if an earlier unfinished transfer conflicts with transfer i, which
  // writes its range (receive) or reads it (send).
  bool conflicts(std::size_t i, bool writes) const {
    auto const& x = ops_[i];
    for (std::size_t j = first_; j < i; ++j) {
      if (st_[j] == done || !overlap(ops_[j], x))
        continue;
      if (writes || ops_[j].kind != Xfer::send)
        return true;
    }
    return false;
  }

  void complete(std::size_t i) {
    st_[i] = done;
    ++done_;
    while (first_ < ops_.size() && st_[first_] == done)
      ++first_;
  }

  bool reduce_arrived() {
    bool changed = false;
    for (std::size_t k = 0; k < arrived_.size();) {
      std::size_t const i = arrived_[k];
      if (conflicts(i, true)) {
        ++k;
        continue;
      }
      auto const& x = ops_[i];
      int const slot = slot_of_[i];
      add_into(data_ + x.off, slot_ptr(slot), x.cnt);
      free_slots_.push_back(slot);
      arrived_.erase(arrived_.begin() + static_cast<std::ptrdiff_t>(k));
      complete(i);
      changed = true;
    }
    return changed;
  }

  T* slot_ptr(int slot) {
    return reinterpret_cast<T*>(scratch_.data.get()) + static_cast<std::size_t>(slot) * slot_elems_;
  }

  bool post() {
    bool changed = false;
    std::fill(blocked_.begin(), blocked_.end(), 0);
    std::size_t nblocked = 0;
    for (std::size_t q = 0; q < queue_left_.size(); ++q)
      if (queue_left_[q] == 0)
        blocked_[q] = 1, ++nblocked;
    for (std::size_t i = first_; i < ops_.size() && nblocked < blocked_.size(); ++i) {
      if (st_[i] != pending)
        continue;
      auto const q = static_cast<std::size_t>(queue_of_[i]);
      if (blocked_[q])
        continue;
      if (!can_post(i)) {
        blocked_[q] = 1;
        ++nblocked;
        continue;
      }
      start(i);
      changed = true;
    }
    return changed;
  }

  bool can_post(std::size_t i) const {
    auto const& x = ops_[i];
    switch (x.kind) {
    case Xfer::send:
      return sends_in_flight_ < limit_ && !conflicts(i, false);
    case Xfer::recv_copy:
      return recvs_in_flight_ < limit_ && !conflicts(i, true);
    case Xfer::recv_reduce:
      return recvs_in_flight_ < limit_ && !free_slots_.empty();
    }
    return false;
  }

  void start(std::size_t i) {
    auto const& x = ops_[i];
    auto const& c = comms_[x.comm];
    int const slot = free_reqs_.back();
    MPI_Request* req = &reqs_[static_cast<std::size_t>(slot)];
    int const n = static_cast<int>(x.cnt);
    int rc;
    if (x.kind == Xfer::send) {
      rc = MPI_Isend(data_ + x.off, n, mpi_type<T>(), x.peer, c.tag, c.comm, req);
      ++sends_in_flight_;
      if (owner_)
        owner_->bytes_sent += x.cnt * sizeof(T);
    } else {
      T* dst = data_ + x.off;
      if (x.kind == Xfer::recv_reduce) {
        slot_of_[i] = free_slots_.back();
        free_slots_.pop_back();
        dst = slot_ptr(slot_of_[i]);
      }
      rc = MPI_Irecv(dst, n, mpi_type<T>(), x.peer, c.tag, c.comm, req);
      ++recvs_in_flight_;
    }
    if (rc != MPI_SUCCESS)
      fail(rc, i);
    free_reqs_.pop_back();
    req_op_[static_cast<std::size_t>(slot)] = i;
    st_[i] = posted;
    ++in_flight_;
    --queue_left_[static_cast<std::size_t>(queue_of_[i])];
  }

  std::size_t first_posted() const {
    for (std::size_t i = first_; i < ops_.size(); ++i)
      if (st_[i] == posted)
        return i;
    return first_;
  }

  [[noreturn]] void fail(int code, std::size_t i) const {
    auto const& x = ops_[i];
    bool const send = x.kind == Xfer::send;
    owner_->fail(code, send ? "MPI_Isend" : "MPI_Irecv", x.peer, comms_[x.comm].tag,
                 send ? "to" : "from");
  }

  T* data_;
  std::vector<Xfer> ops_;
  std::size_t seg_;
  std::vector<Comm> comms_;
  int limit_;
  std::shared_ptr<CommHandle> owner_;

  std::vector<unsigned char> st_;
  std::vector<int> slot_of_;
  std::vector<int> queue_of_;
  std::vector<std::size_t> queue_left_; // unposted sends, unposted receives
  std::vector<unsigned char> blocked_;
  std::vector<std::size_t> arrived_;

  ScratchBuffer scratch_;
  std::size_t slot_elems_ = 0;
  std::vector<int> free_slots_;

  std::vector<MPI_Request> reqs_;
  std::vector<std::size_t> req_op_;
  std::vector<int> indices_;
  std::vector<MPI_Status> statuses_;
  std::vector<int> free_reqs_;
  int in_flight_ = 0;
  int sends_in_flight_ = 0;
  int recvs_in_flight_ = 0;

  std::size_t first_ = 0; // first transfer not done
  std::size_t done_ = 0;
};

} // namespace telar::detail

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/comm/detail/schedule.ipp>
#endif
