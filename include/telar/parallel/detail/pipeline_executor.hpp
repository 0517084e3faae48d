#pragma once
// Runs one rank's instruction list of a pipeline schedule (telar/schedule/)
// with a model's stages. The same executor runs serial training (p = 1),
// gradient accumulation and every pipeline schedule: receives are posted as
// their Recv instruction comes up and completed just before the data is
// used, sends never block (MPI_Isend; a slot whose buffers are still being
// sent is released only once the send completes). The executor reports to
// one hooks object (step_hooks.hpp): step begin and end, before each layer's
// forward and backward, each layer's accumulated weight gradient (so data
// parallelism can start reducing it), and progress between instructions.
#include <telar/comm/communicator.hpp>
#include <telar/comm/device_buffer.hpp>
#include <telar/comm/request.hpp>
#include <telar/core/detail/type_traits.hpp>
#include <telar/core/loss.hpp>
#include <telar/parallel/detail/slot_release.hpp>
#include <telar/parallel/detail/stage_runner.hpp>
#include <telar/parallel/detail/step_hooks.hpp>
#include <telar/profile/trace.hpp>
#include <telar/schedule/schedule.hpp>
#include <telar/schedule/timeline.hpp>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace telar::detail {

template <class Model>
class PipelineExecutor {
public:
  using T = typename Model::value_type;
  using MemorySpace = typename Model::memory_space;
  using Exec = typename Model::execution_space;
  using Mat = Matrix<T, MemorySpace>;
  using CMat = ConstMatrix<T, MemorySpace>;

  PipelineExecutor() = default;

  // `bounds` has p*v + 1 layer boundaries; this rank runs virtual stages
  // c * p + rank for c < v.
  PipelineExecutor(Model* model, std::vector<std::size_t> const& features,
                   std::vector<std::size_t> bounds, int stages, int chunks, int rank,
                   Communicator const* pp)
      : stages_(stages), chunks_(chunks), rank_(rank), pp_(pp), bounds_(std::move(bounds)) {
    // A model whose units pass tensors along (telar::GraphChain) copies
    // them only at these cuts.
    if constexpr (is_detected_v<stage_boundaries_t, Model>)
      model->set_stage_boundaries(bounds_);
    for (int c = 0; c < chunks; ++c) {
      int const vs = c * stages + rank;
      runners_.emplace_back(model, bounds_[vs], bounds_[vs + 1], features);
    }
  }

  int virtual_stages() const { return stages_ * chunks_; }
  std::size_t first_layer(int chunk) const { return runners_[chunk].first(); }
  std::size_t last_layer(int chunk) const { return runners_[chunk].last(); }
  bool owns_layer(std::size_t k) const {
    for (auto const& r : runners_)
      if (k >= r.first() && k < r.last())
        return true;
    return false;
  }
  bool has_last_stage() const { return rank_ == (virtual_stages() - 1) % stages_; }
  bool has_first_stage() const { return rank_ == 0; }
  void clear_slots() {
    for (auto& r : runners_)
      r.clear_slots();
  }
  std::size_t slots_allocated() const {
    std::size_t n = 0;
    for (auto const& r : runners_)
      n += r.slots_allocated();
    return n;
  }

