#pragma once
// The one walk behind every block whose branches all read the block's input
// and whose outputs are joined (telar::Residual, telar::Add, telar::Mul,
// telar::Concat, telar::DenseConcat): shapes, build, seeds, parameter names,
// tensor-parallel context, memory, forward and the split backward are written
// once here; a Kind (telar/core/detail/join.hpp) says how outputs join, how
// branches are named, and what the block is called.
#include <telar/core/detail/counter_rng.hpp>
#include <telar/core/detail/join.hpp>
#include <telar/core/detail/layer_walk.hpp>
#include <telar/core/detail/shared_pool.hpp>
#include <telar/core/detail/type_traits.hpp>
#include <telar/core/error.hpp>
#include <telar/core/identity.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/sequential.hpp>
#include <telar/core/shape.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace telar::detail {

template <class Kind, class... Branches>
class BranchBlock {
  static_assert(sizeof...(Branches) > 0, "telar: a block of branches needs at least one branch");
  static_assert((check_layer<Branches>() && ...));
  static constexpr std::size_t count = sizeof...(Branches);
  using First = std::tuple_element_t<0, std::tuple<Branches...>>;

public:
  using value_type = typename layer_traits<First>::value_type;
  using memory_space = typename layer_traits<First>::memory_space;
  static_assert((std::is_same_v<typename layer_traits<Branches>::value_type, value_type> && ...),
                "telar: all branches of a block (Residual, Concat, Add, Mul) must have the same "
                "value_type");
  static_assert((std::is_same_v<typename layer_traits<Branches>::memory_space, memory_space> &&
                 ...),
                "telar: all branches of a block (Residual, Concat, Add, Mul) must have the same "
                "memory_space");
  using matrix = Matrix<value_type, memory_space>;
  using const_matrix = ConstMatrix<value_type, memory_space>;
  // The branches read the input (an Identity branch's output is the input
  // itself); the block's output is the join's, which no backward reads.
  static constexpr BackwardReads backward_reads = BackwardReads::input;

  // What one micro-batch keeps. Branch outputs are separate buffers (a
  // branch's last layer may keep its output for backward, as ReLU does);
  // an Identity branch's output is the input itself.
  struct saved_type {
    std::tuple<typename layer_traits<Branches>::saved_type...> inner; // each branch's state
    std::array<matrix, count> buf;          // branch outputs this block allocated
    std::array<const_matrix, count> out;    // branch outputs as the join reads them
    mutable std::array<matrix, count> grad; // dL/d out_i where that is not dy itself
    mutable matrix join;                    // a product's full-size term
    mutable matrix scratch;                 // a later branch's dx, before it is added
    mutable bool grads_ready = false;       // backward_input ran since the last backward_weight
  };

  BranchBlock() = default;
  explicit BranchBlock(Branches... branches) : branches_(std::move(branches)...) {}

  static constexpr char const* name() { return Kind::name(); }
  static constexpr bool backward_input_first = true;

  template <std::size_t I>
  auto& branch() {
    return std::get<I>(branches_);
  }
  template <std::size_t I>
  auto const& branch() const {
    return std::get<I>(branches_);
  }
  template <class F>
  void for_each_branch(F&& f) {
    for_each_indexed(branches_, f, std::index_sequence_for<Branches...>{});
  }
  template <class F>
  void for_each_branch(F&& f) const {
    for_each_indexed(branches_, f, std::index_sequence_for<Branches...>{});
  }

