#pragma once
/*! \file
 *  \brief telar::DataParallelContext, what a layer that reduces over the
 *  data-parallel group inside its forward and backward is given (BatchNorm
 *  with telar::SyncStats), and the helpers that pass it to a model and keep
 *  a model's buffers identical over the group.
 *
 *  telar::Trainer does both itself: set_data_parallel when it builds the
 *  model, average_buffers after every step. A loop driving a model by hand:
 *  \code
 *  telar::DataParallelContext dp(grid.dp());
 *  telar::set_data_parallel(model, dp);   // once, before the first forward
 *  // ... each step: forward, backward, gradient allreduce, update ...
 *  telar::average_buffers(model, dp);     // running statistics equal everywhere
 *  \endcode
 */
#include <telar/comm/communicator.hpp>
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <vector>

namespace telar {

/*! \brief The data-parallel group as a layer sees it: who it is and how to
 *  sum host values over the group.
 *
 *  Cheap to copy; layers keep a copy. The communicator is not owned and must
 *  outlive every layer that holds the context (a telar::ProcessGrid's dp()
 *  usually). A default-constructed context is a group of one. */
struct DataParallelContext {
  Communicator const* comm = nullptr; //!< the dp group (null: a group of one)
  int rank = 0;                       //!< this rank in the group
  int size = 1;                       //!< ranks in the group

  /*! \brief A group of one: no communication. */
  DataParallelContext() = default;
  /*! \brief The group of \p dp. \param dp the data-parallel communicator
   *  (not owned; must outlive the context's users) */
  explicit DataParallelContext(Communicator const& dp)
      : comm(&dp), rank(dp.rank()), size(dp.size()) {}

  /*! \brief Sums \p n host values over the group, in place (collective: every
   *  rank of the group calls it in the same order with the same n).
   *  \param v host values \param n how many
   *  \throws telar::CommError or telar::CommTimeout naming the rank and the operation */
  void allreduce_sum(double* v, std::size_t n) const {
    if (size > 1 && comm != nullptr)
      comm->allreduce(v, n);
  }
};

/*! \brief Passes \p ctx to every layer of \p model that takes a data-parallel
 *  context (nested blocks included). \param model a layer or model
 *  \param ctx the data-parallel group */
template <class Model>
void set_data_parallel(Model& model, DataParallelContext const& ctx) {
  detail::pass_data_parallel(model, ctx);
}

/*! \brief Replaces every buffer of \p model by its mean over the group
 *  (collective over the group; nothing in a group of one).
 *
 *  Why the mean rather than rank 0's copy (PyTorch DDP broadcasts rank 0's
 *  buffers before each forward): with telar::LocalStats each rank's running
 *  statistics saw only its share of the batch, and their mean is the running
 *  statistics of the whole batch's micro-batch means, so it does not depend
 *  on which rank is first and uses every rank's data. With telar::SyncStats
 *  the copies are already equal and the mean keeps them so.
 *  \param model a layer or model whose buffers(f) visits Kokkos::Views
 *  \param ctx the data-parallel group */
template <class Model>
void average_buffers(Model& model, DataParallelContext const& ctx) {
  if constexpr (layer_traits<Model>::has_buffers) {
    if (ctx.size == 1)
      return;
    std::vector<double> all;
    model.buffers([&](char const*, auto& v) {
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, v);
      all.insert(all.end(), h.data(), h.data() + h.span());
    });
    if (all.empty()) // no buffers: the same on every replica of a stage, no message
      return;
    ctx.allreduce_sum(all.data(), all.size());
    std::size_t at = 0;
    model.buffers([&](char const*, auto& v) {
      using V = std::decay_t<decltype(v)>;
      auto h = Kokkos::create_mirror_view(v);
      for (std::size_t i = 0; i < h.span(); ++i)
        h.data()[i] = typename V::non_const_value_type(all[at + i] / double(ctx.size));
      at += h.span();
      Kokkos::deep_copy(v, h);
    });
  } else {
    (void)model, (void)ctx;
  }
}

} // namespace telar
