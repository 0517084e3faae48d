#pragma once
/*! \file
 *  \brief Strategy policies and their composition: the parallel strategy of a
 *  Trainer is a type; degrees and sizes are run-time values.
 *
 *  \code
 *  using S = telar::Strategy<telar::DataParallel<telar::RingAllreduce>,
 *                            telar::PipelineParallel<telar::OneFOneB>,
 *                            telar::TensorParallel<>>;
 *  \endcode
 *  Policies may come in any order and each at most once; a policy that is
 *  left out has degree 1. An unknown or repeated policy is a compile error
 *  that starts with "telar::Strategy:".
 */
#include <telar/comm/allreduce.hpp>
#include <telar/core/detail/type_traits.hpp>
#include <telar/schedule/schedule.hpp>
#include <telar/schedule/tags.hpp>

#include <string>
#include <type_traits>

namespace telar {

// Pipeline schedule tags (GPipe, OneFOneB, ...): telar/schedule/tags.hpp.

// ---- policies ----------------------------------------------------------------

/*! \brief Every data-parallel rank keeps all parameters, gradients and
 *  optimizer state (no sharding). */
struct NoSharding {
  /*! \brief ZeRO stage. */
  static constexpr int stage = 0;
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "none"; }
};

/*! \brief When ZeRO-3 gathers a group's parameters: memory traded for traffic. */
enum class ZeRO3Gather {
  /*! \brief Gather each group once per step and keep it until the step ends
   *  (forward and backward of every micro-batch reuse it): one all-gather of
   *  the parameters per step, but every group stays gathered for the step. */
  PerStep,
  /*! \brief Gather for each forward and each backward use and free after it:
   *  only the groups in use (and the one prefetched) are ever gathered, at
   *  2 all-gathers of the parameters per micro-batch. */
  PerMicrobatch
};

/*! \brief ZeRO sharding over the data-parallel group (Rajbhandari et al.):
 *  rank r of the dp group owns 1/dp of the flat parameters and is the only
 *  one to keep their optimizer state and update them.
 *
 *  - Stage 1 shards the optimizer state. After backward, each rank sums the
 *    gradients of its shard. When every data-parallel rank shares a node and
 *    parameters live in host memory, gradients are summed straight out of
 *    the other ranks' buffers and the node keeps one copy of the parameters
 *    (MPI-3 shared memory); otherwise gradients are reduce-scattered. The
 *    updated shards are then all-gathered.
 *  - Stage 2 shards the reduced gradients too: they are reduce-scattered
 *    group by group (buckets of layers) while backward still runs, each rank
 *    receiving only the part of each group inside its shard, and no rank
 *    holds the full gradient: only the buffers of the groups being
 *    accumulated or reduced.
 *  - Stage 3 shards the parameters too: a rank keeps its shard of the
 *    values, gradients and optimizer state (16Ψ/N bytes for fp32 Adam).
 *    Before a group of layers runs forward or backward its parameters are
 *    all-gathered, the next group's gather overlapping the compute
 *    (prefetch); \p Gather chooses whether a gathered group is kept for the
 *    step or freed after each use. Nothing is all-gathered after the
 *    optimizer: the next step's gathers read the updated shards.
 *
 *  All compose with pipeline and tensor parallelism, every schedule,
 *  gradient clipping and every optimizer.
 *  \tparam Stage ZeRO stage (1, 2 or 3)
 *  \tparam Gather stage 3's gather policy (ignored by stages 1 and 2) */
template <int Stage, ZeRO3Gather Gather = ZeRO3Gather::PerMicrobatch>
struct ZeRO {
  static_assert(Stage >= 1 && Stage <= 3,
                "telar::ZeRO: stages 1 (sharded optimizer state), 2 (and sharded gradients) "
                "and 3 (and sharded parameters) exist");
  /*! \brief ZeRO stage. */
  static constexpr int stage = Stage;
  /*! \brief Stage 3's gather policy. */
  static constexpr ZeRO3Gather gather = Gather;
  /*! \brief Name for logs. */
  static constexpr char const* name() {
    return Stage == 1 ? "zero1" : Stage == 2 ? "zero2" : "zero3";
  }
};

