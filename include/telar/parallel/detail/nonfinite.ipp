// What telar/parallel/detail/nonfinite.hpp declares with TELAR_DECL: inline in the header-only
// build, compiled once into libtelar otherwise (core/detail/decl.hpp).
#pragma once
#include <telar/parallel/detail/nonfinite.hpp>

namespace telar::detail {

TELAR_DECL std::string loss_text(double loss) {
  if (std::isnan(loss))
    return "nan";
  std::ostringstream os;
  os << loss;
  return os.str();
}

TELAR_DECL std::string nonfinite_message(long long step, double loss,
                                         std::vector<std::string> const& names,
                                         std::vector<double> const& counts,
                                         NonFiniteSource const& source) {
  std::ostringstream os;
  os << source.who << ": step " << step << ": ";
  std::size_t first = 0;
  while (first < counts.size() && !(counts[first] > 0))
    ++first;
  if (first < counts.size()) {
    double total = 0;
    for (double c : counts)
      total += c;
    os << "the gradient of " << names[first] << " has " << (long long)(counts[first] + 0.5)
       << " values that are NaN or infinite (the first such tensor in model order; "
       << (long long)(total + 0.5) << " in all";
    if (source.has_loss)
      os << ", the loss is " << loss_text(loss);
    os << ")";
  } else {
    os << "the loss is " << loss_text(loss) << " (every gradient is finite)";
  }
  os << "; lower the learning rate, check the inputs, or set " << source.setting
     << " = telar::NonFinite::skip to skip such steps";
  return os.str();
}

} // namespace telar::detail
