#pragma once
// telar::detail::BroadcastTable: what telar::Bias and telar::Multiplier
// share, a table broadcast over every sample that is either trained (a
// parameter) or fixed (a buffer): its shapes, counts and checks. The layers
// keep the table's views themselves, under their own public names.
#include <telar/core/detail/broadcast_index.hpp>
#include <telar/core/detail/layer_types.hpp>
#include <telar/core/error.hpp>
#include <telar/core/shape.hpp>

#include <cstddef>
#include <string>

namespace telar::detail {

/*! \brief A layer with a table broadcast over samples of one shape.
 *  \tparam Derived the layer (CRTP: name() for messages)
 *  \tparam T value type \tparam MemorySpace memory space */
template <class Derived, class T, class MemorySpace>
class BroadcastTable : public ShapePreservingLayerTypes<T, MemorySpace> {
public:
  /*! \brief The input shape. \param in the shape it was made for
   *  \throws ShapeError for another input shape */
  Shape output_shape(Shape const& in) const {
    if (in != in_)
      throw ShapeError(api() + " (table " + table_.str() + ") expects inputs " + in_.str() +
                       ", got " + in.str());
    return in;
  }
  /*! \brief The table's shape. */
  Shape const& table_shape() const { return table_; }
  /*! \brief One addition or multiplication per value. */
  double flops(std::size_t samples, Shape const& in) const { return double(samples) * in.size(); }
  /*! \brief Whether the table is trained (a parameter) or fixed (a buffer). */
  bool trained() const { return trained_; }
  /*! \brief Values of a trained table. */
  std::size_t parameter_count() const { return trained_ ? table_.size() : 0; }
  /*! \brief Values of a fixed table. */
  std::size_t buffer_count() const { return trained_ ? 0 : table_.size(); }

protected:
  BroadcastTable() = default;
  // Throws ShapeError naming both shapes when the table does not broadcast.
  BroadcastTable(Shape const& in, Shape const& table, bool trained)
      : in_(in), table_(table), trained_(trained) {
    if (!index_.set(in, table))
      throw ShapeError(api() + ": a table " + table.str() + " does not broadcast over samples " +
                       in.str() + " (its last axes must each equal the sample's or be 1)");
  }

  // Throws ShapeError unless a and b are [n, sample size] and the table, of
  // `have` values, is allocated.
  template <class A, class B>
  void check(char const* what, A const& a, B const& b, std::size_t have) const {
    if (a.extent(0) == b.extent(0) && a.extent(1) == in_.size() && b.extent(1) == in_.size() &&
        have == table_.size())
      return;
    auto const dims = [](auto const& m) {
      return "[" + std::to_string(m.extent(0)) + ", " + std::to_string(m.extent(1)) + "]";
    };
    throw ShapeError(api() + "::" + what + ": expected [n, " + std::to_string(in_.size()) +
                     "] and a table of " + std::to_string(table_.size()) + ", got " + dims(a) +
                     " -> " + dims(b) + " and " + std::to_string(have) +
                     (have != table_.size() ? " (layer not initialised)" : ""));
  }

  Shape in_, table_;
  bool trained_ = true;
  BroadcastIndex index_;

private:
  static std::string api() { return std::string("telar::") + Derived::name(); }
};

} // namespace telar::detail