/*! \brief True for the sharding policies. \tparam S a type */
template <class S>
inline constexpr bool is_sharding_v = std::is_same_v<S, NoSharding>;
/*! \brief True for the sharding policies. \tparam Stage ZeRO stage \tparam G gather policy */
template <int Stage, ZeRO3Gather G>
inline constexpr bool is_sharding_v<ZeRO<Stage, G>> = true;

/*! \brief Data parallelism: each dp rank trains on its share of the global
 *  batch; gradients are summed over the dp group in buckets that start while
 *  backward still runs (or, with ZeRO, reduced to the rank that owns each
 *  shard of the optimizer state).
 *  \tparam Algorithm allreduce policy (telar/comm/allreduce.hpp); the default,
 *  TopologyAwareAllreduce, is the ring on one node and the hierarchical
 *  algorithm when the dp group spans several nodes
 *  \tparam Sharding NoSharding, ZeRO<1>, ZeRO<2> or ZeRO<3, Gather> */
template <class Algorithm = TopologyAwareAllreduce, class Sharding = NoSharding>
struct DataParallel {
  static_assert(is_allreduce_algorithm_v<Algorithm>,
                "telar::DataParallel: Algorithm must be an allreduce policy such as "
                "telar::RingAllreduce or telar::MpiAllreduce");
  static_assert(is_sharding_v<Sharding>,
                "telar::DataParallel: Sharding must be telar::NoSharding, telar::ZeRO<1>, "
                "telar::ZeRO<2> or telar::ZeRO<3>");
  /*! \brief The allreduce policy. */
  using algorithm = Algorithm;
  /*! \brief The sharding policy. */
  using sharding = Sharding;
  /*! \brief Name for logs. */
  static constexpr char const* name() {
    return Sharding::stage == 0   ? "dp"
           : Sharding::stage == 1 ? "dp+zero1"
           : Sharding::stage == 2 ? "dp+zero2"
                                  : "dp+zero3";
  }
};

/*! \brief Pipeline parallelism: the model's layers split into stages, run by a
 *  schedule (TrainerOptions::schedule may name another one at run time).
 *  \tparam Schedule default schedule tag (GPipe, OneFOneB, Interleaved1F1B<V>,
 *  ZeroBubbleH1, ZeroBubbleH2) */
template <class Schedule = OneFOneB>
struct PipelineParallel {
  static_assert(is_schedule_tag_v<Schedule>,
                "telar::PipelineParallel: Schedule must be a schedule tag such as telar::OneFOneB, "
                "telar::Interleaved1F1B<2> or telar::ZeroBubbleH1");
  /*! \brief The default schedule tag. */
  using schedule = Schedule;
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "pp"; }
};

/*! \brief Tensor (Megatron) parallelism: layers wrapped in ColumnParallel /
 *  RowParallel are split over the tp group.
 *  \tparam Algorithm allreduce policy for the activations' reductions */
template <class Algorithm = RingAllreduce>
struct TensorParallel {
  static_assert(is_allreduce_algorithm_v<Algorithm>,
                "telar::TensorParallel: Algorithm must be an allreduce policy such as "
                "telar::RingAllreduce");
  /*! \brief The allreduce policy. */
  using algorithm = Algorithm;
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "tp"; }
};

/*! \brief Spatial parallelism: each sample's volume split by depth over
 *  the sp ranks of a group (telar::ProcessGrid's sp axis), its layers
 *  exchanging halo rows with the neighbour slabs (docs/spatial.md). Its
 *  models are telar::SlabGraph, trained by telar::SlabDataParallel
 *  (Strategy<DataParallel<...>, SpatialParallel>, with or without ZeRO);
 *  the Trainer's models take whole samples and refuse it at compile time. */
struct SpatialParallel {
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "sp"; }
};

/*! \brief The bfloat16 compute type of telar::Precision (8 significant
 *  bits, fp32's range): a tag, values are stored as float. */
struct bf16 {
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "bf16"; }
};

/*! \brief Mixed precision: the compute type of GEMMs and convolutions and
 *  the master type of everything a model keeps (telar/parallel/precision.hpp,
 *  docs/precision.md).
 *
 *  Precision<bf16, float> rebinds the model's Dense, convolution and
 *  attention layers to telar::Bf16Gemm / telar::OneDnnConvBf16 (bf16 inputs,
 *  fp32 accumulation); weights, gradients, optimizer state, norms, softmax
 *  and losses stay float. Precision<float, float> (the default) changes
 *  nothing. Orthogonal to every other policy.
 *
 *  \p Reduce = telar::bf16 sends the data-parallel gradient buckets in bf16
 *  (telar::Bf16Wire around the strategy's allreduce, or under ZeRO its
 *  reduce-scatters: half the bytes; each rank's gradient rounded once,
 *  partial sums rounded at each addition); float, the default, reduces them
 *  in fp32.
 *  \tparam Compute telar::bf16 or float \tparam Master float
 *  \tparam Reduce type of the gradient allreduce: float or telar::bf16 */
