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

// The Trainer's hooks: the parameter-residency component (where values
// live: resident, or gathered on demand under ZeRO-3), then the
// gradient-sync component.
template <class Residency, class Sync, class Exec>
class StepHooks {
public:
  StepHooks(Residency& residency, Sync& sync, Exec const& exec)
      : residency_(residency), sync_(sync), exec_(exec) {}

  void step_begin(int calls) {
    residency_.begin_step(calls);
    sync_.begin_step(calls);
  }
  void before_forward(std::size_t layer) { residency_.before_forward(layer); }
  void before_backward(std::size_t layer) {
    residency_.before_backward(layer);
    sync_.before_backward(layer);
  }
  void gradient_ready(std::size_t layer) { sync_.gradient_ready(exec_, layer); }
  void progress() {
    residency_.progress();
    sync_.poll();
  }
  void step_end() {
    residency_.end_step();
    sync_.end_backward(exec_);
  }

private:
  Residency& residency_;
  Sync& sync_;
  Exec exec_;
};

// Forward only (evaluation): the residency component alone, so sharded
// parameters are gathered there too.
template <class Residency>
class ResidencyHooks {
public:
  explicit ResidencyHooks(Residency& residency) : residency_(residency) {}

  void step_begin(int calls) { residency_.begin_step(calls); }
  void before_forward(std::size_t layer) { residency_.before_forward(layer); }
  void before_backward(std::size_t layer) { residency_.before_backward(layer); }
  void gradient_ready(std::size_t) {}
  void progress() { residency_.progress(); }
  void step_end() { residency_.end_step(); }

private:
  Residency& residency_;
};

} // namespace telar::detail
