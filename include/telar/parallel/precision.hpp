#pragma once
/*! \file
 *  \brief telar::Precision in a strategy: the model's layers rebound, at
 *  compile time, to the GEMM and convolution policies of the compute type.
 *
 *  \code
 *  using S = telar::Strategy<telar::DataParallel<>, telar::Precision<telar::bf16, float>>;
 *  telar::Trainer<Model, S, telar::AdamW<float>> t(comm, make_model(), {}, opts, in_shape);
 *  // t.model() is a telar::WithPrecision<Model, telar::Precision<telar::bf16, float>>
 *  \endcode
 *  Under Precision<bf16, float> every telar::Dense, Conv2D/3D,
 *  ConvTranspose2D/3D and CausalSelfAttention of the model, inside
 *  Sequential, Residual, Concat/Add/Mul, DenseConcat, Recompute, the
 *  tensor-parallel wrappers and the run-time containers (DynamicSequential,
 *  DynamicResidual, DynamicGraph: an ONNX import), multiplies through
 *  telar::Bf16Gemm, its convolutions through telar::bf16_conv_policy_t
 *  (oneDNN's bf16 primitives in host memory, im2col and cuBLAS's bf16 GEMM
 *  in CUDA memory); parameters, gradients, optimizer state, norms, softmax
 *  and losses stay float (docs/precision.md); in host memory every GELU,
 *  GELUTanh and SiLU becomes a telar::KeptInBf16 (its input kept in bf16 for
 *  backward). Other layers are kept as they are. A layer that cannot
 *  multiply in bf16 (double; memory where Telar has neither oneDNN nor
 *  cuBLAS; a GraphChain, whose units are chosen at run time) is a compile
 *  error that starts with "telar::Precision".
 */
#include <telar/core/detail/type_traits.hpp>
#include <telar/core/error.hpp>
#include <telar/core/gemm.hpp>
#include <telar/core/sequential.hpp>
#include <telar/layers/conv_policy.hpp>
#include <telar/parallel/strategy.hpp>

#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

