#pragma once
/*! \file
 *  \brief Residual blocks: y = body(x) + x, or body(x) + projection(x) when
 *  the body changes the shape. */
#include <telar/core/error.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/sequential.hpp>
#include <telar/core/shape.hpp>

#include <string>
#include <utility>

namespace telar {

namespace detail {
/*! \brief The shortcut of a plain residual block: x itself. */
struct IdentityShortcut {};
template <class P>
struct shortcut_saved {
  using type = typename layer_traits<P>::saved_type;
};
template <>
struct shortcut_saved<IdentityShortcut> {
  using type = NoSaved;
};
// dst = a + b over three [n, k] batches.
template <class Exec, class D, class A, class B>
void sum_batches(Exec const& exec, D const& dst, A const& a, B const& b) {
  std::size_t const n = dst.extent(0), k = dst.extent(1);
  auto* d = dst.data();
  auto const* pa = a.data();
  auto const* pb = b.data();
  Kokkos::parallel_for(
      "telar::Residual::sum", Kokkos::RangePolicy<Exec>(exec, 0, n * k),
      KOKKOS_LAMBDA(std::size_t i) { d[i] = pa[i] + pb[i]; });
}
} // namespace detail

/*! \brief A residual block y = body(x) + shortcut(x), where body is the chain
 *  \p Layers... and shortcut is \p Projection (a layer, e.g. a 1x1
 *  convolution or a Dense, when the body changes the shape) or x itself.
 *
 *  One unit for pipeline partitioning, tensor-parallel context injection and
 *  parameter naming: the body's parameters are "<i>.<name>" (layer i of the
 *  body), the projection's "shortcut.<name>".
 *  Use telar::Residual<Layers...> or telar::ProjectedResidual<Projection, Layers...>.
 *  \tparam Projection the shortcut layer, or detail::IdentityShortcut
 *  \tparam Layers the body's layers */
template <class Projection, class... Layers>
class ResidualBlock {
  static constexpr bool projected = !std::is_same_v<Projection, detail::IdentityShortcut>;
  using Body = Sequential<Layers...>;
  using ProjSaved = typename detail::shortcut_saved<Projection>::type;

public:
  /*! \brief Scalar type. */
  using value_type = typename Body::value_type;
  /*! \brief Memory space. */
  using memory_space = typename Body::memory_space;
  /*! \brief The body's saved state, the projection's, and buffers for their
   *  outputs (kept until backward: the last layer of either may have saved
   *  its output, so y is a separate sum) and the projection's input gradient. */
  struct saved_type {
    typename Body::saved_type body;                    //!< the body's state
    ProjSaved proj;                                    //!< the projection's state
    mutable Matrix<value_type, memory_space> body_out; //!< body(x)
    mutable Matrix<value_type, memory_space> buffer;   //!< shortcut output
    mutable Matrix<value_type, memory_space> grad;     //!< the shortcut's dx
    mutable bool shortcut_input_done = false;          //!< a fused projection already ran
  };

  /*! \brief Default-constructed layers. */
  ResidualBlock() = default;
  /*! \brief A plain block. \param layers the body's layers */
  template <bool P = projected, class = std::enable_if_t<!P>>
  explicit ResidualBlock(Layers... layers) : body_(std::move(layers)...) {}
  /*! \brief A projected block. \param projection the shortcut \param layers the body */
  template <bool P = projected, class = std::enable_if_t<P>>
  ResidualBlock(Projection projection, Layers... layers)
      : body_(std::move(layers)...), proj_(std::move(projection)) {}

  /*! \brief Name for messages and traces. */
  static constexpr char const* name() { return projected ? "ProjectedResidual" : "Residual"; }
  /*! \brief The body's backward_weight reuses its backward_input's inner
   *  gradients: run together, the input part goes first. */
  static constexpr bool backward_input_first = true;

  /*! \brief The body. */
  Body& body() { return body_; }
  /*! \brief The body. */
  Body const& body() const { return body_; }
  /*! \brief The shortcut layer (projected blocks only). */
  template <bool P = projected, class = std::enable_if_t<P>>
  Projection& projection() {
    return proj_;
  }
  /*! \brief The shortcut layer (projected blocks only). */
  template <bool P = projected, class = std::enable_if_t<P>>
  Projection const& projection() const {
    return proj_;
  }

