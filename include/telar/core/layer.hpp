#pragma once
/*! \file
 *  \brief The Layer concept: what a user-supplied layer functor provides, and
 *  the compile-time checks applied where a layer enters Telar's API.
 *
 *  A layer is a plain struct (no virtual functions). Minimal example:
 *  \code
 *  struct Scale {                       // y = 2 x, no parameters
 *    using value_type = float;
 *    using memory_space = telar::DefaultMemorySpace;
 *    telar::Shape output_shape(telar::Shape const& in) const { return in; }
 *    template <class Exec>
 *    void forward(Exec const& exec, telar::ConstMatrix<float> x, telar::Matrix<float> y,
 *                 telar::NoSaved&) const {
 *      Kokkos::parallel_for(Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(
 *          exec, {0, 0}, {x.extent(0), x.extent(1)}),
 *          KOKKOS_LAMBDA(int i, int j) { y(i, j) = 2 * x(i, j); });
 *    }
 *    template <class Exec>
 *    void backward_input(Exec const& exec, telar::ConstMatrix<float> dy,
 *                        telar::Matrix<float> dx, telar::NoSaved const&) const {
 *      Kokkos::parallel_for(Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(
 *          exec, {0, 0}, {dy.extent(0), dy.extent(1)}),
 *          KOKKOS_LAMBDA(int i, int j) { dx(i, j) = 2 * dy(i, j); });
 *    }
 *  };
 *  \endcode
 *
 *  Required members:
 *  - `value_type`, `memory_space`;
 *  - `telar::Shape output_shape(telar::Shape const& in) const`: the
 *    per-sample output shape (rank 1 to 4) for a per-sample input shape;
 *    throws telar::ShapeError (saying what it accepts) for an input it cannot
 *    take. A batch is stored as a row-major [samples, shape.size()] matrix;
 *    telar::as_tensor reads it by natural indices, e.g. [n, C, H, W];
 *  - `forward(exec, x, y, saved)`: writes y = f(x) and stores in `saved` what
 *    backward needs (several micro-batches can be in flight, each with its own
 *    `saved`);
 *  - either `backward_input(exec, dy, dx, saved)` (dL/dx, on the critical
 *    path) plus, for layers with parameters, `backward_weight(exec, dy, saved)`
 *    (accumulates dL/dW into the gradients), or one fused
 *    `backward(exec, dy, dx, saved)` that does both. The split lets zero-bubble
 *    pipeline schedules fill the bubble with weight gradients and lets data
 *    parallelism start reducing gradients early; a fused layer still runs
 *    under every schedule, with its weight work done in the input phase.
 *
 *  Optional members:
 *  - `using saved_type = S;` (default NoSaved): per-micro-batch state;
 *  - `template <class F> void parameters(F&& f)`: calls `f(name, value, grad)`
 *    for each parameter, where value and grad are Kokkos::View members of the
 *    same type. Telar rebinds both views to slices of contiguous flat buffers
 *    (for bucketed reductions and sharding), so a layer must reach its
 *    parameters only through these members;
 *  - `template <class F> void buffers(F&& f)`: calls `f(name, view)` for each
 *    *buffer*, non-trained state the forward updates (BatchNorm's
 *    "running_mean" and "running_var"): a Kokkos::View member. Telar
 *    checkpoints buffers, returns them from telar::gather_model, counts them
 *    in memory plans and keeps them identical on every data-parallel rank
 *    (averaged after each step); they get no gradient and no optimizer;
 *  - `std::size_t buffer_count() const` (valid after build()): buffer values
 *    this rank holds, for memory plans;
 *  - `void initialize(std::uint64_t seed)`: allocates and fills parameters.
 *    Telar calls it only on ranks that own the layer, so a layer that
 *    allocates here rather than in its constructor costs no memory elsewhere;
 *  - `void build(telar::Shape const& in)`: called once, before
 *    initialize(), with the input shape the model gives the layer, for layers
 *    that need it in forward (a convolution's height and width);
 *  - `static constexpr telar::Shape static_input_shape, static_output_shape`:
 *    shapes known at compile time, checked between neighbours by
 *    telar::Sequential (`preserves_shape = true` lets them flow through);
 *  - `telar::Shape input_shape() const`: the input shape the layer was made
 *    for (an unknown Shape{}: any), checked at run time;
 *  - `static constexpr char const* name()` or a `name()` member, used in
 *    messages and traces;
 *  - `double flops(std::size_t samples, telar::Shape const& in) const`: cost
 *    estimate for balancing pipeline stages;
 *  - `std::size_t parameter_count() const` (valid after build()): parameter
 *    values this rank holds (a tensor-parallel shard's), for memory plans;
 *  - `std::size_t saved_bytes(std::size_t samples, telar::Shape const& in)
 *    const`: bytes the layer allocates into its saved state per micro-batch
 *    of \p samples (0 when it keeps only views), for memory plans; a block
 *    counts its parts' and the buffers it allocates itself;
 *  - `static constexpr telar::BackwardReads backward_reads`: which of the
 *    tensors forward was given its backward reads (through views kept in
 *    `saved`): `input`, `output`, `both` or `nothing`. A tensor no backward
 *    reads is not kept per micro-batch: the stage runner gives it a buffer
 *    shared by the micro-batches in flight, overwritten by the next forward.
 *    Default: `nothing` for a layer without saved_type (it has nowhere to
 *    keep a view), `both` otherwise;
 *  - `std::size_t compact_bytes(std::size_t samples, telar::Shape const& in)
 *    const`, with a `bool compact` member of saved_type: the layer can keep
 *    its own compact copy of what its backward reads instead of a view (a
 *    ReLU its output's signs, a bf16 Dense its input in bf16). Where no
 *    other backward reads that tensor, the stage runner sets `compact`
 *    before forward and does not keep the tensor per micro-batch; the
 *    layer's saved state then allocates compact_bytes() (counted by the
 *    memory plan in place of saved_bytes()); a nested telar::Sequential
 *    does the same for its inner layers when it has its stage's shared
 *    pool. Elsewhere (graph units, a block run on its own, a tensor read by
 *    a neighbour too) `compact` stays false and the layer keeps its view;
 *  - `std::size_t workspace_bytes(std::size_t samples, telar::Shape const&
 *    in) const`: bytes the layer keeps for itself between calls, shared by
 *    every micro-batch (allocations labelled "...::workspace", e.g. a
 *    convolution's columns), for memory plans;
 *  - `void set_training_batch(std::size_t samples)` (on a layer with a random
 *    counter, which telar::set_training_batch reaches through blocks): the
 *    samples of each micro-batch it will train on, set by telar::Trainer
 *    before its shape pass, so that output_shape() can refuse what forward
 *    could not train (BatchNorm: one value per channel) before any step.
 *
 *  Optional members for tensor parallelism (telar/parallel/tensor_parallel.hpp):
 *  - `void set_tensor_parallel(telar::TensorParallelContext const& ctx)`: the
 *    layer learns its tensor-parallel group (communicator, rank, size,
 *    allreduce algorithm) and from then on holds only its shard. Telar calls it
 *    on every layer that has it, on every rank, before `input_shape()`,
 *    `output_shape()` or `initialize()`, so the shapes and the
 *    parameters it reports are the local (sharded) ones. A layer without it is
 *    replicated: every rank of the group holds all of it.
 *  - `int parameter_replicas(std::string const& name) const`: how many ranks
 *    of the tensor-parallel group hold an identical copy of parameter \p name
 *    (1: a shard, the group size: replicated). Norms over the group (gradient
 *    clipping, LAMB) divide by it so a replicated tensor counts once. Default:
 *    1 for a layer with set_tensor_parallel, the group size for one without
 *    (see telar::parameter_replicas).
 *  - `telar::TensorBlock parameter_block(std::string const& name,
 *    std::vector<std::size_t> const& local) const`: where this rank's tensor
 *    \p name (of shape \p local) lies in the whole tensor: its global shape
 *    and the offset of the local block (checkpoints and telar::gather_model
 *    assemble whole tensors from it). Default: the local tensor is the whole
 *    tensor (see telar::parameter_block).
 *
 *  Optional member for data parallelism (telar/parallel/data_parallel.hpp):
 *  - `void set_data_parallel(telar::DataParallelContext const& ctx)` (may be
 *    a template over the context type): the layer learns its data-parallel
 *    group, for reductions inside forward and backward (BatchNorm with
 *    telar::SyncStats). telar::Trainer calls it on every layer that has it.
 *
 *  Only a forward declaration of telar::TensorParallelContext is needed here,
 *  so core/ stays free of MPI: a layer that names the context includes
 *  telar/parallel/tensor_parallel.hpp itself.
 */