  Shape output_shape(Shape const& in) const { return join_shape(in, branch_shapes(in)); }
  void build(Shape const& in) {
    for_each_branch([&](auto, auto& b) {
      if constexpr (layer_traits<std::decay_t<decltype(b)>>::has_build)
        b.build(in);
    });
    in_ = in;
    outs_ = branch_shapes(in);
    out_ = join_shape(in, outs_);
  }
  double flops(std::size_t samples, Shape const& in) const {
    double f = double(samples) * double(output_shape(in).size()) * double(count - 1);
    for_each_branch([&](auto, auto const& b) {
      if constexpr (is_detected_v<flops_t, std::decay_t<decltype(b)>>)
        f += b.flops(samples, in);
    });
    return f;
  }
  void initialize(std::uint64_t seed) {
    for_each_branch([&](auto index, auto& b) {
      if constexpr (layer_traits<std::decay_t<decltype(b)>>::has_initialize)
        b.initialize(mix_seed(seed, index));
    });
  }
  std::size_t parameter_count() const {
    std::size_t n = 0;
    for_each_branch([&](auto, auto const& b) { n += parameter_count_of(b); });
    return n;
  }
  // The branches' own saved state and every buffer forward allocates (each
  // rounded up to whole 8 bytes, as Kokkos allocates).
  std::size_t saved_bytes(std::size_t samples, Shape const& in) const {
    std::size_t n = own_buffer_bytes(samples, in);
    for_each_branch([&](auto, auto const& b) { n += saved_bytes_of(b, samples, in); });
    return n;
  }
  // saved_bytes() where the stage's shared pool serves the branches.
  std::size_t pooled_saved_bytes(std::size_t samples, Shape const& in, bool split) const {
    std::size_t n = own_buffer_bytes(samples, in);
    for_each_branch(
        [&](auto, auto const& b) { n += pooled_saved_bytes_of(b, samples, in, false, split); });
    return n;
  }
  // The pool's needs of the branches (this block keeps nothing there).
  void pool_extents(Shape const& in, bool split, PoolExtents& most, std::size_t depth) const {
    for_each_branch([&](auto, auto const& b) { pool_extents_of(b, in, split, most, depth); });
  }
  // The branches run one after the other, at this block's depth.
  void set_shared_pool(typename PoolHandle<value_type, memory_space>::Pool const& pool,
                       std::size_t depth) {
    for_each_branch([&](auto, auto& b) { pass_shared_pool(b, pool, depth); });
  }
  // The branches' workspaces (kept between calls, shared by micro-batches).
  std::size_t workspace_bytes(std::size_t samples, Shape const& in) const {
    std::size_t n = 0;
    for_each_branch([&](auto, auto const& b) { n += workspace_bytes_of(b, samples, in); });
    return n;
  }
  // Buffers (BatchNorm's running statistics), named as parameters are.
  template <class F>
  void buffers(F&& f) {
    for_each_branch([&](auto index, auto& b) { prefixed_buffers(b, Kind::prefix(index), f); });
  }
  std::size_t buffer_count() const {
    std::size_t n = 0;
    for_each_branch([&](auto, auto const& b) { n += buffer_count_of(b); });
    return n;
  }
  template <class Context>
  void set_data_parallel(Context const& ctx) {
    for_each_branch([&](auto, auto& b) { pass_data_parallel(b, ctx); });
  }

  template <class F>
  void parameters(F&& f) {
    for_each_branch([&](auto index, auto& b) { prefixed_parameters(b, Kind::prefix(index), f); });
  }
  template <class Context>
  void set_tensor_parallel(Context const& ctx) {
    tp_size_ = ctx.size;
    for_each_branch([&](auto, auto& b) {
      if constexpr (layer_traits<std::decay_t<decltype(b)>>::has_tensor_parallel)
        b.set_tensor_parallel(ctx);
    });
  }
  int parameter_replicas(std::string const& name) const {
    return route(name, tp_size_, [&](auto const& b, std::string const& rest) {
      return telar::parameter_replicas(b, rest, tp_size_);
    });
  }
  TensorBlock parameter_block(std::string const& name,
                              std::vector<std::size_t> const& local) const {
    TensorBlock const whole{local, std::vector<std::size_t>(local.size(), 0)};
    return route(name, whole, [&](auto const& b, std::string const& rest) {
      return telar::parameter_block(b, rest, local);
    });
  }

