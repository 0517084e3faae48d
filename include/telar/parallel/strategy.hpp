#pragma once
/*! \file
 *  \brief telar::Strategy: the parallel strategy of a Trainer, named as a type. */
#include <telar/core/detail/type_traits.hpp>

namespace telar {

/*! \brief A training strategy composed of policies (data, pipeline, tensor
 *  parallelism, sharding, recomputation). The empty strategy trains serially.
 *  \tparam Policies strategy policies */
template <class... Policies>
struct Strategy {
  /*! \brief Name for logs. */
  static constexpr char const* name() { return sizeof...(Policies) == 0 ? "serial" : "composed"; }
};

/*! \brief Serial training: one rank, no communication. */
using Serial = Strategy<>;

/*! \brief True for telar::Strategy types. \tparam S a type */
template <class S>
inline constexpr bool is_strategy_v = false;
/*! \brief True for telar::Strategy types. \tparam Ps policies */
template <class... Ps>
inline constexpr bool is_strategy_v<Strategy<Ps...>> = true;

} // namespace telar