#include <telar/core/detail/type_traits.hpp>
#include <telar/core/shape.hpp>
#include <telar/core/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace telar {

// Defined in telar/parallel/tensor_parallel.hpp (which may use MPI); the
// concept only needs its name.
struct TensorParallelContext;
// Defined in telar/parallel/data_parallel.hpp, likewise.
struct DataParallelContext;

/*! \brief Saved state of a layer that needs none. */
struct NoSaved {};

/*! \brief Which tensors given to a layer's forward its backward reads (the
 *  optional member `backward_reads`; see telar::layer_traits). */
enum class BackwardReads : unsigned char { nothing = 0, input = 1, output = 2, both = 3 };
/*! \brief Whether \p r includes the forward's input. */
constexpr bool reads_input(BackwardReads r) {
  return (unsigned(r) & 1u) != 0;
}
/*! \brief Whether \p r includes the forward's output. */
constexpr bool reads_output(BackwardReads r) {
  return (unsigned(r) & 2u) != 0;
}

namespace detail {
template <class L>
using value_type_t = typename L::value_type;
template <class L>
using memory_space_t = typename L::memory_space;
template <class L>
using saved_type_t = typename L::saved_type;
template <class L>
using output_shape_t =
    decltype(Shape(std::declval<L const&>().output_shape(std::declval<Shape const&>())));
template <class L>
using input_shape_t = decltype(Shape(std::declval<L const&>().input_shape()));
template <class L>
using build_t = decltype(std::declval<L&>().build(std::declval<Shape const&>()));
template <class L>
using static_input_shape_t = decltype(Shape(L::static_input_shape));
template <class L>
using static_output_shape_t = decltype(Shape(L::static_output_shape));
template <class L>
using preserves_shape_t = std::bool_constant<bool(L::preserves_shape)>;
template <class L>
using backward_input_first_t = std::bool_constant<bool(L::backward_input_first)>;
template <class L>
using backward_reads_t = decltype(BackwardReads(L::backward_reads));
template <class L>
using initialize_t = decltype(std::declval<L&>().initialize(std::uint64_t{}));
template <class L>
using static_name_t = decltype(L::name());
template <class L>
using parameter_count_t = decltype(std::size_t(std::declval<L const&>().parameter_count()));
template <class L>
using saved_bytes_t = decltype(std::size_t(
    std::declval<L const&>().saved_bytes(std::size_t{}, std::declval<Shape const&>())));
template <class L>
using compact_bytes_t = decltype(std::size_t(
    std::declval<L const&>().compact_bytes(std::size_t{}, std::declval<Shape const&>())));
template <class L>
using workspace_bytes_t = decltype(std::size_t(
    std::declval<L const&>().workspace_bytes(std::size_t{}, std::declval<Shape const&>())));
template <class L>
using flops_t =
    decltype(double(std::declval<L const&>().flops(std::size_t{}, std::declval<Shape const&>())));
// A reference to the incomplete context type is enough for detection.
template <class L>
using set_tensor_parallel_t =
    decltype(std::declval<L&>().set_tensor_parallel(std::declval<TensorParallelContext const&>()));
template <class L>
using set_data_parallel_t =
    decltype(std::declval<L&>().set_data_parallel(std::declval<DataParallelContext const&>()));
template <class L>
using buffer_count_t = decltype(std::size_t(std::declval<L const&>().buffer_count()));
template <class L>
using parameter_replicas_t =
    decltype(int(std::declval<L const&>().parameter_replicas(std::declval<std::string const&>())));
template <class L>
using parameter_block_t = decltype(std::declval<L const&>().parameter_block(
    std::declval<std::string const&>(), std::declval<std::vector<std::size_t> const&>()));

// The four call shapes, detected with the layer's own memory space and the
// default execution space that can reach it.
template <class L>
using layer_exec_t = typename detected_or_t<DefaultMemorySpace, memory_space_t, L>::execution_space;
template <class L>
using layer_value_t = detected_or_t<float, value_type_t, L>;
template <class L>
using layer_mspace_t = detected_or_t<DefaultMemorySpace, memory_space_t, L>;
template <class L>
using layer_saved_t = detected_or_t<NoSaved, saved_type_t, L>;

template <class L>
using forward_t = decltype(std::declval<L&>().forward(
    std::declval<layer_exec_t<L> const&>(),
    std::declval<ConstMatrix<layer_value_t<L>, layer_mspace_t<L>>>(),
    std::declval<Matrix<layer_value_t<L>, layer_mspace_t<L>>>(),
    std::declval<layer_saved_t<L>&>()));
template <class L>
using backward_input_t = decltype(std::declval<L&>().backward_input(
    std::declval<layer_exec_t<L> const&>(),
    std::declval<ConstMatrix<layer_value_t<L>, layer_mspace_t<L>>>(),
    std::declval<Matrix<layer_value_t<L>, layer_mspace_t<L>>>(),
    std::declval<layer_saved_t<L> const&>()));
template <class L>
using backward_weight_t = decltype(std::declval<L&>().backward_weight(
    std::declval<layer_exec_t<L> const&>(),
    std::declval<ConstMatrix<layer_value_t<L>, layer_mspace_t<L>>>(),
    std::declval<layer_saved_t<L> const&>()));
template <class L>
using backward_fused_t = decltype(std::declval<L&>().backward(
    std::declval<layer_exec_t<L> const&>(),
    std::declval<ConstMatrix<layer_value_t<L>, layer_mspace_t<L>>>(),
    std::declval<Matrix<layer_value_t<L>, layer_mspace_t<L>>>(),
    std::declval<layer_saved_t<L> const&>()));

// parameters(f) is detected with a visitor accepting anything.
struct AnyParameterVisitor {
  template <class V, class G>
  void operator()(char const*, V&, G&) const {}
};
template <class L>
using parameters_t = decltype(std::declval<L&>().parameters(std::declval<AnyParameterVisitor&>()));
// buffers(f) likewise.
struct AnyBufferVisitor {
  template <class V>
  void operator()(char const*, V&) const {}
};
template <class L>
using buffers_t = decltype(std::declval<L&>().buffers(std::declval<AnyBufferVisitor&>()));

/// \cond TELAR_INTERNAL
// Whether a class has a member of a given name at all, whatever its
// signature: with a fallback member of that name in a second base, naming it
// is ambiguous exactly when the layer has one. Lets the checks below say
// "wrong signature" rather than "missing".
#define TELAR_DETAIL_HAS_MEMBER_NAMED(member)                                                      \
  struct member##_fallback {                                                                       \
    int member;                                                                                    \
  };                                                                                               \
  template <class L>                                                                               \
  struct member##_probe : L, member##_fallback {};                                                 \
  template <class L>                                                                               \
  using member##_unnamed_t = decltype(&member##_probe<L>::member);                                 \
  template <class L>                                                                               \
  constexpr bool has_member_named_##member() {                                                     \
    if constexpr (std::is_class_v<L> && !std::is_final_v<L>)                                       \
      return !is_detected_v<member##_unnamed_t, L>;                                                \
    else                                                                                           \
      return false;                                                                                \
  }
