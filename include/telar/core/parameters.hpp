#pragma once
/*! \file
 *  \brief Flat, contiguous storage of a model's parameters and gradients.
 *
 *  Layers allocate their parameters as they like; Telar then copies them into
 *  one flat value buffer and one flat gradient buffer and rebinds the layers'
 *  views to slices of these. One contiguous range per rank is what makes
 *  bucketed gradient reductions, ZeRO sharding and element-wise optimizers
 *  simple and fast: a bucket or a shard is an offset and a length.
 */
#include <telar/core/layer.hpp>
#include <telar/core/tensor.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace telar {

/*! \brief Where one parameter tensor lives in the flat buffers. */
struct ParameterInfo {
  std::string name;       //!< "layer<k>.<name>", e.g. "layer0.weight"
  std::size_t layer = 0;  //!< index of the owning layer in the model
  std::size_t offset = 0; //!< first element in the flat buffers
  std::size_t size = 0;   //!< number of elements
  int replicas = 1;       //!< identical copies across the ranks that reduce norms together
};

/*! \brief Flat value and gradient buffers of the parameters of some layers.
 *  \tparam T value type \tparam MemorySpace memory space */
template <class T, class MemorySpace>
class ParameterStore {
public:
  /*! \brief Elements between tensor starts are a multiple of this (64 bytes
   *  for float), so each tensor starts aligned for vector loads. */
  static constexpr std::size_t alignment = 64 / sizeof(T) > 0 ? 64 / sizeof(T) : 1;

  /*! \brief Binds the parameters of layers [first, last) of \p model.
   *  Values are copied in; gradients start at zero.
   *  \param model a telar::Sequential \param first first layer \param last one past the last */
  template <class Model>
  void bind(Model& model, std::size_t first, std::size_t last) {
    std::vector<bool> owned(model.layer_count(), false);
    for (std::size_t k = first; k < last && k < model.layer_count(); ++k)
      owned[k] = true;
    bind(model, owned);
  }

  /*! \brief Binds the parameters of the layers k with owned[k] (several
   *  pipeline chunks on one rank). \param model a telar::Sequential
   *  \param owned one flag per layer */
  template <class Model>
  void bind(Model& model, std::vector<bool> const& owned) {
    bind(model, owned, [](std::size_t n) {
      return std::make_pair(Vector<T, MemorySpace>("telar::ParameterStore::values", n),
                            Vector<T, MemorySpace>("telar::ParameterStore::grads", n));
    });
  }

  /*! \brief As bind(model, owned), with the flat buffers supplied by
   *  \p allocate(n) -> (values, grads), e.g. in memory shared between the
   *  ranks of a node. The buffers are zeroed by the allocator's owner. An
   *  empty gradient buffer leaves the layers' gradient views pointing nowhere
   *  (ZeRO-2: rebind() them to a group's buffer while it accumulates).
   *  \param model a telar::Sequential \param owned one flag per layer
   *  \param allocate callable returning a pair of views of at least n elements
   *  \param copy_values copy the layers' values in (false when another rank
   *  already fills a buffer shared with this one)
   *  \param multiple the total length is rounded up to a multiple of this
   *  (shards of equal size) */
  template <class Model, class Allocate>
  void bind(Model& model, std::vector<bool> const& owned, Allocate&& allocate,
            bool copy_values = true, std::size_t multiple = 1) {
    layout(model, owned, multiple);
    std::tie(values_, grads_) = allocate(total_);
    for_each_tensor(model, [&](std::size_t k, auto& value, auto& grad) {
      auto bound_value = slice(value, values_, entries_[k].offset);
      if (copy_values)
        Kokkos::deep_copy(bound_value, value);
      value = bound_value;
      grad = slice(grad, grads_, entries_[k].offset);
    });
  }

  /*! \brief Lays out the parameters of the layers k with owned[k] (entries(),
   *  size()) without allocating any buffer or touching the layers' views
   *  (ZeRO-3: the values live in shards, see rebind()).
   *  \param model a telar::Sequential whose layers' views have their shapes
   *  (they may point nowhere) \param owned one flag per layer
   *  \param multiple the total length is rounded up to a multiple of this */
  template <class Model>
  void layout(Model& model, std::vector<bool> const& owned, std::size_t multiple = 1) {
    entries_.clear();
    owned_ = owned;
    std::size_t total = 0;
    for_each_tensor(
        model, [&](std::size_t, auto& value, auto& grad, std::size_t index, char const* name) {
          static_assert(std::is_same_v<std::decay_t<decltype(value)>, std::decay_t<decltype(grad)>>,
                        "telar::ParameterStore: a parameter's value and gradient views must have "
                        "the same type");
          ParameterInfo info;
          info.name = detail::layer_prefix(model, index) + name;
          info.layer = index;
          info.offset = total;
          info.size = value.size();
          entries_.push_back(info);
          total += (info.size + alignment - 1) / alignment * alignment;
        });
    if (multiple > 1)
      total = (total + multiple - 1) / multiple * multiple;
    total_ = total;
  }

  /*! \brief Which views rebind() moves. */
  enum class Part {
    values, //!< the parameter values
    grads   //!< the gradients
  };

