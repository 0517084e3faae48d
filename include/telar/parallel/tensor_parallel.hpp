#pragma once
/*! \file
 *  \brief Megatron-style tensor parallelism: telar::TensorParallelContext and
 *  the layer wrappers telar::ColumnParallel and telar::RowParallel.
 *
 *  A Column/Row pair splits an MLP block over the ranks of a tensor-parallel
 *  (tp) group:
 *  \code
 *  // x [n, in] replicated -> h [n, hidden/tp] sharded -> y [n, out] replicated
 *  using Block = telar::Sequential<telar::ColumnParallel<telar::Dense<float>>, telar::GELU<float>,
 *                                  telar::RowParallel<telar::Dense<float>>>;
 *  Block block(telar::ColumnParallel<telar::Dense<float>>(in, hidden), {},
 *              telar::RowParallel<telar::Dense<float>>(hidden, out));   // full sizes
 *  telar::set_tensor_parallel(block, telar::TensorParallelContext(grid.tp()));
 *  auto features = block.feature_sizes(in); // {in, hidden_local, hidden_local, out}
 *  block.initialize(seed);                  // each rank draws its block of the serial values
 *  \endcode
 *  The pair costs one allreduce of [n, out] in forward (RowParallel) and one
 *  of [n, in] in backward (ColumnParallel::backward_input); the activation
 *  between them stays sharded. Both are position-wise, like Dense: on
 *  [seq, in] samples they map every position (x [n, seq * in]).
 *  docs/tensor_parallel.md has the details.
 */
#include <telar/comm/allreduce.hpp>
#include <telar/comm/communicator.hpp>
#include <telar/comm/device_buffer.hpp>
#include <telar/core/detail/decl.hpp>
#include <telar/core/detail/type_traits.hpp>
#include <telar/core/error.hpp>
#include <telar/core/gemm.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/parameters.hpp>
#include <telar/core/sequential.hpp>
#include <telar/core/tensor.hpp>
#include <telar/layers/dense.hpp>
#include <telar/parallel/detail/tensor_parallel.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <variant>

namespace telar {

/*! \brief The allreduce algorithm of a tensor-parallel group, chosen at run
 *  time. RingAllreduce (the default) matches MPI_Allreduce's speed at tp
 *  sizes; MpiAllreduce goes through MPI_Iallreduce, which Open MPI runs 1.5 to
 *  3 times slower than its blocking MPI_Allreduce (docs/comm.md). */
using TensorParallelAllreduce =
    std::variant<RingAllreduce, MpiAllreduce, RecursiveHalvingDoubling, HierarchicalAllreduce>;

/*! \brief What tensor-parallel layers handed to allreduce: a host-side
 *  counter a caller may attach to a TensorParallelContext. */
struct TensorParallelTraffic {
  std::uint64_t allreduces = 0; //!< allreduce calls (size-1 groups make none)
  std::uint64_t bytes = 0;      //!< payload bytes, each call's buffer size on this rank
  /*! \brief Sets both counts to zero. */
  void reset() { allreduces = bytes = 0; }
};

/*! \brief The blocking sums over its group a tensor-parallel layer makes per
 *  micro-batch: `forward` allreduces of its output, `backward` of its input
 *  gradient. A layer says so with a member
 *  `static constexpr TensorParallelSums tensor_parallel_sums`; the cost model
 *  (telar::predict_step) charges them on the critical path. */
struct TensorParallelSums {
  int forward = 0;  //!< allreduces of the output in forward
  int backward = 0; //!< allreduces of the input gradient in backward_input
};

/*! \brief What a tensor-parallel layer needs at run time: its group and how
 *  to reduce over it.
 *
 *  Cheap to copy; layers keep a copy. The communicator is not owned and must
 *  outlive every layer that holds the context (a telar::ProcessGrid's tp()
 *  usually). A default-constructed context is a group of one: layers then
 *  behave exactly like the layer they wrap, bit for bit, with no
 *  communication.
 *  \code
 *  telar::ProcessGrid grid(world, telar::GridShape{0, 1, 2}); // tp = 2
 *  telar::TensorParallelContext tp(grid.tp());                // RingAllreduce
 *  telar::set_tensor_parallel(model, tp);
 *  \endcode
 */
struct TensorParallelContext {
  Communicator const* comm = nullptr;                  //!< the tp group (null: a group of one)
  int rank = 0;                                        //!< this rank in the group
  int size = 1;                                        //!< ranks in the group
  TensorParallelAllreduce algorithm = RingAllreduce{}; //!< how activations are summed
  TensorParallelTraffic* traffic = nullptr;            //!< optional counter of what is reduced
  /*! \brief Sizes only (memory plans): a group of `size` without a
   *  communicator, for shapes and parameter counts; never run a layer with it. */
  bool shape_only = false;