  template <class Exec>
  void forward(Exec const& exec, const_matrix x, matrix y, saved_type& saved) {
    if (!out_.known())
      throw Error(std::string("telar::") + name() + ": run before build(input shape)");
    allocate(saved, x.extent(0));
    saved.grads_ready = false; // a reused saved object: a new micro-batch
    for_each_branch([&](auto index, auto& b) {
      constexpr std::size_t i = decltype(index)::value;
      if constexpr (is_identity_v<std::decay_t<decltype(b)>>) {
        saved.out[i] = x;
      } else {
        b.forward(exec, x, saved.buf[i], std::get<i>(saved.inner));
        saved.out[i] = saved.buf[i];
      }
    });
    Kind::forward(exec, saved.out, y);
  }
  // dx = the sum over branches of each branch's input gradient: computed
  // branches first (the first writes dx, the others go through scratch),
  // then the Identity branches add their output gradient.
  template <class Exec>
  void backward_input(Exec const& exec, const_matrix dy, matrix dx, saved_type const& saved) {
    input_gradients(exec, dy, dx, saved, false);
    saved.grads_ready = true;
  }
  // backward_input and backward_weight in one call: each branch runs both
  // parts at once (its fused backward where it has one, so a chain in the
  // stage's shared pool keeps its inner gradients there).
  template <class Exec>
  void backward(Exec const& exec, const_matrix dy, matrix dx, saved_type const& saved) {
    input_gradients(exec, dy, dx, saved, true);
    saved.grads_ready = false;
  }
  // Weight gradients of every branch; on its own (nothing needs dx) it first
  // computes the branches' output gradients and runs fused branches.
  template <class Exec>
  void backward_weight(Exec const& exec, const_matrix dy, saved_type const& saved) {
    bool const ready = saved.grads_ready;
    if (!ready)
      Kind::grads(exec, dy, saved.out, saved.grad, saved.join);
    for_each_branch([&](auto index, auto& b) {
      constexpr std::size_t i = decltype(index)::value;
      using P = layer_traits<std::decay_t<decltype(b)>>;
      if constexpr (P::has_split_backward && P::has_backward_weight)
        b.backward_weight(exec, grad_of(saved, i, dy), std::get<i>(saved.inner));
      else if constexpr (!P::has_split_backward)
        if (!ready)
          b.backward(exec, grad_of(saved, i, dy), saved.scratch, std::get<i>(saved.inner));
    });
    saved.grads_ready = false;
  }

private:
  // dx over the branches (see backward_input); `both`: each branch's weight
  // part too, right after its input part.
  template <class Exec>
  void input_gradients(Exec const& exec, const_matrix dy, matrix dx, saved_type const& saved,
                       bool both) {
    Kind::grads(exec, dy, saved.out, saved.grad, saved.join);
    bool written = false;
    for_each_branch([&](auto index, auto& b) {
      constexpr std::size_t i = decltype(index)::value;
      using B = std::decay_t<decltype(b)>;
      if constexpr (!is_identity_v<B>) {
        matrix const target = written ? saved.scratch : dx;
        if constexpr (layer_traits<B>::has_split_backward) {
          if (both)
            backward_both(b, exec, grad_of(saved, i, dy), target, std::get<i>(saved.inner));
          else
            b.backward_input(exec, grad_of(saved, i, dy), target, std::get<i>(saved.inner));
        } else {
          b.backward(exec, grad_of(saved, i, dy), target, std::get<i>(saved.inner));
        }
        if (written)
          add_batch(exec, dx, saved.scratch);
        written = true;
      }
    });
    for_each_branch([&](auto index, auto const& b) {
      if constexpr (is_identity_v<std::decay_t<decltype(b)>>) {
        if (written)
          add_batch(exec, dx, grad_of(saved, index, dy));
        else
          Kokkos::deep_copy(exec, dx, grad_of(saved, index, dy));
        written = true;
      }
    });
  }
  // Both parts of a split branch: its own fused backward (a block), else the
  // input part, then the weight part.
  template <class B, class Exec, class S>
  static void backward_both(B& b, Exec const& exec, const_matrix dy, matrix dx, S const& s) {
    if constexpr (layer_traits<B>::has_fused_backward) {
      b.backward(exec, dy, dx, s);
    } else {
      b.backward_input(exec, dy, dx, s);
      if constexpr (layer_traits<B>::has_backward_weight)
        b.backward_weight(exec, dy, s);
    }
  }
  // Every buffer forward allocates (each rounded up to whole 8 bytes, as
  // Kokkos allocates).
  std::size_t own_buffer_bytes(std::size_t samples, Shape const& in) const {
    auto const outs = branch_shapes(in);
    std::size_t n = 0;
    saved_type probe;
    visit_buffers(probe, in, outs, join_shape(in, outs),
                  [&](matrix&, std::size_t cols) { n += view_bytes<value_type>(samples * cols); });
    return n;
  }
  std::vector<Shape> branch_shapes(Shape const& in) const {
    std::vector<Shape> outs;
    for_each_branch([&](auto index, auto const& b) {
      try {
        outs.push_back(b.output_shape(in));
      } catch (ShapeError const& e) {
        throw ShapeError(std::string("telar::") + name() + ": " + label(index, b) +
                         " cannot take input " + in.str() + ": " + e.what());
      }
    });
    return outs;
  }
  Shape join_shape(Shape const& in, std::vector<Shape> const& outs) const {
    std::vector<std::string> labels;
    for_each_branch([&](auto index, auto const& b) { labels.push_back(label(index, b)); });
    return Kind::shape(name(), in, outs, labels);
  }
  template <class B>
  static std::string label(std::size_t i, B const& b) {
    return Kind::label(i, layer_name(b));
  }