  /*! \brief Points the value (or gradient) views of the tensors that start in
   *  the flat range [begin, end) into \p buffer, whose element 0 stands for
   *  flat element \p begin; an empty \p buffer leaves them pointing nowhere
   *  (their shapes kept), so the memory they used can be freed. Used to hold
   *  only some groups' parameters or gradients at a time (ZeRO-2/3).
   *  \param model the bound model \param begin first flat element
   *  \param end one past the last \param buffer at least end - begin
   *  elements, or empty \param part values or grads */
  template <class Model>
  void rebind(Model& model, std::size_t begin, std::size_t end,
              Vector<T, MemorySpace> const& buffer, Part part) const {
    for_each_tensor(model, [&](std::size_t k, auto& value, auto& grad) {
      std::size_t const off = entries_[k].offset;
      if (off < begin || off >= end)
        return;
      auto& view = part == Part::values ? value : grad;
      view = slice(view, buffer, off - begin);
    });
  }

  /*! \brief Copies the layers' current values of the flat range [begin, end)
   *  into \p out (out[0] is element \p begin; padding is left alone). The
   *  tensors in the range must have values.
   *  \param model the bound model \param begin first flat element
   *  \param end one past the last \param out at least end - begin elements */
  template <class Model>
  void copy_values(Model& model, std::size_t begin, std::size_t end,
                   Vector<T, MemorySpace> const& out) const {
    using Flat = Kokkos::View<T*, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    for_each_tensor(model, [&](std::size_t k, auto& value, auto&) {
      std::size_t const off = entries_[k].offset;
      std::size_t const b = std::max(begin, off), e = std::min(end, off + entries_[k].size);
      if (b >= e)
        return;
      Flat const from(value.data() + (b - off), e - b);
      Flat const to(out.data() + (b - begin), e - b);
      Kokkos::deep_copy(to, from);
    });
  }

  /*! \brief Points every parameter and gradient view of layer \p layer
   *  nowhere (shapes kept), freeing what the layer allocated itself.
   *  \param model a telar::Sequential \param layer layer index */
  template <class Model>
  static void drop(Model& model, std::size_t layer) {
    model.for_each_layer([&](auto index, auto& l) {
      using L = std::decay_t<decltype(l)>;
      if constexpr (layer_traits<L>::has_parameters)
        if (index == layer)
          l.parameters([&](char const*, auto& value, auto& grad) {
            value = slice(value, Vector<T, MemorySpace>(), 0);
            grad = slice(grad, Vector<T, MemorySpace>(), 0);
          });
    });
  }

  /*! \brief All parameter values, flat. */
  Vector<T, MemorySpace> const& values() const { return values_; }
  /*! \brief All gradients, flat, aligned with values(). */
  Vector<T, MemorySpace> const& grads() const { return grads_; }
  /*! \brief The tensors, in model order. */
  std::vector<ParameterInfo> const& entries() const { return entries_; }
  /*! \brief Mutable tensors (strategies set ParameterInfo::replicas). */
  std::vector<ParameterInfo>& entries() { return entries_; }
  /*! \brief Length of the flat buffers, padding included. */
  std::size_t size() const { return total_; }

  /*! \brief Flat range [begin, end) spanned by the tensors of layer \p layer
   *  (begin == end when it has none). \param layer layer index */
  std::pair<std::size_t, std::size_t> layer_range(std::size_t layer) const {
    std::size_t b = size(), e = 0;
    for (auto const& p : entries_)
      if (p.layer == layer) {
        b = std::min(b, p.offset);
        e = std::max(e, p.offset + p.size);
      }
    return b < e ? std::make_pair(b, e) : std::make_pair(std::size_t{0}, std::size_t{0});
  }

  /*! \brief Sets every gradient to zero. \param exec execution space instance */
  template <class Exec>
  void zero_grads(Exec const& exec) const {
    Kokkos::deep_copy(exec, grads_, T(0));
  }

  /*! \brief The pieces of the tensors that fall into the flat range
   *  [begin, end), as (tensor index, offset from begin, length).
   *  \param begin first element \param end one past the last */
  std::vector<std::tuple<std::size_t, std::size_t, std::size_t>> pieces(std::size_t begin,
                                                                        std::size_t end) const {
    std::vector<std::tuple<std::size_t, std::size_t, std::size_t>> out;
    for (std::size_t t = 0; t < entries_.size(); ++t) {
      std::size_t const b = std::max(begin, entries_[t].offset);
      std::size_t const e = std::min(end, entries_[t].offset + entries_[t].size);
      if (b < e)
        out.emplace_back(t, b - begin, e - b);
    }
    return out;
  }

private:
  // A view of v's shape at buffer[off] (nowhere when buffer is empty).
  template <class V>
  static V slice(V const& v, Vector<T, MemorySpace> const& buffer, std::size_t off) {
    return V(buffer.data() != nullptr ? buffer.data() + off : nullptr, v.layout());
  }

  // f(k, value, grad[, layer index, name]) for every tensor of the owned
  // layers, k counting in model order (the entries' order).
  template <class Model, class F>
  void for_each_tensor(Model& model, F&& f) const {
    std::size_t k = 0;
    model.for_each_layer([&](auto index, auto& layer) {
      using L = std::decay_t<decltype(layer)>;
      if constexpr (layer_traits<L>::has_parameters) {
        if (index >= owned_.size() || !owned_[index])
          return;
        layer.parameters([&](char const* name, auto& value, auto& grad) {
          if constexpr (std::is_invocable_v<F&, std::size_t, decltype(value), decltype(grad),
                                            std::size_t, char const*>)
            f(k, value, grad, std::size_t(index), name);
          else
            f(k, value, grad);
          ++k;
        });
      }
    });
  }

  std::vector<bool> owned_;
  Vector<T, MemorySpace> values_;
  Vector<T, MemorySpace> grads_;
  std::size_t total_ = 0;
  std::vector<ParameterInfo> entries_;
};

} // namespace telar