namespace telar {

// The layer templates a rebind looks into, declared here so that this header
// does not pull in every layer (a model's own headers define them).
template <class T, class MemorySpace, class Gemm>
class Dense;
template <class T, std::size_t In, std::size_t Out, class MemorySpace, class Gemm>
class StaticDense;
template <class T, int Dims, class MemorySpace, class Gemm, class ConvPolicy>
class Convolution;
template <class T, int Dims, class MemorySpace, class Gemm, class ConvPolicy>
class TransposedConvolution;
template <class T, class MemorySpace, class Gemm>
class CausalSelfAttention;
template <class T, class MemorySpace>
struct GELU;
template <class T, class MemorySpace>
struct GELUTanh;
template <class T, class MemorySpace>
struct SiLU;
template <class Act>
struct KeptInBf16;
template <class L>
class ColumnParallel;
template <class L>
class RowParallel;
template <class L>
class HeadParallel;
template <class L>
class Recompute;
template <class Projection, class... Layers>
class ResidualBlock;
template <class... Layers>
class DenseConcat;
template <class Variant>
class DynamicSequential;
template <class Variant>
class DynamicResidual;
template <class Variant>
class DynamicGraph;
template <class Variant>
class GraphChain;
namespace detail {
template <class Kind, class... Branches>
class BranchBlock;
struct IdentityShortcut;
} // namespace detail

namespace detail {

// A layer is rebound where telar::bf16_layers_supported<T, MemorySpace>():
// float layers in host memory with oneDNN (compact copies, its bf16
// convolutions, the weights rounded once a step) or in CUDA memory with
// cuBLAS (its bf16 GEMM, convolutions as im2col and that GEMM); elsewhere
// it is refused with its name.
/// \cond TELAR_INTERNAL
#define TELAR_PRECISION_REFUSE(what)                                                               \
  "telar::Precision<telar::bf16, float>: " what " cannot compute in bf16 here: telar::Bf16Gemm "   \
  "multiplies float layers in host memory with oneDNN and in CUDA memory with cuBLAS; use float "  \
  "layers there, or telar::Precision<float, float>"
/// \endcond

// rebind<L>: L's type under bf16 compute, and convert(L) the same layer
// under it. Layers without GEMMs, and unknown ones, stay as they are.
template <class L>
struct bf16_rebind {
  using type = L;
  static L convert(L l) { return l; }
};

// A leaf layer whose GEMM / convolution policies are template arguments:
// its converting constructor copies it under the bf16 ones.
template <class From, class To>
struct bf16_rebind_leaf {
  using type = To;
  static To convert(From const& l) { return To(l); }
};

template <class T, class M, class G>
struct bf16_rebind<Dense<T, M, G>> : bf16_rebind_leaf<Dense<T, M, G>, Dense<T, M, Bf16Gemm>> {
  static_assert(bf16_layers_supported<T, M>(), TELAR_PRECISION_REFUSE("telar::Dense"));
};
template <class T, std::size_t I, std::size_t O, class M, class G>
struct bf16_rebind<StaticDense<T, I, O, M, G>>
    : bf16_rebind_leaf<StaticDense<T, I, O, M, G>, StaticDense<T, I, O, M, Bf16Gemm>> {
  static_assert(bf16_layers_supported<T, M>(), TELAR_PRECISION_REFUSE("telar::StaticDense"));
};
template <class T, int D, class M, class G, class C>
struct bf16_rebind<Convolution<T, D, M, G, C>>
    : bf16_rebind_leaf<Convolution<T, D, M, G, C>,
                       Convolution<T, D, M, Bf16Gemm, bf16_conv_policy_t<T, M>>> {
  static_assert(bf16_layers_supported<T, M>(), TELAR_PRECISION_REFUSE("telar::Conv2D / Conv3D"));
};
template <class T, int D, class M, class G, class C>
struct bf16_rebind<TransposedConvolution<T, D, M, G, C>>
    : bf16_rebind_leaf<TransposedConvolution<T, D, M, G, C>,
                       TransposedConvolution<T, D, M, Bf16Gemm, bf16_conv_policy_t<T, M>>> {
  static_assert(bf16_layers_supported<T, M>(),
                TELAR_PRECISION_REFUSE("telar::ConvTranspose2D / ConvTranspose3D"));
};
template <class T, class M, class G>
struct bf16_rebind<CausalSelfAttention<T, M, G>>
    : bf16_rebind_leaf<CausalSelfAttention<T, M, G>, CausalSelfAttention<T, M, Bf16Gemm>> {
  static_assert(bf16_layers_supported<T, M>(),
                TELAR_PRECISION_REFUSE("telar::CausalSelfAttention"));
};
// Activations whose backward reads their input keep it in bf16 where no
// neighbour keeps it (telar::KeptInBf16: oneDNN's compact copies, host
// memory); in CUDA memory they stay as they are.
template <class Act, class T, class M>
struct bf16_rebind_kept
    : std::conditional_t<onednn_bf16_v<Bf16Gemm, T, M>, bf16_rebind_leaf<Act, KeptInBf16<Act>>,
                         bf16_rebind_leaf<Act, Act>> {
  static_assert(bf16_layers_supported<T, M>(),
                TELAR_PRECISION_REFUSE("telar::GELU / GELUTanh / SiLU"));
};
template <class T, class M>
struct bf16_rebind<GELU<T, M>> : bf16_rebind_kept<GELU<T, M>, T, M> {};
template <class T, class M>
struct bf16_rebind<GELUTanh<T, M>> : bf16_rebind_kept<GELUTanh<T, M>, T, M> {};
template <class T, class M>
struct bf16_rebind<SiLU<T, M>> : bf16_rebind_kept<SiLU<T, M>, T, M> {};
// Tensor-parallel wrappers: the wrapped layer's rebind, kept wrapped.
template <template <class> class Wrap, class L>
struct bf16_rebind_wrapped : bf16_rebind_leaf<Wrap<L>, Wrap<typename bf16_rebind<L>::type>> {};
template <class L>
struct bf16_rebind<ColumnParallel<L>> : bf16_rebind_wrapped<ColumnParallel, L> {};
template <class L>
struct bf16_rebind<RowParallel<L>> : bf16_rebind_wrapped<RowParallel, L> {};
template <class L>
struct bf16_rebind<HeadParallel<L>> : bf16_rebind_wrapped<HeadParallel, L> {};

template <class L>
using bf16_rebind_t = typename bf16_rebind<L>::type;
template <class L>
bf16_rebind_t<L> bf16_convert(L const& l) {
  return bf16_rebind<L>::convert(l);
}

// Containers: each part rebound, the container rebuilt around them.
template <class... Ls>
struct bf16_rebind<Sequential<Ls...>> {
  using type = Sequential<bf16_rebind_t<Ls>...>;
  static type convert(Sequential<Ls...> const& s) {
    return std::apply([](auto const&... l) { return type(bf16_convert(l)...); }, s.layers());
  }
};
template <class L>
struct bf16_rebind<Recompute<L>> {
  using type = Recompute<bf16_rebind_t<L>>;
  static type convert(Recompute<L> const& r) { return type(bf16_convert(r.inner())); }
};
template <class Kind, class... Bs>
struct bf16_rebind<BranchBlock<Kind, Bs...>> {
  using type = BranchBlock<Kind, bf16_rebind_t<Bs>...>;
  static type convert(BranchBlock<Kind, Bs...> const& b) {
    return convert(b, std::index_sequence_for<Bs...>{});
  }
  template <std::size_t... I>
  static type convert(BranchBlock<Kind, Bs...> const& b, std::index_sequence<I...>) {
    return type(bf16_convert(b.template branch<I>())...);
  }
};
template <class P, class... Ls>
struct bf16_rebind<ResidualBlock<P, Ls...>> {
  using type = ResidualBlock<bf16_rebind_t<P>, bf16_rebind_t<Ls>...>;
  static type convert(ResidualBlock<P, Ls...> const& r) {
    return std::apply(
        [&](auto const&... l) {
          if constexpr (std::is_same_v<P, IdentityShortcut>)
            return type(bf16_convert(l)...);
          else
            return type(bf16_convert(r.projection()), bf16_convert(l)...);
        },
        r.body().layers());
  }
};
template <class... Ls>
struct bf16_rebind<DenseConcat<Ls...>> {
  using type = DenseConcat<bf16_rebind_t<Ls>...>;
  static type convert(DenseConcat<Ls...> const& d) {
    return std::apply([](auto const&... l) { return type(bf16_convert(l)...); }, d.body().layers());
  }
};
// Layer L again from its rebind, on the same parameter and buffer views
// (every converting constructor shares them): what a hook that takes the
// fp32 layer sees of a rebound one.
template <class L>
struct bf16_back {
  static constexpr bool ok = std::is_constructible_v<L, bf16_rebind_t<L> const&>;
  static L convert(bf16_rebind_t<L> const& l) { return L(l); }
};

// A layer variant of run-time containers: the variant of its alternatives'
// rebinds (the k-th alternative becomes the k-th), each layer converted as
// its alternative; back(w): the fp32 variant on the same views (bf16_back).
template <class V>
struct bf16_rebind_variant;
// The variant Out holding, at v's index I, f(v's alternative, I).
template <class Out, std::size_t I = 0, class In, class F>
Out map_alternative(In const& v, F const& f) {
  if constexpr (I + 1 < std::variant_size_v<In>)
    if (v.index() != I)
      return map_alternative<Out, I + 1>(v, f);
  return Out(std::in_place_index<I>, f(std::get<I>(v), std::integral_constant<std::size_t, I>{}));
}
template <class... Ls>
struct bf16_rebind_variant<std::variant<Ls...>> {
  using fp32 = std::variant<Ls...>;
  using type = std::variant<bf16_rebind_t<Ls>...>;
  static constexpr bool reversible = (bf16_back<Ls>::ok && ...);