  /*! \brief A group of one: no communication. */
  TensorParallelContext() = default;
  /*! \brief The group of \p tp; rank and size are taken from it.
   *  \param tp the tensor-parallel communicator (not owned; must outlive the context's users)
   *  \param algo allreduce algorithm and its settings
   *  \param counter optional traffic counter (not owned) */
  explicit TensorParallelContext(Communicator const& tp,
                                 TensorParallelAllreduce algo = RingAllreduce{},
                                 TensorParallelTraffic* counter = nullptr)
      : comm(&tp), rank(tp.rank()), size(tp.size()), algorithm(algo), traffic(counter) {}

  /*! \brief Name of the allreduce algorithm, for logs. */
  char const* algorithm_name() const {
    return std::visit([](auto const& a) { return a.name(); }, algorithm);
  }

  /*! \brief Throws telar::Error unless rank and size describe a group this
   *  rank can talk to (size > 1 needs a communicator of that size).
   *  \param api name of the caller, first in the message */
  TELAR_DECL void validate(std::string const& api) const;

  /*! \brief Sums \p v over the group, in place; every rank ends with the same
   *  values (bitwise with Telar's own algorithms; MPI does not promise it). Collective:
   *  every rank of the group calls it in the same order with the same size.
   *
   *  Waits for \p exec first. Memory the host cannot reach is staged through a
   *  host copy (telar::AllreduceBuffer) unless Telar was configured with
   *  TELAR_ENABLE_GPU_AWARE_MPI and the algorithm is MpiAllreduce (the others
   *  add on the host). Nothing happens in a group of one.
   *  \param exec execution space instance whose kernels wrote \p v
   *  \param v contiguous view
   *  \throws telar::CommError or telar::CommTimeout naming the rank and the operation */
  template <class Exec, class View>
  void allreduce_sum(Exec const& exec, View const& v) const {
    static_assert(Kokkos::is_view<View>::value,
                  "telar::TensorParallelContext::allreduce_sum: v must be a Kokkos::View");
    if (size == 1)
      return;
    if (comm == nullptr)
      validate("telar::TensorParallelContext::allreduce_sum");
    exec.fence(); // MPI reads memory the kernels wrote
    std::visit(
        [&](auto const& a) {
          AllreduceBuffer<View, std::decay_t<decltype(a)>> buf(v);
          telar::allreduce(a, *comm, buf.data(), buf.size());
          buf.copy_back();
        },
        algorithm);
    if (traffic != nullptr) {
      ++traffic->allreduces;
      traffic->bytes += v.span() * sizeof(typename View::value_type);
    }
  }
};

/*! \brief Splits a layer's output features (the rows of W) over the
 *  tensor-parallel group. Only telar::Dense is split this way; this primary
 *  template rejects every other layer at compile time.
 *  \tparam L the layer to split */
template <class L>
class ColumnParallel {
  static_assert(detail::dependent_false<L>,
                "telar::ColumnParallel: this layer type cannot be tensor-split; split "
                "telar::Dense<T, MemorySpace, Gemm>, or give your layer set_tensor_parallel and "
                "parameter_replicas and use it unwrapped (docs/tensor_parallel.md)");
};

/*! \brief Splits a layer's input features (the columns of W) over the
 *  tensor-parallel group. Only telar::Dense is split this way; this primary
 *  template rejects every other layer at compile time.
 *  \tparam L the layer to split */
template <class L>
class RowParallel {
  static_assert(detail::dependent_false<L>,
                "telar::RowParallel: this layer type cannot be tensor-split; split "
                "telar::Dense<T, MemorySpace, Gemm>, or give your layer set_tensor_parallel and "
                "parameter_replicas and use it unwrapped (docs/tensor_parallel.md)");
};

namespace detail {
/*! \brief What telar::ColumnParallel and telar::RowParallel share: a Dense
 *  of the full (serial) sizes whose W is this rank's block, cut along its
 *  outputs (rows, \p SplitOutputs) or its inputs (columns); the group; the
 *  checks, counts and initialisation that follow from the cut.
 *  \tparam Derived the wrapper (CRTP: its name())
 *  \tparam DenseT the split telar::Dense \tparam SplitOutputs rows (true) or columns */
template <class Derived, class DenseT, bool SplitOutputs>
class TpDense : protected DenseT {
public:
  /*! \brief The wrapped layer type. */
  using layer_type = DenseT;
  /*! \brief Scalar type. */
  using value_type = typename DenseT::value_type;
  /*! \brief Memory space of parameters and activations. */
  using memory_space = typename DenseT::memory_space;
  /*! \brief What backward needs from forward: this rank's input (block). */
  using saved_type = typename DenseT::saved_type;
  /*! \brief The Dense's: the input. */
  static constexpr BackwardReads backward_reads = layer_traits<DenseT>::backward_reads;

