#pragma once

#include <telar/core/detail/decl.hpp>
#include <telar/schedule/detail/execute.hpp>
#include <telar/schedule/detail/messages.hpp>
#include <telar/schedule/schedule.hpp>
#include <telar/schedule/validation_result.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace telar::schedule::detail {

class Validator {
public:
  Validator(Schedule const& s, ValidateOptions const& opt) : s_(s), opt_(opt) {}

  TELAR_DECL ValidationResult run();

private:
  struct Slot {
    int f = -1, b = -1, w = -1; // instruction indices of Forward, backward, weight part
    bool fused = false;
    int ra = -1, sa = -1, rg = -1, sg = -1; // the four messages
  };

  TELAR_DECL void add(int rank, int index, std::string reason);

  TELAR_DECL bool check_header();

  TELAR_DECL std::string what(Instruction const& in) const;

  // The peer a Send/Recv must name; reports and returns false when the layout allows none.
  TELAR_DECL bool check_layout(int r, int i, Instruction const& in);

  TELAR_DECL void check_rank(int r);

  // Runs every rank as far as the send semantics allow; whoever cannot finish is deadlocked.
  TELAR_DECL void check_progress(std::vector<std::vector<Site>> const& partner);

  Schedule const& s_;
  ValidateOptions opt_;
  ValidationResult result_;
  std::vector<std::vector<char>> usable_; // Send/Recv instructions with a correct layout
};

inline std::string describe(Schedule const& s) {
  return "\"" + s.name + "\" (p=" + std::to_string(s.stages) +
         ", m=" + std::to_string(s.microbatches) + ", v=" + std::to_string(s.chunks) + ")";
}

} // namespace telar::schedule::detail

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/schedule/detail/validator.ipp>
#endif