  /*! \brief The body's output shape; with an identity shortcut it must equal
   *  the input's. \param in input shape */
  Shape output_shape(Shape const& in) const {
    Shape const out = body_.output_shape(in);
    if constexpr (projected) {
      Shape const p = proj_.output_shape(in);
      if (p != out)
        throw ShapeError("the body gives " + out.str() + " but the projection " + p.str());
    } else if (out != in) {
      throw ShapeError("the body turns " + in.str() + " into " + out.str() +
                       "; use telar::ProjectedResidual to add a projection of the input");
    }
    return out;
  }
  /*! \brief Builds the body (and projection) for input \p in. \param in input shape */
  void build(Shape const& in) {
    body_.build(in);
    if constexpr (projected)
      if constexpr (layer_traits<Projection>::has_build)
        proj_.build(in);
  }
  /*! \brief Cost: the body's and the projection's. \param samples rows \param in input shape */
  double flops(std::size_t samples, Shape const& in) const {
    double f = body_.flops(samples, in) + double(samples) * double(in.size());
    if constexpr (projected)
      if constexpr (detail::is_detected_v<detail::flops_t, Projection>)
        f += proj_.flops(samples, in);
    return f;
  }
  /*! \brief Parameter values of the body and the projection. */
  std::size_t parameter_count() const {
    std::size_t n = body_.parameter_count();
    if constexpr (projected)
      n += detail::parameter_count_of(proj_);
    return n;
  }
  /*! \brief What one micro-batch keeps: the body's inner activations, their
   *  gradients and its layers' saved state, the body's output buffer and,
   *  with a projection, its state, output and input-gradient buffers (the
   *  last is not needed when the block is the model's first layer and the
   *  projection has a split backward: a slight over-estimate there).
   *  \param samples rows \param in input shape */
  std::size_t saved_bytes(std::size_t samples, Shape const& in) const {
    std::size_t const out = detail::view_bytes<value_type>(samples * output_shape(in).size());
    std::size_t n = body_.saved_bytes(samples, in) + out;
    if constexpr (projected)
      n += detail::saved_bytes_of(proj_, samples, in) + out +
           detail::view_bytes<value_type>(samples * in.size());
    return n;
  }
  /*! \brief The body's and the projection's workspace.
   *  \param samples rows \param in input shape */
  std::size_t workspace_bytes(std::size_t samples, Shape const& in) const {
    std::size_t n = body_.workspace_bytes(samples, in);
    if constexpr (projected)
      n += detail::workspace_bytes_of(proj_, samples, in);
    return n;
  }
  /*! \brief Initialises the body and the projection. \param seed stream seed */
  void initialize(std::uint64_t seed) {
    body_.initialize(detail::mix_seed(seed, 0));
    if constexpr (projected)
      if constexpr (layer_traits<Projection>::has_initialize)
        proj_.initialize(detail::mix_seed(seed, 1));
  }
  /*! \brief Visits the body's parameters, then the projection's ("shortcut.<name>").
   *  \param f callable as f(char const*, View&, View&) */
  template <class F>
  void parameters(F&& f) {
    body_.parameters(f);
    if constexpr (projected)
      if constexpr (layer_traits<Projection>::has_parameters)
        proj_.parameters([&](char const* name, auto& v, auto& g) {
          std::string const full = std::string("shortcut.") + name;
          f(full.c_str(), v, g);
        });
  }
  /*! \brief Visits the body's buffers, then the projection's ("shortcut.<name>").
   *  \param f callable as f(char const*, View&) */
  template <class F>
  void buffers(F&& f) {
    body_.buffers(f);
    if constexpr (projected)
      detail::prefixed_buffers(proj_, "shortcut.", f);
  }
  /*! \brief Buffer values of the body and the projection. */
  std::size_t buffer_count() const {
    std::size_t n = body_.buffer_count();
    if constexpr (projected)
      n += detail::buffer_count_of(proj_);
    return n;
  }
  /*! \brief Passes a data-parallel context on. \param ctx a telar::DataParallelContext */
  template <class Context>
  void set_data_parallel(Context const& ctx) {
    body_.set_data_parallel(ctx);
    if constexpr (projected)
      detail::pass_data_parallel(proj_, ctx);
  }
  /*! \brief Passes a tensor-parallel context on. \param ctx a telar::TensorParallelContext */
  template <class Context>
  void set_tensor_parallel(Context const& ctx) {
    tp_size_ = ctx.size;
    body_.set_tensor_parallel(ctx);
    if constexpr (projected)
      if constexpr (layer_traits<Projection>::has_tensor_parallel)
        proj_.set_tensor_parallel(ctx);
  }
  /*! \brief Replicas of a parameter in the tensor-parallel group. \param name its name */
  int parameter_replicas(std::string const& name) const {
    if constexpr (projected)
      if (name.rfind("shortcut.", 0) == 0)
        return telar::parameter_replicas(proj_, name.substr(9), tp_size_);
    return body_.parameter_replicas(name);
  }
  /*! \brief Where this rank's parameter lies in the whole tensor.
   *  \param name its name \param local the local tensor's extents */
  TensorBlock parameter_block(std::string const& name,
                              std::vector<std::size_t> const& local) const {
    if constexpr (projected)
      if (name.rfind("shortcut.", 0) == 0)
        return telar::parameter_block(proj_, name.substr(9), local);
    return body_.parameter_block(name, local);
  }

