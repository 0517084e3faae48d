#pragma once
// What a gradient-sync / residency component will hold per rank, so a
// memory plan can predict it before anything is allocated.
#include <cstddef>

namespace telar::detail {

struct ModelStateBytes {
  std::size_t parameters = 0;    // values held for the whole run
  std::size_t gradients = 0;     // peak gradient bytes during a step
  std::size_t communication = 0; // peak gather buffers (ZeRO-3)
};

} // namespace telar::detail