  static type convert(fp32 const& v) {
    return map_alternative<type>(v, [](auto const& l, auto) { return bf16_convert(l); });
  }
  static fp32 back(type const& w) {
    return map_alternative<fp32>(w, [](auto const& l, auto i) {
      return bf16_back<std::variant_alternative_t<decltype(i)::value, fp32>>::convert(l);
    });
  }
  // A container's initializer hook f(key, fp32 layer) as one on the rebound
  // layer: it writes (e.g. an ONNX import's start values) through the views
  // the two share. A variant with a layer that does not convert back is
  // refused (the hook would write into a copy).
  template <class Key>
  static std::function<void(Key, type&)> hook(std::function<void(Key, fp32&)> f,
                                              char const* container) {
    if (!f)
      return {};
    if constexpr (reversible) {
      return [f = std::move(f)](Key k, type& w) {
        fp32 v = back(w);
        f(k, v);
      };
    } else {
      throw Error(std::string("telar::Precision<telar::bf16, float>: a telar::") + container +
                  " with an initializer hook (set_initializer) cannot be rebound, the hook takes "
                  "its fp32 layer variant and a layer of it has no converting constructor back "
                  "from its bf16 type; put telar::Bf16Gemm / telar::OneDnnConvBf16 in the layer "
                  "types of its variant instead");
    }
  }
};

// A run-time container C<V> (DynamicSequential, or DynamicGraph: the same
// nodes and tensors; its joins stay fp32): its layers rebound, its hook kept.
template <template <class> class C, class V>
struct bf16_rebind_container {
  using type = C<typename bf16_rebind_variant<V>::type>;
  static type convert(C<V> const& c) {
    type out(c, [](V const& l) { return bf16_rebind_variant<V>::convert(l); });
    out.set_initializer(bf16_rebind_variant<V>::hook(c.initializer_hook(), type::name()));
    return out;
  }
};
// ... and back, on the same views (what a hook of an enclosing container sees).
template <template <class> class C, class V>
struct bf16_back_container {
  static constexpr bool ok = bf16_rebind_variant<V>::reversible;
  static C<V> convert(typename bf16_rebind_container<C, V>::type const& c) {
    return C<V>(c, [](auto const& w) { return bf16_rebind_variant<V>::back(w); });
  }
};
template <class V>
struct bf16_rebind<DynamicSequential<V>> : bf16_rebind_container<DynamicSequential, V> {};
template <class V>
struct bf16_back<DynamicSequential<V>> : bf16_back_container<DynamicSequential, V> {};
template <class V>
struct bf16_rebind<DynamicGraph<V>> : bf16_rebind_container<DynamicGraph, V> {};
template <class V>
struct bf16_back<DynamicGraph<V>> : bf16_back_container<DynamicGraph, V> {};
template <class V>
struct bf16_rebind<DynamicResidual<V>> {
  using type = DynamicResidual<typename bf16_rebind_variant<V>::type>;
  static type convert(DynamicResidual<V> const& r) { return type(bf16_convert(r.body())); }
};
template <class V>
struct bf16_back<DynamicResidual<V>> {
  static constexpr bool ok = bf16_rebind_variant<V>::reversible;
  static DynamicResidual<V> convert(bf16_rebind_t<DynamicResidual<V>> const& r) {
    return DynamicResidual<V>(bf16_back<DynamicSequential<V>>::convert(r.body()));
  }
};
template <class V>
struct bf16_rebind<GraphChain<V>> {
  static_assert(dependent_false<V>,
                "telar::Precision<telar::bf16, float>: telar::GraphChain cannot be rebound (its "
                "layers are chosen at run time); put telar::Bf16Gemm / telar::OneDnnConvBf16 in "
                "the layer types of its variant instead");
};
#undef TELAR_PRECISION_REFUSE

// Whether layer L multiplies in bf16 (a bf16 rebind's leaf, or a
// tensor-parallel / Recompute wrapper of one): its calibration group is
// apart from the fp32 layer's (calibration_group()), so a profile cached by
// an fp32 run does not stand in for bf16 times, nor the other way round.
template <class L>
struct computes_bf16 : std::false_type {};
template <class T, class M>
struct computes_bf16<Dense<T, M, Bf16Gemm>> : std::true_type {};
template <class T, std::size_t I, std::size_t O, class M>
struct computes_bf16<StaticDense<T, I, O, M, Bf16Gemm>> : std::true_type {};
template <class T, int D, class M, class G>
struct computes_bf16<Convolution<T, D, M, G, OneDnnConvBf16>> : std::true_type {};
template <class T, int D, class M, class G>
struct computes_bf16<TransposedConvolution<T, D, M, G, OneDnnConvBf16>> : std::true_type {};
template <class T, int D, class M> // im2col's GEMMs in bf16 (CUDA memory)
struct computes_bf16<Convolution<T, D, M, Bf16Gemm, Im2colConv>> : std::true_type {};
template <class T, int D, class M>
struct computes_bf16<TransposedConvolution<T, D, M, Bf16Gemm, Im2colConv>> : std::true_type {};
template <class T, class M>
struct computes_bf16<CausalSelfAttention<T, M, Bf16Gemm>> : std::true_type {};
template <class L>
struct computes_bf16<ColumnParallel<L>> : computes_bf16<L> {};
template <class L>
struct computes_bf16<RowParallel<L>> : computes_bf16<L> {};
template <class L>
struct computes_bf16<HeadParallel<L>> : computes_bf16<L> {};
template <class L>
struct computes_bf16<Recompute<L>> : computes_bf16<L> {};
template <class L>
inline constexpr bool computes_bf16_v = computes_bf16<L>::value;
template <class... Ls> // a run-time graph that has a bf16 layer alternative
struct computes_bf16<DynamicGraph<std::variant<Ls...>>>
    : std::bool_constant<(computes_bf16_v<Ls> || ...)> {};

// The model a Trainer runs under precision P.
template <class Model, class P>
struct precision_model {
  using type = Model;
  static Model convert(Model m) { return m; }
};
template <class Model, class R>
struct precision_model<Model, Precision<bf16, float, R>> {
  using type = bf16_rebind_t<Model>;
  static type convert(Model const& m) { return bf16_convert(m); }
};

// A Strategy's precision policy (float, float for anything else: the
// Trainer's own checks name a type that is not a strategy).
template <class S>
struct strategy_precision {
  using type = Precision<float, float>;
};
template <class... Ps>
struct strategy_precision<Strategy<Ps...>> {
  using type = typename Strategy<Ps...>::precision;
};
template <class S>
using strategy_precision_t = typename strategy_precision<S>::type;

// Whether Model is already the model a Trainer with strategy S trains: the
// planning functions (plan_memory, predict_step, plan_layout) rebind a model
// that is not, so that a bf16 strategy is never planned with fp32 layers.
template <class S, class Model>
inline constexpr bool trained_as_given_v =
    std::is_same_v<typename precision_model<Model, strategy_precision_t<S>>::type, Model>;

} // namespace detail

/*! \brief The model type under precision policy \p P: for
 *  telar::Precision<telar::bf16, float>, every Dense, convolution and
 *  attention layer with the bf16 GEMM / convolution policies; \p Model
 *  itself for Precision<float, float>.
 *  \tparam Model a model (telar::Sequential) \tparam P a telar::Precision */
template <class Model, class P>
using WithPrecision = typename detail::precision_model<Model, P>::type;

/*! \brief The same model (configuration and any parameter views it holds)
 *  under precision policy \p P; what a telar::Trainer whose strategy names
 *  \p P does with the model it is given. \tparam P a telar::Precision
 *  \param model the model \return a telar::WithPrecision<Model, P> */
template <class P, class Model>
WithPrecision<Model, P> with_precision(Model const& model) {
  static_assert(is_precision_v<P>, "telar::with_precision: P must be a telar::Precision<...>");
  return detail::precision_model<Model, P>::convert(model);
}

} // namespace telar