  // One iteration of `sched` for this rank. x and y are the rank's local
  // batch (only the first virtual stage reads x, only the last reads y);
  // micro-batch i is rows [n*i/m, n*(i+1)/m). Returns the loss summed over
  // the micro-batches of the last virtual stage (zero elsewhere).
  template <class Loss, class Hooks>
  LossSum run(Exec const& exec, schedule::Schedule const& sched, CMat x,
              typename Loss::target_type const& y, Loss const& loss, T scale, Hooks&& hooks,
              TraceRecorder* trace) {
    using Targets = typename Loss::target_type;
    int const m = sched.microbatches;
    hooks.step_begin(m);
    std::size_t const n = x.extent(0);
    step_begin_ = events_.size();
    int const last_vs = virtual_stages() - 1;
    LossSum total;
    auto rows_of = [&](int mb) {
      return std::make_pair(n * std::size_t(mb) / std::size_t(m),
                            n * std::size_t(mb + 1) / std::size_t(m));
    };
    auto state = [&](int mb, int chunk) -> MbState& {
      MbState& st = live_[{mb, chunk}];
      if (st.slot < 0) {
        auto [b, e] = rows_of(mb);
        st.slot = runners_[chunk].acquire(e - b);
      }
      return st;
    };
    auto tag = [&](schedule::Instruction const& in) {
      return schedule::message_tag(sched, schedule::message_key(sched, rank_, in));
    };
    bool const tracing = trace && trace->enabled();
    auto timed = [&](char const* what, schedule::Instruction const& in, auto&& body) {
      double const t0 = tracing ? trace->now() : 0;
      body();
      if (tracing) {
        exec.fence();
        double const t1 = trace->now();
        trace->add(std::string(what) + std::to_string(in.microbatch) +
                       (chunks_ > 1 ? "." + std::to_string(in.chunk) : std::string()),
                   what == std::string("F") ? "forward" : "backward", t0, t1);
        events_.push_back({rank_, in.op, in.microbatch, in.chunk, t0, t1});
      }
    };
    // The rank's own time in a Send or Recv instruction (posting MPI_Isend /
    // MPI_Irecv; a receive whose message has already arrived may copy it
    // here): the per-message overheads of CostModel.
    auto posted = [&](schedule::Instruction const& in, double t0) {
      if (tracing)
        events_.push_back({rank_, in.op, in.microbatch, in.chunk, t0, trace->now()});
    };
    // Time spent waiting for a message, as the simulator's Recv events.
    auto wait_recv = [&](MbState& st, schedule::Instruction const& in, schedule::Op op) {
      double const t0 = tracing ? trace->now() : 0;
      bool const had = bool(st.recv);
      complete_recv(st);
      if (tracing && had) {
        double const t1 = trace->now();
        trace->add(op == schedule::Op::RecvActivation ? "wait activation" : "wait gradient", "comm",
                   t0, t1);
        events_.push_back({rank_, op, in.microbatch, in.chunk, t0, t1});
      }
    };

    // A micro-batch's slot is released at a point fixed by the schedule
    // (slot_release.hpp), so the number of slots does not depend on timing.
    auto const release = slot_release_points(sched, rank_);
    auto const& list = sched.ranks[rank_];

    for (std::size_t index = 0; index < list.size(); ++index) {
      schedule::Instruction const& in = list[index];
      using schedule::Op;
      int const vs = in.op == Op::OptimizerStep ? 0 : sched.virtual_stage(rank_, in.chunk);
      switch (in.op) {
      case Op::RecvActivation:
      case Op::RecvGrad: {
        double const t0 = tracing ? trace->now() : 0;
        MbState& st = state(in.microbatch, in.chunk);
        auto& runner = runners_[in.chunk];
        st.recv = std::make_unique<Message>(in.op == Op::RecvGrad ? runner.output_grad(st.slot)
                                                                  : runner.input_buffer(st.slot),
                                            false);
        st.recv_req = pp_->irecv(st.recv->buffer.data(), st.recv->buffer.size(), in.peer, tag(in));
        posted(in, t0);
        break;
      }
      case Op::Forward: {
        MbState& st = state(in.microbatch, in.chunk);
        auto& runner = runners_[in.chunk];
        CMat input;
        if (vs == 0) {
          auto [b, e] = rows_of(in.microbatch);
          input = rows(x, b, e);
        } else {
          wait_recv(st, in, Op::RecvActivation);
          input = runner.input_buffer(st.slot);
        }
        // The loss belongs to the last virtual stage's Forward (as in the
        // schedule's cost model), so its time is recorded with it.
        timed("F", in, [&] {
          runner.forward(exec, st.slot, input, hooks);
          if (vs == last_vs) {
            auto [b, e] = rows_of(in.microbatch);
            total +=
                loss.forward_backward(exec, CMat(runner.output(st.slot)), Targets(rows(y, b, e)),
                                      runner.output_grad(st.slot), scale);
          }
        });
        break;
      }
      case Op::SendActivation:
      case Op::SendGrad: {
        double const t0 = tracing ? trace->now() : 0;
        MbState& st = state(in.microbatch, in.chunk);
        auto const& runner = runners_[in.chunk];
        exec.fence();
        send(st, in.op == Op::SendGrad ? runner.input_grad(st.slot) : runner.output(st.slot),
             in.peer, tag(in));
        posted(in, t0);
        break;
      }
      case Op::Backward:
      case Op::BackwardInput: {
        MbState& st = state(in.microbatch, in.chunk);
        auto& runner = runners_[in.chunk];
        if (vs != last_vs)
          wait_recv(st, in, Op::RecvGrad);
        timed("B", in, [&] {
          if (in.op == Op::Backward)
            runner.backward(exec, st.slot, hooks);
          else
            runner.backward_input(exec, st.slot, hooks);
        });
        break;
      }
      case Op::BackwardWeight: {
        MbState& st = state(in.microbatch, in.chunk);
        timed("W", in, [&] { runners_[in.chunk].backward_weight(exec, st.slot, hooks); });
        break;
      }
      case Op::OptimizerStep:
        break;
      }
      release_due(release, index);
      hooks.progress();
    }
    retire_all();
    hooks.step_end();
    return total;
  }