  /*! \brief An empty layer; assign a configured one before use. */
  TpDense() = default;
  /*! \brief Sizes of the full (serial) layer. \param in input features
   *  \param out output features \param with_bias add a bias */
  TpDense(std::size_t in, std::size_t out, bool with_bias) : DenseT(in, out, with_bias) {}
  /*! \brief The same split layer (its Dense, group and state) under another
   *  GEMM policy (telar::Precision's rebind). \param o the layer */
  template <class D, class DenseO>
  explicit TpDense(TpDense<D, DenseO, SplitOutputs> const& o)
      : DenseT(static_cast<DenseO const&>(o)), ctx_(o.ctx_), initialized_(o.initialized_) {}

  /*! \brief Joins a tensor-parallel group; call before the shapes and
   *  initialize(). \param ctx the group
   *  \throws telar::Error if \p ctx is invalid, or if the layer was initialised
   *  with another split */
  void set_tensor_parallel(TensorParallelContext const& ctx) {
    ctx.validate(std::string("telar::") + Derived::name() + "::set_tensor_parallel");
    tp_check_resplit(Derived::name(), initialized_, tp_block(split(), ctx_.size, ctx_.rank),
                     tp_block(split(), ctx.size, ctx.rank));
    ctx_ = ctx;
  }
  /*! \brief The group this layer belongs to. */
  TensorParallelContext const& tensor_parallel() const { return ctx_; }
  /*! \brief First feature of the cut dimension this rank holds. */
  std::size_t shard_begin() const { return tp_block(split(), ctx_.size, ctx_.rank).begin; }
  /*! \brief Features of the cut dimension this rank holds. */
  std::size_t shard_size() const { return tp_block(split(), ctx_.size, ctx_.rank).size; }
  /*! \brief Whether the layer adds a bias. */
  bool has_bias() const { return this->use_bias_; }
  /*! \brief This rank's forward multiply-adds times 2 for \p samples rows. */
  double flops(std::size_t samples, Shape const&) const {
    return 2.0 * double(samples) * double(local_in()) * double(local_out());
  }
  /*! \brief Values of this rank's block of W and of its b (a shard of b,
   *  or all of it). */
  std::size_t parameter_count() const {
    return local_out() * local_in() + (this->use_bias_ ? local_out() : 0);
  }
  /*! \brief Keeps a view of x only: 0. */
  std::size_t saved_bytes(std::size_t, Shape const&) const { return 0; }
  /*! \brief The Dense's compact copy of this rank's input (a bf16 Dense:
   *  telar::Dense::compact_bytes). */
  template <class D = DenseT, class = std::enable_if_t<layer_traits<D>::has_compact_copy>>
  std::size_t compact_bytes(std::size_t samples, Shape const& in) const {
    return DenseT::compact_bytes(samples, in);
  }

  /*! \brief Allocates this rank's block of W and b and draws the serial values
   *  of that block. \param seed the same seed the serial Dense gets */
  void initialize(std::uint64_t seed) {
    this->allocate(local_out(), local_in(), this->use_bias_);
    this->fill_block(seed, SplitOutputs ? shard_begin() : 0, SplitOutputs ? 0 : shard_begin());
    initialized_ = true;
  }

  using DenseT::parameters;