TELAR_DETAIL_HAS_MEMBER_NAMED(forward)
TELAR_DETAIL_HAS_MEMBER_NAMED(backward_input)
TELAR_DETAIL_HAS_MEMBER_NAMED(backward_weight)
TELAR_DETAIL_HAS_MEMBER_NAMED(backward)
TELAR_DETAIL_HAS_MEMBER_NAMED(output_shape)
#undef TELAR_DETAIL_HAS_MEMBER_NAMED
/// \endcond

template <class L>
constexpr Shape static_input_shape_of() {
  if constexpr (is_detected_v<static_input_shape_t, L>)
    return L::static_input_shape;
  else
    return Shape{};
}
template <class L>
constexpr Shape static_output_shape_of() {
  if constexpr (is_detected_v<static_output_shape_t, L>)
    return L::static_output_shape;
  else
    return Shape{};
}
// A layer that does not say may keep a view of either tensor, unless it
// keeps nothing at all.
template <class L>
constexpr BackwardReads backward_reads_of() {
  if constexpr (is_detected_v<backward_reads_t, L>)
    return L::backward_reads;
  else if constexpr (std::is_same_v<layer_saved_t<L>, NoSaved>)
    return BackwardReads::nothing;
  else
    return BackwardReads::both;
}
} // namespace detail

