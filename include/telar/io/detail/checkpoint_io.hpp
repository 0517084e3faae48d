#pragma once
// Which doors io/ reads a training object through: a telar::Trainer's
// (trainer_view.hpp: public accessors; trainer_access.hpp: the optimizer's
// shard and state) or a telar::SlabDataParallel's (slab_view.hpp).
#include <telar/io/detail/slab_view.hpp>
#include <telar/io/detail/trainer_access.hpp>
#include <telar/io/detail/trainer_view.hpp>

namespace telar::detail {

template <class Tr>
struct checkpoint_io {
  using view = TrainerView;
  using access = TrainerAccess;
};
template <class G, class DP, class O>
struct checkpoint_io<SlabDataParallel<G, DP, O>> {
  using view = SlabView;
  using access = SlabView;
};

} // namespace telar::detail
