// What telar/schedule/validation_result.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/schedule/validation_result.hpp>

namespace telar::schedule {

TELAR_DECL std::string Issue::to_string() const {
  if (rank < 0)
    return "schedule: " + reason;
  std::string where = "rank " + std::to_string(rank);
  if (stage >= 0)
    where += " (stage " + std::to_string(stage) + ")";
  where += ", ";
  if (instruction)
    where +=
        "instruction " + std::to_string(index) + " " + telar::schedule::to_string(*instruction);
  else
    where += "end of list (instruction " + std::to_string(index) + ")";
  return where + ": " + reason;
}

TELAR_DECL std::string ValidationResult::message() const {
  std::string out;
  for (auto const& is : issues)
    out += is.to_string() + "\n";
  if (suppressed > 0)
    out += "... and " + std::to_string(suppressed) + " more\n";
  return out;
}

} // namespace telar::schedule