/*! \brief What Telar knows about a layer type, with defaults for the optional
 *  members.
 *  \tparam L a layer functor type */
template <class L>
struct layer_traits {
  /*! \brief Scalar type of activations and parameters. */
  using value_type = typename L::value_type;
  /*! \brief Memory space of activations and parameters. */
  using memory_space = typename L::memory_space;
  /*! \brief Per-micro-batch state from forward to backward. */
  using saved_type = detail::layer_saved_t<L>;
  /*! \brief Input shape known at compile time, or an unknown Shape{}. */
  static constexpr Shape static_input_shape = detail::static_input_shape_of<L>();
  /*! \brief Output shape known at compile time, or an unknown Shape{}. */
  static constexpr Shape static_output_shape = detail::static_output_shape_of<L>();
  /*! \brief The layer provides backward_input (and backward_weight if it has parameters). */
  static constexpr bool has_split_backward = detail::is_detected_v<detail::backward_input_t, L>;
  /*! \brief The layer provides a fused backward. */
  static constexpr bool has_fused_backward = detail::is_detected_v<detail::backward_fused_t, L>;
  /*! \brief The layer provides backward_weight. */
  static constexpr bool has_backward_weight = detail::is_detected_v<detail::backward_weight_t, L>;
  /*! \brief The layer exposes parameters. */
  static constexpr bool has_parameters = detail::is_detected_v<detail::parameters_t, L>;
  /*! \brief A split layer whose backward_weight needs what its
   *  backward_input computes (a block's inner gradients): when both run
   *  together, the input part goes first (`static constexpr bool
   *  backward_input_first = true`). */
  static constexpr bool backward_input_first = detail::flag_v<detail::backward_input_first_t, L>;
  /*! \brief Which tensors given to forward the backward reads
   *  (`static constexpr telar::BackwardReads backward_reads`; default:
   *  `nothing` without a saved_type, else `both`). */
  static constexpr BackwardReads backward_reads = detail::backward_reads_of<L>();
  /*! \brief The layer exposes buffers (non-trained state, buffers(f)). */
  static constexpr bool has_buffers = detail::is_detected_v<detail::buffers_t, L>;
  /*! \brief The layer says how many buffer values it holds (buffer_count(),
   *  for memory plans). */
  static constexpr bool has_buffer_count = detail::is_detected_v<detail::buffer_count_t, L>;
  /*! \brief The layer takes the data-parallel group (set_data_parallel). */
  static constexpr bool has_data_parallel = detail::is_detected_v<detail::set_data_parallel_t, L>;
  /*! \brief The layer says how many parameter values it holds
   *  (parameter_count(), for memory plans). */
  static constexpr bool has_parameter_count = detail::is_detected_v<detail::parameter_count_t, L>;
  /*! \brief The layer says how many bytes its saved state allocates per
   *  micro-batch (saved_bytes(samples, in), for memory plans). */
  static constexpr bool has_saved_bytes = detail::is_detected_v<detail::saved_bytes_t, L>;
  /*! \brief The layer can keep a compact copy of what its backward reads
   *  instead of a view (compact_bytes(samples, in) and saved_type::compact). */
  static constexpr bool has_compact_copy = detail::is_detected_v<detail::compact_bytes_t, L>;
  /*! \brief The layer says how many bytes of workspace it keeps between
   *  calls (workspace_bytes(samples, in), for memory plans). */
  static constexpr bool has_workspace_bytes = detail::is_detected_v<detail::workspace_bytes_t, L>;
  /*! \brief The layer has a build(input shape) hook. */
  static constexpr bool has_build = detail::is_detected_v<detail::build_t, L>;
  /*! \brief The layer has an initialize(seed) hook. */
  static constexpr bool has_initialize = detail::is_detected_v<detail::initialize_t, L>;
  /*! \brief The layer can be split over a tensor-parallel group
   *  (set_tensor_parallel). */
  static constexpr bool has_tensor_parallel =
      detail::is_detected_v<detail::set_tensor_parallel_t, L>;
  /*! \brief The layer says how many ranks of its tensor-parallel group hold
   *  each parameter (parameter_replicas). */
  static constexpr bool has_parameter_replicas =
      detail::is_detected_v<detail::parameter_replicas_t, L>;
};

