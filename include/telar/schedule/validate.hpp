#pragma once

#include <telar/schedule/detail/validator.hpp>
#include <telar/schedule/schedule.hpp>
#include <telar/schedule/validation_result.hpp>

#include <string>
#include <utility>

/*! \file
    \brief The schedule validator: ordering, matching, memory and deadlock checks. */

namespace telar::schedule {

/*! \brief Checks that `s` can run and is well formed; never throws.

    Checks, each reported with rank, instruction index, instruction and reason:
    - sizes: stages, microbatches, chunks >= 1, one list per rank; indices in range;
    - on each rank and chunk, every micro-batch has exactly one Forward, then one Backward, or one
      BackwardInput and then one BackwardWeight, in that order;
    - activations are not used after they are freed (by BackwardWeight or fused Backward);
    - messages follow the layout (see Schedule): each Forward/backward has the Recv before it and
      the Send after it that its virtual stage needs, with the right peer; every Send has exactly
      one matching Recv on the peer (same MessageKey);
    - exactly one OptimizerStep, last (hence after every BackwardWeight);
    - no deadlock: the ranks are executed under ValidateOptions::send_mode, and every rank that
      cannot finish is reported with the instruction it is blocked on and what it waits for.

    The deadlock check runs only when everything else passed. */
inline ValidationResult validate(Schedule const& s, ValidateOptions const& options = {}) {
  return detail::Validator(s, options).run();
}

/*! \brief validate(), throwing on failure.
    \throws ScheduleError (a std::invalid_argument) whose what() names the schedule and lists the
    issues. */
inline void check(Schedule const& s, ValidateOptions const& options = {}) {
  ValidationResult result = validate(s, options);
  if (result.ok())
    return;
  // Build the text first: the constructor's by-value argument may be moved from before.
  std::string what = "telar::schedule::check: schedule " + detail::describe(s) + " is invalid:\n" +
                     result.message();
  throw ScheduleError(what, std::move(result));
}

} // namespace telar::schedule
