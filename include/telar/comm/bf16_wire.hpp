#pragma once
/*! \file
 *  \brief telar::Bf16Wire: an allreduce of float buffers that sends bf16,
 *  half the bytes on the wire (the gradients of
 *  telar::Precision<telar::bf16, float, telar::bf16>).
 *
 *  Numerics: each rank's value is rounded to bf16 once (relative error at
 *  most u = 2^-8); the wrapped point-to-point algorithm then adds received
 *  segments in float and rounds each partial sum to bf16 again (p - 1
 *  additions per element on p ranks). The result, identical on every rank,
 *  is within p u (sum of |x_r|) of the exact sum, to first order in u, and
 *  is converted back to float exactly (docs/precision.md).
 */
#include <telar/comm/allreduce.hpp>
#include <telar/comm/detail/bf16_word.hpp>

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace telar {

namespace detail {

// The float buffer's bf16 copy and the allreduce of it; when that completes,
// the sum is written back into the float buffer.
class Bf16WireState final : public AllreduceState {
public:
  Bf16WireState(std::shared_ptr<CommHandle> comm, const char* algorithm, float* data, std::size_t n)
      : AllreduceState(std::move(comm), algorithm), data_(data), words_(n) {
    for (std::size_t i = 0; i < n; ++i)
      words_[i] = Bf16Word::from_float(data[i]);
  }
  Bf16Word* words() { return words_.data(); }
  void start(AllreduceOp<Bf16Word> inner) {
    inner_ = std::move(inner);
    advance();
  }
  // The inner operation progresses on its own (it is registered too).
  bool advance() override {
    if (back_ || !inner_.done())
      return false;
    for (std::size_t i = 0; i < words_.size(); ++i)
      data_[i] = words_[i].to_float();
    back_ = true;
    return true;
  }
  bool finished() const override { return back_; }
  std::string describe() const override {
    return "its allreduce of " + std::to_string(words_.size()) + " bf16 values";
  }
  int pending_peer() const override { return -1; }
  void release(double) noexcept override {} // inner_'s destructor releases it

private:
  float* data_;
  std::vector<Bf16Word> words_;
  AllreduceOp<Bf16Word> inner_;
  bool back_ = false;
};

} // namespace detail

/*! \brief Allreduce of float buffers in bf16: the buffer is rounded to bf16,
 *  summed by \p Algorithm (its settings apply) and written back as float.
 *  Half the bytes of the float allreduce; the error bound is in the file's
 *  notes. \tparam Algorithm one of Telar's point-to-point algorithms
 *  (RingAllreduce, RecursiveHalvingDoubling, HierarchicalAllreduce,
 *  TopologyAwareAllreduce): MPI's own allreduce cannot sum bf16 */
template <class Algorithm>
struct Bf16Wire : Algorithm {
  static_assert(!std::is_same_v<Algorithm, MpiAllreduce>,
                "telar::Bf16Wire: MPI's own allreduce (telar::MpiAllreduce) cannot sum bf16; use "
                "telar::RingAllreduce, RecursiveHalvingDoubling, HierarchicalAllreduce or "
                "TopologyAwareAllreduce");
  /*! \brief The conversions run on the host. */
  static constexpr bool reduces_on_host = true;
  /*! \brief Name for logs and traces. */
  static constexpr char const* name() { return "bf16-wire"; }

  /*! \brief Starts a sum-allreduce of \p n floats in place, sent as bf16.
   *  \param comm communicator (every rank calls start in the same order)
   *  \param data buffer (host memory), untouched until the operation completes
   *  \param n number of elements */
  AllreduceOp<float> start(Communicator const& comm, float* data, std::size_t n) const {
    auto state =
        std::make_unique<detail::Bf16WireState>(comm.handle_ptr(), "telar::Bf16Wire", data, n);
    state->start(Algorithm::start(comm, state->words(), n));
    return AllreduceOp<float>(std::move(state));
  }
};

/*! \brief Bf16Wire wraps an allreduce algorithm. \tparam A the algorithm */
template <class A>
struct is_allreduce_algorithm<Bf16Wire<A>> : std::true_type {};

} // namespace telar
