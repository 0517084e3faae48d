#pragma once
/*! \file
 *  \brief telar::HyperParams and telar::SearchSpace: the configurations a
 *  hyper-parameter search tries (telar/train/hpsearch.hpp). */
#include <telar/core/error.hpp>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace telar {

/*! \brief One configuration: named hyper-parameters, kept as the text the user
 *  gave ("1e-3" stays "1e-3" in tables and JSON), in insertion order.
 *  \code
 *  telar::HyperParams p;
 *  p.set("lr", "1e-3").set("optimizer", "adamw");
 *  double lr = p.real("lr");            // 0.001
 *  std::string opt = p.get("optimizer");
 *  \endcode */
class HyperParams {
public:
  /*! \brief Sets (or replaces) a parameter. \param name its name \param value its text */
  HyperParams& set(std::string const& name, std::string const& value) {
    for (auto& [n, v] : items_)
      if (n == name) {
        v = value;
        return *this;
      }
    items_.emplace_back(name, value);
    return *this;
  }
  /*! \brief Whether the parameter is set. \param name its name */
  bool has(std::string const& name) const { return find(name) != nullptr; }
  /*! \brief The parameter's text. \param name its name
   *  \throws Error naming the parameter and this configuration when absent */
  std::string const& get(std::string const& name) const {
    if (auto const* v = find(name))
      return *v;
    throw Error("telar::HyperParams: no parameter '" + name + "' in {" + str() + "}");
  }
  /*! \brief The parameter as a real number. \param name its name
   *  \throws Error when absent or not a number */
  double real(std::string const& name) const {
    std::string const& v = get(name);
    char* end = nullptr;
    errno = 0;
    double const x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != 0 || errno == ERANGE)
      throw Error("telar::HyperParams: " + name + "=" + v + " is not a number");
    return x;
  }
  /*! \brief The parameter as an integer. \param name its name
   *  \throws Error when absent or not an integer */
  long long integer(std::string const& name) const {
    std::string const& v = get(name);
    char* end = nullptr;
    errno = 0;
    long long const x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != 0 || errno == ERANGE)
      throw Error("telar::HyperParams: " + name + "=" + v + " is not an integer");
    return x;
  }
  /*! \brief (name, value) pairs in insertion order. */
  std::vector<std::pair<std::string, std::string>> const& items() const { return items_; }
  /*! \brief e.g. "lr=1e-3 optimizer=adamw". */
  std::string str() const {
    std::string out;
    for (auto const& [n, v] : items_)
      out += (out.empty() ? "" : " ") + n + "=" + v;
    return out;
  }

private:
  std::string const* find(std::string const& name) const {
    for (auto const& [n, v] : items_)
      if (n == name)
        return &v;
    return nullptr;
  }
  std::vector<std::pair<std::string, std::string>> items_;
};

/*! \brief A grid of configurations: the product of named lists of values.
 *  \code
 *  telar::SearchSpace space;
 *  space.add("lr", {"1e-3", "1e-2"}).add("optimizer", {"sgd", "adamw"});
 *  std::vector<telar::HyperParams> configs = space.grid(); // 4, the last axis fastest
 *  \endcode */
class SearchSpace {
public:
  /*! \brief Adds an axis. \param name the hyper-parameter \param values its
   *  values (at least one) \throws Error when empty or already added */
  SearchSpace& add(std::string const& name, std::vector<std::string> values) {
    if (values.empty())
      throw Error("telar::SearchSpace: '" + name + "' has no values");
    for (auto const& axis : axes_)
      if (axis.first == name)
        throw Error("telar::SearchSpace: '" + name + "' is added twice");
    axes_.emplace_back(name, std::move(values));
    return *this;
  }
  /*! \brief Number of configurations in the grid. */
  std::size_t size() const {
    std::size_t n = 1;
    for (auto const& axis : axes_)
      n *= axis.second.size();
    return axes_.empty() ? 0 : n;
  }
  /*! \brief Every configuration, the first axis slowest (id = position). */
  std::vector<HyperParams> grid() const {
    std::vector<HyperParams> out(size());
    for (std::size_t i = 0; i < out.size(); ++i) {
      std::size_t rest = i, stride = out.size();
      for (auto const& [name, values] : axes_) {
        stride /= values.size();
        out[i].set(name, values[rest / stride]);
        rest %= stride;
      }
    }
    return out;
  }

private:
  std::vector<std::pair<std::string, std::vector<std::string>>> axes_;
};

} // namespace telar
