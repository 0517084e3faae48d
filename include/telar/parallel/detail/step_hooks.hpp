#pragma once
// What the pipeline executor tells the training components, at fixed points
// of a step. The executor knows nothing of data parallelism, sharding or
// residency: it calls one hooks object, and a new memory or communication
// technique is a new component behind these calls, not a new branch in the
// executor or the Trainer.
//
//   step_begin(calls)        a step starts; every layer runs `calls` micro-batches
//   before_forward(layer)    a layer's forward is about to run (e.g. gather its parameters)
//   before_backward(layer)   a layer's backward is about to run
//   gradient_ready(layer)    one micro-batch's weight gradient of `layer` is accumulated
//   progress()               between instructions: advance communication in flight
//   step_end()               the last instruction of the step has run
#include <cstddef>

namespace telar::detail {

// No component: serial evaluation, tests.
struct NoStepHooks {
  void step_begin(int) {}
  void before_forward(std::size_t) {}
  void before_backward(std::size_t) {}
  void gradient_ready(std::size_t) {}
  void progress() {}
  void step_end() {}
};

// The Trainer's hooks: the gradient-sync component (parameters stay resident,
// nothing is recomputed; ZeRO-3 and recomputation add their components here).
template <class Sync, class Exec>
class StepHooks {
public:
  StepHooks(Sync& sync, Exec const& exec) : sync_(sync), exec_(exec) {}

  void step_begin(int calls) { sync_.begin_step(calls); }
  void before_forward(std::size_t) {}
  void before_backward(std::size_t) {}
  void gradient_ready(std::size_t layer) { sync_.gradient_ready(exec_, layer); }
  void progress() { sync_.poll(); }
  void step_end() { sync_.end_backward(exec_); }

private:
  Sync& sync_;
  Exec exec_;
};

} // namespace telar::detail