namespace detail {
// What a chain run as one layer reads (telar::Sequential nested): its first
// layer's input and its last layer's output are the block's; the
// activations in between are its own.
template <class First, class Last>
constexpr BackwardReads chain_reads() {
  return BackwardReads((reads_input(layer_traits<First>::backward_reads) ? 1u : 0u) |
                       (reads_output(layer_traits<Last>::backward_reads) ? 2u : 0u));
}
} // namespace detail

namespace detail {
// What blocks use to forward the buffer members of the layers they hold.
// Calls f(prefix + name, view) for each buffer of l (nothing if it has none).
template <class L, class F>
void prefixed_buffers(L& l, std::string const& prefix, F& f) {
  if constexpr (layer_traits<L>::has_buffers)
    l.buffers([&](char const* name, auto& view) {
      std::string const full = prefix + name;
      f(full.c_str(), view);
    });
}
// l's buffer values (0 without buffer_count()).
template <class L>
std::size_t buffer_count_of(L const& l) {
  if constexpr (layer_traits<L>::has_buffer_count)
    return l.buffer_count();
  else
    return (void)l, 0;
}
template <class M>
using layer_prefix_t = decltype(std::declval<M const&>().layer_prefix(std::size_t{}));
// The model-wide name prefix of layer k's parameters and buffers:
// "layer<k>.", or the model's own (telar::GraphChain's units are all layer 0,
// so a graph keeps its names at every pipeline split).
template <class Model>
std::string layer_prefix(Model const& model, std::size_t k) {
  if constexpr (is_detected_v<layer_prefix_t, Model>)
    return model.layer_prefix(k);
  else
    return (void)model, "layer" + std::to_string(k) + ".";
}

// Passes a data-parallel context to l if it takes one.
template <class L, class Context>
void pass_data_parallel(L& l, Context const& ctx) {
  if constexpr (layer_traits<L>::has_data_parallel)
    l.set_data_parallel(ctx);
  else
    (void)l, (void)ctx;
}
} // namespace detail

