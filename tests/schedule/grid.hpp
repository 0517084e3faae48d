#pragma once
// Shared parameter grid of the schedule tests.
#include <array>

namespace telar_test {
inline constexpr std::array<int, 5> ps{1, 2, 3, 4, 8};
inline constexpr std::array<int, 6> ms{1, 2, 3, 4, 8, 16};
} // namespace telar_test