  /*! \brief dx = dy_local W_local: column-parallel, summed over the group
   *  (one allreduce of the replicated [n, in]); row-parallel, this rank's
   *  input block [n, in_local] without communication.
   *  \param exec execution space instance \param dy gradient of this rank's output
   *  \param dx gradient of this rank's input \param saved unused */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                      Matrix<value_type, memory_space> dx, saved_type const& saved) const {
    ScopedRegion scope(region("backward_input"));
    check("backward_input", "dx", dx.extent(0), dx.extent(1), "dy", dy.extent(0), dy.extent(1));
    DenseT::backward_input(exec, dy, dx, saved);
    if constexpr (SplitOutputs)
      ctx_.allreduce_sum(exec, dx);
  }

  /*! \brief dW_local += dy_local^T x_local, db += column sums of dy_local; local.
   *  \param exec execution space instance \param dy gradient of this rank's output
   *  \param saved the input of the matching forward */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                       saved_type const& saved) const {
    ScopedRegion scope(region("backward_weight"));
    if (!saved.compact) // a compact copy was made by this layer's forward, which checked x
      check("backward_weight", "x", saved.x.extent(0), saved.x.extent(1), "dy", dy.extent(0),
            dy.extent(1));
    DenseT::backward_weight(exec, dy, saved);
  }

  using DenseT::bias;
  using DenseT::bias_grad;
  using DenseT::weight;
  using DenseT::weight_grad;

protected:
  // "telar::ColumnParallel::forward": the Kokkos Tools region of a method.
  static std::string region(char const* method) {
    std::string const n = Derived::name();
    return "telar::" + n.substr(0, n.find('<')) + "::" + method;
  }
  // The split layer's own methods (hidden by the wrapper's).
  DenseT const& dense() const { return *this; }
  std::size_t split() const { return SplitOutputs ? this->out_ : this->in_; }
  std::size_t local_out() const { return SplitOutputs ? shard_size() : this->out_; }
  std::size_t local_in() const { return SplitOutputs ? this->in_ : shard_size(); }
  // x-like [n, local_in] against y-like [n, local_out], and the parameters' shape.
  void check(char const* method, char const* a, std::size_t an, std::size_t af, char const* b,
             std::size_t bn, std::size_t bf) const {
    tp_check_weight(Derived::name(), method, ctx_.rank, ctx_.size, this->weight.extent(0),
                    this->weight.extent(1), local_out(), local_in());
    tp_check_pair(Derived::name(), method, ctx_.rank, ctx_.size, a, an, af, local_in(), b, bn, bf,
                  local_out());
  }
  // The offset of this rank's block in the full W [out, in] (dimension 0
  // or 1); b too when it is cut (\p cut_bias).
  TensorBlock block_of(std::vector<std::size_t> const& local, bool cut) const {
    TensorBlock b{local, std::vector<std::size_t>(local.size(), 0)};
    std::size_t const d = SplitOutputs ? 0 : 1;
    if (cut) {
      b.shape[d] = split();
      b.offset[d] = shard_begin();
    }
    return b;
  }

  TensorParallelContext ctx_; //!< the group
  bool initialized_ = false;  //!< the split is fixed once the parameters exist

  template <class, class, bool>
  friend class TpDense; // the converting constructor reads another policy's layer
};
} // namespace detail

/*! \brief Column-parallel Dense: W [out, in] split by rows (output features).
 *
 *  Rank r of a group of p holds rows [r out / p, (r + 1) out / p) of W and the
 *  same entries of b (block sizes differ by at most one; a block is empty when
 *  out < p). forward maps the replicated x [n, in] to its block of y,
 *  [n, out_local], without communicating; backward_input sums the partial
 *  dx = dy_local W_local over the group (one allreduce of [n, in]);
 *  backward_weight is local. Parameters are drawn exactly as the serial Dense
 *  with the same seed draws them at the same global indices.
 *  \tparam T value type \tparam MemorySpace memory space \tparam Gemm GEMM policy */