  // Calls f(buffer, columns) for every buffer forward allocates, so the
  // allocation and saved_bytes() follow one rule.
  template <class F>
  void visit_buffers(saved_type& s, Shape const& in, std::vector<Shape> const& outs,
                     Shape const& out, F&& f) const {
    bool any_spread = false;
    std::size_t computed = 0; // branches that run (not Identity)
    bool fused = false;
    for_each_branch([&](auto index, auto const& b) {
      constexpr std::size_t i = decltype(index)::value;
      using B = std::decay_t<decltype(b)>;
      std::size_t const k = outs[i].size(), spread = out.size() / k;
      any_spread = any_spread || spread > 1;
      if constexpr (!is_identity_v<B>) {
        f(s.buf[i], k);
        ++computed;
        fused = fused || !layer_traits<B>::has_split_backward;
      }
      if (Kind::grad_buffer(spread))
        f(s.grad[i], k);
    });
    if (Kind::join_buffer(any_spread))
      f(s.join, out.size());
    if (computed > 1 || fused)
      f(s.scratch, in.size());
  }
  void allocate(saved_type& s, std::size_t rows) const {
    visit_buffers(s, in_, outs_, out_, [&](matrix& m, std::size_t cols) {
      if (m.extent(0) != rows || m.extent(1) != cols)
        m = matrix(Kokkos::view_alloc(Kokkos::WithoutInitializing,
                                      std::string("telar::") + name() + "::buffer"),
                   rows, cols);
    });
  }
  // Branch i's output gradient: its buffer, or dy itself where the join
  // passes dy through unchanged.
  static const_matrix grad_of(saved_type const& s, std::size_t i, const_matrix const& dy) {
    return s.grad[i].data() ? const_matrix(s.grad[i]) : dy;
  }

  // f(branch, rest) for the branch that holds parameter `name`: the one
  // whose prefix it starts with, else the unprefixed one with parameters.
  template <class R, class F>
  R route(std::string const& name, R result, F&& f) const {
    bool found = false;
    for_each_branch([&](auto index, auto const& b) {
      std::string const p = Kind::prefix(index);
      if (!found && !p.empty() && name.rfind(p, 0) == 0) {
        result = f(b, name.substr(p.size()));
        found = true;
      }
    });
    for_each_branch([&](auto index, auto const& b) {
      if constexpr (layer_traits<std::decay_t<decltype(b)>>::has_parameters)
        if (!found && Kind::prefix(index).empty()) {
          result = f(b, name);
          found = true;
        }
    });
    return result;
  }

  std::tuple<Branches...> branches_;
  Shape in_, out_;
  std::vector<Shape> outs_;
  int tp_size_ = 1;
};

template <class L>
inline constexpr bool is_branch_block_v = false;
template <class Kind, class... Branches>
inline constexpr bool is_branch_block_v<BranchBlock<Kind, Branches...>> = true;

} // namespace telar::detail
