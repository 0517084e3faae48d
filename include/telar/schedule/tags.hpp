#pragma once
/*! \file
 *  \brief Pipeline schedule tags (telar::GPipe, telar::OneFOneB,
 *  telar::Interleaved1F1B, telar::ZeroBubbleH1, telar::ZeroBubbleH2): each
 *  carries its canonical name and chunk count and builds its schedule.
 *  telar::schedule::canonical_name(), generate() and make_for_run() read the
 *  tags, so a schedule's name is written in one place.
 *
 *  Canonical names: `gpipe`, `1f1b`, `interleaved`, `zb-h1`, `zb-h2`. Any
 *  case is accepted, `_` may stand for `-`, and `interleaved_1f1b` names the
 *  interleaved schedule (the generator's function name).
 */
#include <telar/core/detail/decl.hpp>
#include <telar/schedule/generators.hpp>
#include <telar/schedule/schedule.hpp>

#include <cctype>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace telar {

namespace schedule::detail {
// A schedule of one model chunk per rank: its canonical name, no other
// spelling, one chunk, and make() that ignores a chunk count.
template <char const* Name, Schedule (*Generate)(int, int)>
struct OneChunkTag {
  /*! \brief Canonical name (logs, --schedule, Schedule::name). */
  static constexpr char const* name() { return Name; }
  /*! \brief Another accepted spelling (empty: none). */
  static constexpr char const* alias() { return ""; }
  /*! \brief Model chunks per rank. */
  static constexpr int chunks = 1;
  /*! \brief The schedule. \param p stages \param m micro-batches (the chunk count is ignored) */
  static Schedule make(int p, int m, int = chunks) { return Generate(p, m); }
};
} // namespace schedule::detail

/*! \brief GPipe: all forwards, then all backwards (peak memory m micro-batches). */
struct GPipe : schedule::detail::OneChunkTag<schedule::detail::names::gpipe, schedule::gpipe> {};

/*! \brief 1F1B (PipeDream-Flush): one forward, one backward in steady state
 *  (peak memory p micro-batches). */
struct OneFOneB
    : schedule::detail::OneChunkTag<schedule::detail::names::one_f_one_b, schedule::one_f_one_b> {};

/*! \brief Interleaved 1F1B with \p V model chunks per rank (Megatron-LM).
 *  \tparam V chunks per rank */
template <int V = 2>
struct Interleaved1F1B {
  static_assert(V >= 1, "telar::Interleaved1F1B: V (chunks per rank) must be at least 1");
  /*! \brief Canonical name. */
  static constexpr char const* name() { return schedule::detail::names::interleaved; }
  /*! \brief Another accepted spelling. */
  static constexpr char const* alias() { return "interleaved-1f1b"; }
  /*! \brief Model chunks per rank (TrainerOptions::chunks when named at run time). */
  static constexpr int chunks = V;
  /*! \brief The schedule. \param p stages \param m micro-batches \param v chunks per rank */
  static schedule::Schedule make(int p, int m, int v = chunks) {
    return schedule::interleaved_1f1b(p, m, v);
  }
};

/*! \brief ZB-H1 (Qi et al.): weight gradients fill the 1F1B bubble, same memory as 1F1B. */
struct ZeroBubbleH1
    : schedule::detail::OneChunkTag<schedule::detail::names::zb_h1, schedule::zb_h1> {};

/*! \brief ZB-H2 (Qi et al.): no bubble once m >= 2p - 1, at up to 2p - 1
 *  micro-batches of memory. */
struct ZeroBubbleH2
    : schedule::detail::OneChunkTag<schedule::detail::names::zb_h2, schedule::zb_h2> {};

/*! \brief True for the schedule tags. \tparam S a type */
template <class S>
inline constexpr bool is_schedule_tag_v =
    std::is_same_v<S, GPipe> || std::is_same_v<S, OneFOneB> || std::is_same_v<S, ZeroBubbleH1> ||
    std::is_same_v<S, ZeroBubbleH2>;
/*! \brief True for the schedule tags. \tparam V chunks per rank */
template <int V>
inline constexpr bool is_schedule_tag_v<Interleaved1F1B<V>> = true;

namespace detail {

// Every tag that can be named at run time (the interleaved one with its
// default chunk count; the run's chunk count is passed to make()).
using ScheduleTags = std::tuple<GPipe, OneFOneB, Interleaved1F1B<>, ZeroBubbleH1, ZeroBubbleH2>;

template <class F, std::size_t... I>
void for_each_tag(F&& f, std::index_sequence<I...>) {
  (f(std::tuple_element_t<I, ScheduleTags>{}), ...);
}
template <class F>
void for_each_tag(F&& f) {
  for_each_tag(f, std::make_index_sequence<std::tuple_size_v<ScheduleTags>>{});
}

// Lower case, '_' read as '-'.
TELAR_DECL std::string normalized(std::string s);

// "gpipe, ..., zb-h2; also accepted: interleaved_1f1b, zb_h1, ...": the
// canonical names, then the other spellings that differ by more than case.
TELAR_DECL std::string known_names();

} // namespace detail

namespace schedule {

/*! \brief Canonical names of the schedules, as the tags spell them:
 *  "gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2". */
TELAR_DECL std::vector<std::string> schedule_names();

/*! \brief The canonical name of a schedule given in any accepted spelling
 *  ("ZB_H1", "zb_h1" and "zb-h1" all give "zb-h1"; "interleaved_1f1b" gives
 *  "interleaved"). Parse command-line flags and options with it.
 *  \param name a name as a user wrote it
 *  \throws std::invalid_argument naming the known schedules */
TELAR_DECL std::string canonical_name(std::string const& name);

/*! \brief The schedule of the tag named \p name (any accepted spelling),
 *  for configuration files and tools.
 *  \param name a schedule name (see canonical_name())
 *  \param p pipeline ranks
 *  \param m micro-batches
 *  \param v chunks per rank, used by "interleaved" only
 *  \throws std::invalid_argument for an unknown name or invalid sizes */
TELAR_DECL Schedule generate(std::string const& name, int p, int m, int v = 2);

/*! \brief The schedule a training run uses: the tag named \p name, or
 *  \p DefaultTag (with its own chunk count) when \p name is empty. Chunks
 *  on one pipeline rank would only copy activations around, so with p = 1,
 *  or one chunk, the interleaved schedule is plain 1F1B.
 *  \tparam DefaultTag the strategy's schedule tag
 *  \param name a schedule name (see canonical_name()), or empty
 *  \param p pipeline ranks \param m micro-batches
 *  \param chunks chunks per rank for a named interleaved schedule
 *  \throws std::invalid_argument for an unknown name or invalid sizes */
template <class DefaultTag>
Schedule make_for_run(std::string const& name, int p, int m, int chunks) {
  static_assert(is_schedule_tag_v<DefaultTag>,
                "telar::schedule::make_for_run: DefaultTag must be a schedule tag such as "
                "telar::OneFOneB");
  std::string const canonical = name.empty() ? DefaultTag::name() : canonical_name(name);
  int v = name.empty() ? DefaultTag::chunks : chunks;
  bool const chunked = canonical == Interleaved1F1B<>::name();
  if (p == 1 || !chunked)
    v = 1;
  return chunked && v == 1 ? OneFOneB::make(p, m) : generate(canonical, p, m, v);
}

} // namespace schedule
} // namespace telar

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/schedule/tags.ipp>
#endif