template <class T, class MemorySpace, class Gemm>
class ColumnParallel<Dense<T, MemorySpace, Gemm>>
    : public detail::TpDense<ColumnParallel<Dense<T, MemorySpace, Gemm>>,
                             Dense<T, MemorySpace, Gemm>, true> {
  using Base = detail::TpDense<ColumnParallel, Dense<T, MemorySpace, Gemm>, true>;

public:
  /*! \brief An empty layer; assign a configured one before use. */
  ColumnParallel() = default;
  /*! \brief Sizes of the full (serial) layer.
   *  \param in input features \param out output features (all ranks together)
   *  \param with_bias add a bias */
  ColumnParallel(std::size_t in, std::size_t out, bool with_bias = true)
      : Base(in, out, with_bias) {}
  /*! \brief The same layer (its Dense, group and state) under another GEMM
   *  policy: what telar::Precision's rebind of a model makes.
   *  \tparam G the other policy \param o the layer */
  template <class G, class = std::enable_if_t<!std::is_same_v<G, Gemm>>>
  explicit ColumnParallel(ColumnParallel<Dense<T, MemorySpace, G>> const& o) : Base(o) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "ColumnParallel<Dense>"; }
  /*! \brief One allreduce of dx in backward. */
  static constexpr TensorParallelSums tensor_parallel_sums{0, 1};

  /*! \brief This rank's output shape, [..., out_local], for a replicated
   *  input [..., in] (position-wise over [seq, in] samples).
   *  \param in the input shape \throws ShapeError when the last extent is not in */
  Shape output_shape(Shape const& in) const {
    if (in.back() != this->in_)
      throw ShapeError(std::string(name()) + " expects inputs [..., " + std::to_string(this->in_) +
                       "], got " + in.str());
    return in.with_back(this->shard_size());
  }
  /*! \brief Output features of the full layer. */
  std::size_t full_output_features() const { return this->out_; }
  /*! \brief Every parameter is a shard: 1. \param name parameter name */
  int parameter_replicas(std::string const& name) const {
    (void)name;
    return 1;
  }
  /*! \brief This rank's rows of W [out, in] and entries of b [out].
   *  \param name "weight" or "bias" \param local the local tensor's extents */
  TensorBlock parameter_block(std::string const& name,
                              std::vector<std::size_t> const& local) const {
    (void)name;
    return this->block_of(local, true);
  }

  /*! \brief y_local = x W_local^T + b_local; no communication.
   *  \param exec execution space instance \param x replicated input [n, in]
   *  \param y this rank's output block [n, out_local] \param saved keeps x */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               typename Base::saved_type& saved) const {
    detail::ScopedRegion scope(this->region("forward"));
    this->check("forward", "x", x.extent(0), x.extent(1), "y", y.extent(0), y.extent(1));
    this->dense().forward(exec, x, y, saved);
  }
};

/*! \brief Row-parallel Dense: W [out, in] split by columns (input features).
 *
 *  Rank r of a group of p holds columns [r in / p, (r + 1) in / p) of W and
 *  all of b (replicated). Its input is the sharded activation x_local
 *  [n, in_local] of a telar::ColumnParallel, possibly through element-wise
 *  layers. forward sums the partial x_local W_local^T over the group (one
 *  allreduce of [n, out]) and adds b once, after the sum; backward_input is
 *  local (dx_local = dy W_local); backward_weight accumulates dW_local and the
 *  full db, which is the same on every rank (parameter_replicas("bias") is
 *  the group size).
 *  \tparam T value type \tparam MemorySpace memory space \tparam Gemm GEMM policy */
