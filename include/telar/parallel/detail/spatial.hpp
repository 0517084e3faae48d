#pragma once
// Internals of spatial parallelism shared by the layer wrappers.
#include <telar/comm/communicator.hpp>

#include <cstddef>
#include <vector>

namespace telar::detail {

// Runs a layer's backward_weight so that its gradients grow by the sum over
// the spatial group of every rank's part (each rank saw only its slab), and
// not by this rank's part alone. The layer accumulates (+=) into gradients
// that may already hold earlier micro-batches, so the part is what the call
// added: after - before, summed over the group, added to before. Host
// memory (the wrappers assert it); one allreduce per layer.
template <class T>
class GroupGradientSum {
public:
  template <class Layer, class F>
  void operator()(Layer& layer, Communicator const& group, F&& accumulate) {
    before_.clear();
    layer.parameters([&](char const*, auto&, auto& g) {
      before_.insert(before_.end(), g.data(), g.data() + g.span());
    });
    accumulate();
    part_.resize(before_.size());
    std::size_t i = 0;
    layer.parameters([&](char const*, auto&, auto& g) {
      for (std::size_t k = 0; k < g.span(); ++k, ++i)
        part_[i] = g.data()[k] - before_[i];
    });
    group.allreduce(part_.data(), part_.size());
    i = 0;
    layer.parameters([&](char const*, auto&, auto& g) {
      for (std::size_t k = 0; k < g.span(); ++k, ++i)
        g.data()[k] = before_[i] + part_[i];
    });
  }

private:
  std::vector<T> before_, part_;
};

} // namespace telar::detail