/*! \brief True when \p L satisfies the Layer concept. \tparam L a type */
template <class L>
inline constexpr bool is_layer_v = detail::is_detected_v<detail::value_type_t, L>&&
                                       detail::is_detected_v<detail::memory_space_t, L>&&
                                           detail::is_detected_v<detail::output_shape_t, L>&&
                                               detail::is_detected_v<detail::forward_t, L> &&
                                   (detail::is_detected_v<detail::backward_input_t, L> ||
                                    detail::is_detected_v<detail::backward_fused_t, L>);

/*! \brief Name of a layer for messages: its name() if it has one, else "layer". */
template <class L>
std::string layer_name(L const& layer) {
  if constexpr (detail::is_detected_v<detail::static_name_t, L>) {
    (void)layer;
    return std::string(L::name());
  } else {
    return "layer";
  }
}

/*! \brief How many ranks of a tensor-parallel group of \p tp_size ranks hold
 *  an identical copy of parameter \p name of \p layer.
 *
 *  The layer's own parameter_replicas(name) if it has one; else 1 if it has
 *  set_tensor_parallel (it shards what it holds); else \p tp_size (a layer
 *  that knows nothing of tensor parallelism is replicated on every rank).
 *  \param layer the layer \param name parameter name as passed to parameters(f)
 *  \param tp_size ranks in the tensor-parallel group */