  /*! \brief y = body(x) + shortcut(x). \param exec execution space instance
   *  \param x input \param y output \param saved per-micro-batch state */
  template <class Exec>
  void forward(Exec const& exec, ConstMatrix<value_type, memory_space> x,
               Matrix<value_type, memory_space> y, saved_type& saved) {
    // Not in place: the body's (or projection's) last layer may keep its
    // output for backward (ReLU does).
    auto out = buffer(saved.body_out, y.extent(0), y.extent(1));
    saved.shortcut_input_done = false; // a reused saved object: a new micro-batch
    body_.forward(exec, x, out, saved.body);
    if constexpr (projected) {
      auto buf = buffer(saved.buffer, y.extent(0), y.extent(1));
      proj_.forward(exec, x, buf, saved.proj);
      detail::sum_batches(exec, y, out, buf);
    } else {
      detail::sum_batches(exec, y, out, x);
    }
  }
  /*! \brief dx = body'(dy) + shortcut'(dy). \param exec execution space instance
   *  \param dy output gradient \param dx input gradient \param saved state */
  template <class Exec>
  void backward_input(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                      Matrix<value_type, memory_space> dx, saved_type const& saved) {
    body_.backward_input(exec, dy, dx, saved.body);
    if constexpr (projected) {
      auto buf = buffer(saved.grad, dx.extent(0), dx.extent(1));
      using P = layer_traits<Projection>;
      if constexpr (P::has_split_backward)
        proj_.backward_input(exec, dy, buf, saved.proj);
      else
        proj_.backward(exec, dy, buf, saved.proj);
      saved.shortcut_input_done = true;
      detail::add_batch(exec, dx, buf);
    } else {
      detail::add_batch(exec, dx, dy);
    }
  }
  /*! \brief Weight gradients of the body and the projection.
   *  \param exec execution space instance \param dy output gradient \param saved state */
  template <class Exec>
  void backward_weight(Exec const& exec, ConstMatrix<value_type, memory_space> dy,
                       saved_type const& saved) {
    body_.backward_weight(exec, dy, saved.body);
    if constexpr (projected) {
      using P = layer_traits<Projection>;
      if constexpr (P::has_split_backward && P::has_backward_weight) {
        proj_.backward_weight(exec, dy, saved.proj);
      } else if constexpr (!P::has_split_backward) {
        if (!saved.shortcut_input_done) // dx was not needed: run the fused backward now
          proj_.backward(exec, dy, buffer(saved.grad, dy.extent(0), input_size(dy)), saved.proj);
      }
      saved.shortcut_input_done = false;
    }
  }

private:
  static Matrix<value_type, memory_space> buffer(Matrix<value_type, memory_space>& b, std::size_t n,
                                                 std::size_t k) {
    if (b.extent(0) != n || b.extent(1) != k)
      b = Matrix<value_type, memory_space>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::Residual::buffer"), n, k);
    return b;
  }
  std::size_t input_size(ConstMatrix<value_type, memory_space> const&) const {
    return body_.built_shapes().empty() ? 0 : body_.built_shapes().front().size();
  }

  Body body_;
  std::conditional_t<projected, Projection, detail::IdentityShortcut> proj_{};
  int tp_size_ = 1;
};

/*! \brief y = body(x) + x. \tparam Layers the body's layers (their output
 *  shape must equal their input shape) */
template <class... Layers>
using Residual = ResidualBlock<detail::IdentityShortcut, Layers...>;

/*! \brief y = body(x) + projection(x). \tparam Projection the shortcut layer
 *  \tparam Layers the body's layers */
template <class Projection, class... Layers>
using ProjectedResidual = ResidualBlock<Projection, Layers...>;

} // namespace telar
