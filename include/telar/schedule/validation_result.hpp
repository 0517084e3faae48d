#pragma once

#include <telar/core/detail/decl.hpp>
#include <telar/core/error.hpp>
#include <telar/schedule/instruction.hpp>

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

/*! \file
    \brief What validate() reports: Issue, ValidationResult, ScheduleError; and ValidateOptions. */

namespace telar::schedule {

/*! \brief How sends behave in the validator's deadlock check. */
enum class SendMode {
  Eager, //!< sends never block (MPI_Isend completed later); receives block until the matching send
         //!< has run. What Telar's executor does.
  Rendezvous //!< stricter: a send also blocks until the peer has reached the matching receive
             //!< (blocking MPI_Ssend-like executors)
};

/*! \brief Options of validate() and check(). */
struct ValidateOptions {
  SendMode send_mode = SendMode::Eager; //!< semantics of the deadlock check
  std::size_t max_issues = 64; //!< issues kept in ValidationResult; the rest are only counted
};

/*! \brief One problem found in a schedule, located by rank and instruction index. */
struct Issue {
  int rank = -1;  //!< pipeline rank, or -1 for a problem with the schedule as a whole
  int stage = -1; //!< virtual stage the instruction belongs to (the rank when chunks = 1), or -1
  int index = -1; //!< index in the rank's list; the list's size for "missing ..." at its end
  std::optional<Instruction> instruction; //!< the instruction at `index`, if there is one
  std::string reason;                     //!< what is wrong

  /*! \brief E.g. "rank 1 (stage 1), instruction 4 RecvGrad(mb=0, chunk=0, peer=2): deadlock: ...".
   */
  TELAR_DECL std::string to_string() const;
};

/*! \brief Outcome of validate(): valid when there are no issues. */
struct ValidationResult {
  std::vector<Issue> issues;  //!< the problems found (at most ValidateOptions::max_issues)
  std::size_t suppressed = 0; //!< further problems not kept in `issues`

  /*! \brief True when the schedule passed every check. */
  bool ok() const { return issues.empty() && suppressed == 0; }
  /*! \brief Same as ok(). */
  explicit operator bool() const { return ok(); }
  /*! \brief All issues, one per line; empty when ok(). */
  TELAR_DECL std::string message() const;
};

/*! \brief Thrown by check() and simulate() for an invalid schedule; what() lists the issues. A
    telar::Error, like every exception Telar throws. */
class ScheduleError : public telar::Error {
public:
  /*! \brief An error with message `what` and the issues behind it. */
  ScheduleError(std::string const& what, ValidationResult result)
      : telar::Error(what), result_(std::move(result)) {}
  /*! \brief The validation result that caused the error. */
  ValidationResult const& result() const noexcept { return result_; }

private:
  ValidationResult result_;
};

} // namespace telar::schedule

#if !defined(TELAR_SEPARATE_COMPILATION)
#include <telar/schedule/validation_result.ipp>
#endif
