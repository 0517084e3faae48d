#pragma once
// telar::detail::LayerTypes and ShapePreservingLayerTypes: the member types
// the Layer and Loss concepts (telar/core/layer.hpp, telar/core/loss.hpp)
// read from every layer and loss, written once for Telar's own layers, which
// inherit them publicly. The concept checks find them through inheritance,
// so a user's layer may as well declare them itself.

namespace telar::detail {

/// value_type and memory_space: what every layer and loss declares.
/// \tparam T value type \tparam MemorySpace memory space
template <class T, class MemorySpace>
struct LayerTypes {
  /// Scalar type.
  using value_type = T;
  /// Memory space of parameters and activations.
  using memory_space = MemorySpace;
};

/// LayerTypes of a layer whose output has the input's shape:
/// preserves_shape lets telar::Sequential see compile-time shapes through it.
/// \tparam T value type \tparam MemorySpace memory space
template <class T, class MemorySpace>
struct ShapePreservingLayerTypes : LayerTypes<T, MemorySpace> {
  /// The output has the input's shape.
  static constexpr bool preserves_shape = true;
};

} // namespace telar::detail