template <class L>
int parameter_replicas(L const& layer, std::string const& name, int tp_size) {
  if constexpr (detail::is_detected_v<detail::parameter_replicas_t, L>) {
    (void)tp_size;
    return layer.parameter_replicas(name);
  } else if constexpr (detail::is_detected_v<detail::set_tensor_parallel_t, L>) {
    (void)layer, (void)name, (void)tp_size;
    return 1;
  } else {
    (void)layer, (void)name;
    return tp_size;
  }
}

/*! \brief Where one rank's part of a parameter tensor lies in the whole
 *  (global) tensor: a block of the local tensor's extents starting at
 *  \p offset. Row-major in both. */
struct TensorBlock {
  std::vector<std::size_t> shape;  //!< extents of the whole tensor
  std::vector<std::size_t> offset; //!< first index of the local block, per dimension
};

/*! \brief The block of parameter \p name of \p layer that this rank holds:
 *  the layer's own parameter_block(name, local) if it has one; else the local
 *  tensor is the whole tensor (offset 0).
 *  \param layer the layer \param name parameter name as passed to parameters(f)
 *  \param local the local tensor's extents */
template <class L>
TensorBlock parameter_block(L const& layer, std::string const& name,
                            std::vector<std::size_t> const& local) {
  if constexpr (detail::is_detected_v<detail::parameter_block_t, L>) {
    return layer.parameter_block(name, local);
  } else {
    (void)layer, (void)name;
    return TensorBlock{local, std::vector<std::size_t>(local.size(), 0)};
  }
}