  // Forward only, for evaluation: virtual stages in order, each rank doing
  // its own; returns the loss of the last virtual stage's rank.
  // `hooks`: step_begin(1), before_forward per layer, step_end (e.g. to
  // gather sharded parameters).
  template <class Loss, class Hooks = NoStepHooks>
  LossSum evaluate(Exec const& exec, CMat x, typename Loss::target_type const& y, Loss const& loss,
                   Hooks&& hooks = Hooks{}) {
    LossSum total;
    hooks.step_begin(1);
    int const S = virtual_stages();
    int prev_slot = -1, prev_chunk = -1;
    std::vector<Request> sends;
    std::vector<std::unique_ptr<Message>> keep;
    for (int vs = 0; vs < S; ++vs) {
      if (vs % stages_ != rank_)
        continue;
      int const c = vs / stages_;
      auto& runner = runners_[c];
      int const slot = runner.acquire(x.extent(0));
      CMat input;
      if (vs == 0) {
        input = x;
      } else if (stages_ == 1) {
        input = runners_[prev_chunk].output(prev_slot);
      } else {
        Message msg(runner.input_buffer(slot), false);
        Request r =
            pp_->irecv(msg.buffer.data(), msg.buffer.size(), (vs - 1) % stages_, 1000000 + vs);
        r.wait();
        msg.buffer.copy_back();
        input = runner.input_buffer(slot);
      }
      runner.forward(exec, slot, input, hooks);
      if (vs == S - 1) {
        total += evaluate_loss(loss, exec, CMat(runner.output(slot)), y);
      } else if (stages_ > 1) {
        exec.fence();
        keep.push_back(std::make_unique<Message>(runner.output(slot), true));
        sends.push_back(pp_->isend(keep.back()->buffer.data(), keep.back()->buffer.size(),
                                   (vs + 1) % stages_, 1000000 + vs + 1));
      }
      if (prev_slot >= 0)
        runners_[prev_chunk].release(prev_slot);
      prev_slot = slot;
      prev_chunk = c;
    }
    wait_all(sends);
    if (prev_slot >= 0)
      runners_[prev_chunk].release(prev_slot);
    hooks.step_end();
    return total;
  }

  // Events recorded by run() while tracing: compute ops, the posting of each
  // Send and Recv, and each receive's wait for its data (a second event of
  // the same Recv, recorded where the data is used); and those added by the
  // caller (the optimizer step).
  std::vector<schedule::Event> const& events() const { return events_; }
  void add_event(schedule::Event const& e) { events_.push_back(e); }
  std::size_t last_step_begin() const { return step_begin_; }
  void clear_events() {
    events_.clear();
    step_begin_ = 0;
  }

private:
  // A message buffer: the view itself when MPI can read it, else a host copy.
  struct Message {
    Message(Mat const& v, bool copy_in) : buffer(v, copy_in) {}
    HostBuffer<Mat> buffer;
  };
  struct MbState {
    int slot = -1;
    std::unique_ptr<Message> recv;
    Request recv_req;
    std::vector<std::pair<std::unique_ptr<Message>, Request>> sends;
  };

  void complete_recv(MbState& st) {
    if (st.recv) {
      st.recv_req.wait();
      st.recv->buffer.copy_back();
      st.recv.reset();
    }
  }
  void send(MbState& st, Mat const& v, int peer, int tag) {
    auto msg = std::make_unique<Message>(v, true);
    Request r = pp_->isend(msg->buffer.data(), msg->buffer.size(), peer, tag);
    st.sends.emplace_back(std::move(msg), std::move(r));
  }
  // Waits for the sends of the micro-batches released after instruction
  // `index` (their receives are known to be posted) and frees their slots.
  void release_due(std::map<std::pair<int, int>, std::size_t> const& release, std::size_t index) {
    for (auto it = live_.begin(); it != live_.end();) {
      auto const r = release.find(it->first);
      if (r == release.end() || r->second != index) {
        ++it;
        continue;
      }
      for (auto& send : it->second.sends)
        send.second.wait();
      if (it->second.slot >= 0)
        runners_[it->first.second].release(it->second.slot);
      it = live_.erase(it);
    }
  }

  // End of the step: waits for every send and frees every slot.
  void retire_all() {
    for (auto& [key, st] : live_) {
      for (auto& send : st.sends)
        send.second.wait();
      if (st.slot >= 0)
        runners_[key.second].release(st.slot);
    }
    live_.clear();
  }

  int stages_ = 1, chunks_ = 1, rank_ = 0;
  Communicator const* pp_ = nullptr;
  std::vector<std::size_t> bounds_;
  std::vector<StageRunner<Model>> runners_;
  std::map<std::pair<int, int>, MbState> live_;
  std::vector<schedule::Event> events_;
  std::size_t step_begin_ = 0;
};

} // namespace telar::detail