template <class Compute, class Master = float, class Reduce = float>
struct Precision {
  static_assert(std::is_same_v<Reduce, bf16> || std::is_same_v<Reduce, float>,
                "telar::Precision: gradients are reduced in float or telar::bf16");
  static_assert(std::is_same_v<Compute, bf16> || std::is_same_v<Compute, float>,
                "telar::Precision: the compute type is telar::bf16 or float");
  static_assert(std::is_same_v<Master, float>, "telar::Precision: master weights are float (fp32)");
  /*! \brief Type GEMMs and convolutions multiply in. */
  using compute_type = Compute;
  /*! \brief Type of parameters, gradients and optimizer state. */
  using master_type = Master;
  /*! \brief GEMMs and convolutions run in bf16. */
  static constexpr bool bf16_compute = std::is_same_v<Compute, bf16>;
  /*! \brief Gradients are allreduced in bf16. */
  static constexpr bool bf16_reduce = std::is_same_v<Reduce, bf16>;
  /*! \brief Name for logs. */
  static constexpr char const* name() { return bf16_compute ? "bf16" : "fp32"; }
};

/*! \brief True for Precision<...>. \tparam P a type */
template <class P>
inline constexpr bool is_precision_v = false;
/*! \brief True for Precision<...>. \tparam C compute type \tparam M master type
 *  \tparam R reduce type */
template <class C, class M, class R>
inline constexpr bool is_precision_v<Precision<C, M, R>> = true;

/*! \brief True for DataParallel<...>. \tparam P a type */
template <class P>
inline constexpr bool is_data_parallel_v = false;
/*! \brief True for DataParallel<...>. \tparam A algorithm \tparam S sharding */
template <class A, class S>
inline constexpr bool is_data_parallel_v<DataParallel<A, S>> = true;
/*! \brief True for PipelineParallel<...>. \tparam P a type */
template <class P>
inline constexpr bool is_pipeline_parallel_v = false;
/*! \brief True for PipelineParallel<...>. \tparam S schedule */
template <class S>
inline constexpr bool is_pipeline_parallel_v<PipelineParallel<S>> = true;
/*! \brief True for TensorParallel<...>. \tparam P a type */
template <class P>
inline constexpr bool is_tensor_parallel_v = false;
/*! \brief True for TensorParallel<...>. \tparam A algorithm */
template <class A>
inline constexpr bool is_tensor_parallel_v<TensorParallel<A>> = true;

namespace detail {
template <class P>
struct is_dp : std::bool_constant<is_data_parallel_v<P>> {};
template <class P>
struct is_pp : std::bool_constant<is_pipeline_parallel_v<P>> {};
template <class P>
struct is_tp : std::bool_constant<is_tensor_parallel_v<P>> {};
template <class P>
struct is_precision : std::bool_constant<is_precision_v<P>> {};
template <class P>
struct is_sp : std::is_same<P, SpatialParallel> {};
template <class P>
struct is_known_policy
    : std::bool_constant<is_data_parallel_v<P> || is_pipeline_parallel_v<P> ||
                         is_tensor_parallel_v<P> || is_precision_v<P> || is_sp<P>::value> {};

// The policy of a kind, or Default when absent.
template <template <class> class Pred, class Default, class... Ps>
struct pick {
  using type = Default;
};
template <template <class> class Pred, class Default, class P, class... Ps>
struct pick<Pred, Default, P, Ps...> {
  using type = std::conditional_t<Pred<P>::value, P, typename pick<Pred, Default, Ps...>::type>;
};
} // namespace detail

/*! \brief Marks a policy kind the strategy does not use. */
struct NoPolicy {
  /*! \brief Name for logs. */
  static constexpr char const* name() { return "none"; }
};