template <class T, class MemorySpace, class Gemm>
class RowParallel<Dense<T, MemorySpace, Gemm>>
    : public detail::TpDense<RowParallel<Dense<T, MemorySpace, Gemm>>, Dense<T, MemorySpace, Gemm>,
                             false> {
  using Base = detail::TpDense<RowParallel, Dense<T, MemorySpace, Gemm>, false>;

public:
  /*! \brief An empty layer; assign a configured one before use. */
  RowParallel() = default;
  /*! \brief Sizes of the full (serial) layer.
   *  \param in input features (all ranks together) \param out output features
   *  \param with_bias add a bias */
  RowParallel(std::size_t in, std::size_t out, bool with_bias = true) : Base(in, out, with_bias) {}
  /*! \brief The same layer (its Dense, group and state) under another GEMM
   *  policy: what telar::Precision's rebind of a model makes.
   *  \tparam G the other policy \param o the layer */
  template <class G, class = std::enable_if_t<!std::is_same_v<G, Gemm>>>
  explicit RowParallel(RowParallel<Dense<T, MemorySpace, G>> const& o) : Base(o) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return "RowParallel<Dense>"; }
  /*! \brief One allreduce of y in forward. */
  static constexpr TensorParallelSums tensor_parallel_sums{1, 0};

  /*! \brief The replicated output shape [..., out] for this rank's input
   *  block [..., in_local] (position-wise over [seq, in_local] samples).
   *  \param in the input shape \throws ShapeError when the last extent is not in_local */
  Shape output_shape(Shape const& in) const {
    if (in.back() != this->shard_size())
      throw ShapeError(std::string(name()) + " at tp rank " + std::to_string(this->ctx_.rank) +
                       " of " + std::to_string(this->ctx_.size) +
                       " expects its input block [..., " + std::to_string(this->shard_size()) +
                       "], got " + in.str());
    return in.with_back(this->out_);
  }
  /*! \brief Input features of the full layer. */
  std::size_t full_input_features() const { return this->in_; }
  /*! \brief The bias is replicated on every rank of the group (its size); W
   *  is a shard (1). \param name parameter name */
  int parameter_replicas(std::string const& name) const {
    return name == "bias" ? this->ctx_.size : 1;
  }
  /*! \brief This rank's columns of W [out, in]; all of b.
   *  \param name "weight" or "bias" \param local the local tensor's extents */
  TensorBlock parameter_block(std::string const& name,
                              std::vector<std::size_t> const& local) const {
    return this->block_of(local, name == "weight");
  }

  /*! \brief y = sum over the group of x_local W_local^T, then + b (once).
   *  One allreduce of [n, out]; a group of one runs Dense::forward itself.
   *  \param exec execution space instance \param x this rank's input block [n, in_local]
   *  \param y replicated output [n, out] \param saved keeps x */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<T, MemorySpace> x, Matrix<T, MemorySpace> y,
               typename Base::saved_type& saved) const {
    detail::ScopedRegion scope(this->region("forward"));
    this->check("forward", "x", x.extent(0), x.extent(1), "y", y.extent(0), y.extent(1));
    if (this->ctx_.size == 1) {
      this->dense().forward(exec, x, y, saved); // the same operations as Dense, bit for bit
      return;
    }
    std::size_t const r = this->positions(x, y); // samples x positions per sample
    auto const yr = as_rows(y, r, this->out_);
    this->forward_product(exec, x, as_rows(x, r, this->shard_size()), yr, T(0), saved);
    this->ctx_.allreduce_sum(exec, y);
    if (this->use_bias_) {
      // After the sum: b is replicated, adding it before would count it p times.
      auto b = this->bias;
      Kokkos::parallel_for(
          "telar::RowParallel::forward_bias",
          Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {yr.extent(0), yr.extent(1)}),
          KOKKOS_LAMBDA(std::size_t i, std::size_t j) { yr(i, j) += b(j); });
    }
  }
};

/*! \brief Calls set_tensor_parallel(\p ctx) on every layer of \p model that
 *  has it, nested blocks included (the first step of building a
 *  tensor-parallel model, before build() and initialize()).
 *  \param model a telar::Sequential (or DynamicSequential) \param ctx the tensor-parallel group */
template <class Model>
std::enable_if_t<is_sequential_v<Model>> set_tensor_parallel(Model& model,
                                                             TensorParallelContext const& ctx) {
  model.for_each_layer([&](auto, auto& layer) {
    using L = std::decay_t<decltype(layer)>;
    if constexpr (layer_traits<L>::has_tensor_parallel)
      layer.set_tensor_parallel(ctx);
  });
}

/*! \brief Sets ParameterInfo::replicas of every tensor in \p store from its
 *  layer (telar::parameter_replicas), so norms reduced over the
 *  tensor-parallel group count replicated tensors once.
 *  \param model the telar::Sequential \p store was bound to
 *  \param store parameters bound with ParameterStore::bind
 *  \param tp_size ranks in the tensor-parallel group */
template <class T, class MemorySpace, class Model>
std::enable_if_t<is_sequential_v<Model>>
set_parameter_replicas(Model& model, ParameterStore<T, MemorySpace>& store, int tp_size) {
  auto& entries = store.entries();
  model.for_each_layer([&](auto index, auto& layer) {
    using L = std::decay_t<decltype(layer)>;
    if constexpr (layer_traits<L>::has_parameters) {
      layer.parameters([&](char const* name, auto&, auto&) {
        std::string const full = detail::layer_prefix(model, index) + name;
        for (auto& e : entries)
          if (e.layer == index && e.name == full)
            e.replicas = parameter_replicas(layer, name, tp_size);
      });
    }
  });
}

} // namespace telar

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/parallel/tensor_parallel.ipp>
#endif
