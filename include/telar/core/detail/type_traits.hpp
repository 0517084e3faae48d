#pragma once
// C++17 detection idiom and small meta helpers used by the concept checks.
#include <type_traits>

namespace telar::detail {

template <class...>
inline constexpr bool dependent_false = false;

template <class Default, class AlwaysVoid, template <class...> class Op, class... Args>
struct detector {
  using value_t = std::false_type;
  using type = Default;
};
template <class Default, template <class...> class Op, class... Args>
struct detector<Default, std::void_t<Op<Args...>>, Op, Args...> {
  using value_t = std::true_type;
  using type = Op<Args...>;
};

struct nonesuch {};

/// True when Op<Args...> is well formed.
template <template <class...> class Op, class... Args>
inline constexpr bool is_detected_v = detector<nonesuch, void, Op, Args...>::value_t::value;

/// Op<Args...> when well formed, Default otherwise.
template <class Default, template <class...> class Op, class... Args>
using detected_or_t = typename detector<Default, void, Op, Args...>::type;

/// An optional flag of T (e.g. `static constexpr bool layerwise = true;`),
/// false when T does not declare it. Flag<T> is `std::bool_constant<bool(T::x)>`.
template <template <class> class Flag, class T>
inline constexpr bool flag_v = detected_or_t<std::false_type, Flag, T>::value;

/// Index of the first type in Ts that satisfies Pred, or sizeof...(Ts).
template <template <class> class Pred, class... Ts>
struct find_if;
template <template <class> class Pred>
struct find_if<Pred> : std::integral_constant<std::size_t, 0> {};
template <template <class> class Pred, class T, class... Ts>
struct find_if<Pred, T, Ts...>
    : std::integral_constant<std::size_t, Pred<T>::value ? 0 : 1 + find_if<Pred, Ts...>::value> {};

/// Number of types in Ts that satisfy Pred.
template <template <class> class Pred, class... Ts>
inline constexpr std::size_t count_if_v = (std::size_t{0} + ... + (Pred<Ts>::value ? 1 : 0));

} // namespace telar::detail