/*! \brief A training strategy: a set of policies, each optional, in any order.
 *  The empty strategy (telar::Serial) trains on one rank.
 *  \tparam Policies DataParallel<...>, PipelineParallel<...>, TensorParallel<...>,
 *  SpatialParallel, Precision<...> */
template <class... Policies>
struct Strategy {
  static_assert((detail::is_known_policy<Policies>::value && ...),
                "telar::Strategy: unknown policy; a strategy is made of telar::DataParallel<>, "
                "telar::PipelineParallel<>, telar::TensorParallel<>, telar::SpatialParallel "
                "and telar::Precision<>");
  static_assert(detail::count_if_v<detail::is_dp, Policies...> <= 1,
                "telar::Strategy: DataParallel appears more than once; name each policy at most "
                "once");
  static_assert(detail::count_if_v<detail::is_pp, Policies...> <= 1,
                "telar::Strategy: PipelineParallel appears more than once; name each policy at "
                "most once");
  static_assert(detail::count_if_v<detail::is_tp, Policies...> <= 1,
                "telar::Strategy: TensorParallel appears more than once; name each policy at "
                "most once");
  static_assert(detail::count_if_v<detail::is_sp, Policies...> <= 1,
                "telar::Strategy: SpatialParallel appears more than once; name each policy at "
                "most once");
  static_assert(detail::count_if_v<detail::is_precision, Policies...> <= 1,
                "telar::Strategy: Precision appears more than once; name each policy at most "
                "once");

  /*! \brief The DataParallel policy, or NoPolicy. */
  using data_parallel = typename detail::pick<detail::is_dp, NoPolicy, Policies...>::type;
  /*! \brief The PipelineParallel policy, or NoPolicy. */
  using pipeline_parallel = typename detail::pick<detail::is_pp, NoPolicy, Policies...>::type;
  /*! \brief The TensorParallel policy, or NoPolicy. */
  using tensor_parallel = typename detail::pick<detail::is_tp, NoPolicy, Policies...>::type;

  /*! \brief SpatialParallel, or NoPolicy. */
  using spatial_parallel = typename detail::pick<detail::is_sp, NoPolicy, Policies...>::type;

  /*! \brief The Precision policy; Precision<float, float> when absent. */
  using precision =
      typename detail::pick<detail::is_precision, Precision<float, float>, Policies...>::type;

  /*! \brief Data parallelism is enabled. */
  static constexpr bool has_data_parallel = !std::is_same_v<data_parallel, NoPolicy>;
  /*! \brief Pipeline parallelism is enabled. */
  static constexpr bool has_pipeline_parallel = !std::is_same_v<pipeline_parallel, NoPolicy>;
  /*! \brief Tensor parallelism is enabled. */
  static constexpr bool has_tensor_parallel = !std::is_same_v<tensor_parallel, NoPolicy>;
  /*! \brief Samples are split over ranks (spatial parallelism). */
  static constexpr bool has_spatial_parallel = !std::is_same_v<spatial_parallel, NoPolicy>;

  /*! \brief e.g. "dp+pp+tp", or "serial". */
  static std::string name() {
    std::string n;
    auto add = [&](bool on, char const* s) {
      if (on)
        n += (n.empty() ? "" : "+") + std::string(s);
    };
    add(has_data_parallel, "dp");
    add(has_spatial_parallel, "sp");
    add(has_pipeline_parallel, "pp");
    add(has_tensor_parallel, "tp");
    n = n.empty() ? "serial" : n;
    n += precision::bf16_compute ? "+bf16" : "";
    return precision::bf16_reduce ? n + "+bf16-reduce" : n;
  }
};

namespace detail {
// The strategy's schedule tag; 1F1B without pipeline parallelism (the
// schedule of gradient accumulation).
template <class S, class = void>
struct pipeline_schedule_of {
  using type = OneFOneB;
};
template <class S>
struct pipeline_schedule_of<S, std::enable_if_t<S::has_pipeline_parallel>> {
  using type = typename S::pipeline_parallel::schedule;
};
} // namespace detail

/*! \brief Serial training: one rank, no communication. */
using Serial = Strategy<>;

/*! \brief True for telar::Strategy types. \tparam S a type */
template <class S>
inline constexpr bool is_strategy_v = false;
/*! \brief True for telar::Strategy types. \tparam Ps policies */
template <class... Ps>
inline constexpr bool is_strategy_v<Strategy<Ps...>> = true;

} // namespace telar