namespace detail {

// Bytes a Kokkos::View of `elements` values of T allocates: Kokkos rounds
// every allocation up to whole 8 bytes (what the memory meter sees).
template <class T>
constexpr std::size_t view_bytes(std::size_t elements) {
  return (elements * sizeof(T) + 7) / 8 * 8;
}

// For blocks summing their parts' sizes (memory plans): a layer without
// parameter_count() / saved_bytes() contributes 0 (the plan warns only for
// the model's own layers, so every built-in has both where they apply).
template <class L>
std::size_t parameter_count_of(L const& layer) {
  if constexpr (is_detected_v<parameter_count_t, L>)
    return layer.parameter_count();
  else
    return (void)layer, 0;
}
template <class L>
std::size_t saved_bytes_of(L const& layer, std::size_t samples, Shape const& in) {
  if constexpr (is_detected_v<saved_bytes_t, L>)
    return layer.saved_bytes(samples, in);
  else
    return (void)layer, (void)samples, (void)in, 0;
}
// What the saved state allocates when the runner asks for a compact copy
// (`compact`; see the concept) or not.
template <class L>
std::size_t saved_bytes_of(L const& layer, std::size_t samples, Shape const& in, bool compact) {
  if constexpr (is_detected_v<compact_bytes_t, L>)
    if (compact)
      return layer.compact_bytes(samples, in);
  return saved_bytes_of(layer, samples, in);
}
template <class L>
std::size_t workspace_bytes_of(L const& layer, std::size_t samples, Shape const& in) {
  if constexpr (is_detected_v<workspace_bytes_t, L>)
    return layer.workspace_bytes(samples, in);
  else
    return (void)layer, (void)samples, (void)in, 0;
}

// For wrappers passing a layer's optional members through: draws l's
// parameters from `seed`, visits them with f; nothing where l has none.
template <class L>
void initialize_layer(L& l, std::uint64_t seed) {
  if constexpr (layer_traits<L>::has_initialize)
    l.initialize(seed);
  else
    (void)l, (void)seed;
}
template <class L, class F>
void visit_parameters(L& l, F&& f) {
  if constexpr (layer_traits<L>::has_parameters)
    l.parameters(std::forward<F>(f));
  else
    (void)l, (void)f;
}

// Checked where a layer enters the API (telar::Sequential): one message per
// missing piece, naming the API and what to add.
template <class L>
constexpr bool check_layer() {
  static_assert(is_detected_v<value_type_t, L>,
                "telar::Sequential: a layer must declare `using value_type = <float|double>;`");
  static_assert(is_detected_v<memory_space_t, L>,
                "telar::Sequential: a layer must declare `using memory_space = <Kokkos memory "
                "space>;` (telar::DefaultMemorySpace if unsure)");
  static_assert(is_detected_v<output_shape_t, L> || has_member_named_output_shape<L>(),
                "telar::Sequential: a layer must provide `telar::Shape output_shape(telar::Shape "
                "const& in) const`");
  static_assert(is_detected_v<output_shape_t, L> || !has_member_named_output_shape<L>(),
                "telar::Sequential: the layer's output_shape has the wrong signature; expected "
                "`telar::Shape output_shape(telar::Shape const& in) const`");
  static_assert(is_detected_v<forward_t, L> || has_member_named_forward<L>(),
                "telar::Sequential: a layer must provide `template <class Exec> void "
                "forward(Exec const& exec, telar::ConstMatrix<T, memory_space> x, "
                "telar::Matrix<T, memory_space> y, saved_type& saved) const`");
  static_assert(is_detected_v<forward_t, L> || !has_member_named_forward<L>(),
                "telar::Sequential: the layer's forward has the wrong signature; expected "
                "`template <class Exec> void forward(Exec const& exec, telar::ConstMatrix<T, "
                "memory_space> x, telar::Matrix<T, memory_space> y, saved_type& saved) const`");
  static_assert(is_detected_v<backward_input_t, L> || is_detected_v<backward_fused_t, L> ||
                    has_member_named_backward_input<L>() || has_member_named_backward<L>(),
                "telar::Sequential: a layer must provide `backward_input(exec, ConstMatrix<T> dy, "
                "Matrix<T> dx, saved_type const&)` or a fused `backward(exec, dy, dx, saved)`");
  static_assert(is_detected_v<backward_input_t, L> || !has_member_named_backward_input<L>(),
                "telar::Sequential: the layer's backward_input has the wrong signature; expected "
                "`template <class Exec> void backward_input(Exec const& exec, "
                "telar::ConstMatrix<T, memory_space> dy, telar::Matrix<T, memory_space> dx, "
                "saved_type const& saved) const`");
  static_assert(is_detected_v<backward_fused_t, L> || !has_member_named_backward<L>(),
                "telar::Sequential: the layer's backward has the wrong signature; expected "
                "`template <class Exec> void backward(Exec const& exec, telar::ConstMatrix<T, "
                "memory_space> dy, telar::Matrix<T, memory_space> dx, saved_type const& saved) "
                "const`");
  static_assert(is_detected_v<backward_weight_t, L> || !has_member_named_backward_weight<L>(),
                "telar::Sequential: the layer's backward_weight has the wrong signature; expected "
                "`template <class Exec> void backward_weight(Exec const& exec, "
                "telar::ConstMatrix<T, memory_space> dy, saved_type const& saved) const`");
  static_assert(!(is_detected_v<parameters_t, L> && is_detected_v<backward_input_t, L> &&
                  !is_detected_v<backward_weight_t, L> && !is_detected_v<backward_fused_t, L>),
                "telar::Sequential: a layer with parameters and backward_input must also provide "
                "`backward_weight(exec, ConstMatrix<T> dy, saved_type const&)`");
  static_assert(
      !is_detected_v<backward_weight_t, L> || is_detected_v<parameters_t, L>,
      "telar::Sequential: a layer with backward_weight must expose its parameters: add "
      "`template <class F> void parameters(F&& f) { f(\"weight\", weight, weight_grad); }` "
      "(without it Telar cannot reduce, shard or update them, and they never train)");
  static_assert(!is_detected_v<parameter_replicas_t, L> || is_detected_v<set_tensor_parallel_t, L>,
                "telar::Sequential: a layer with parameter_replicas must also provide `void "
                "set_tensor_parallel(telar::TensorParallelContext const&)` (it cannot know the "
                "group size otherwise)");
  static_assert(std::is_copy_constructible_v<layer_saved_t<L>> &&
                    std::is_default_constructible_v<layer_saved_t<L>>,
                "telar::Sequential: a layer's saved_type must be default- and copy-constructible");
  return true;
}

} // namespace detail
} // namespace telar
