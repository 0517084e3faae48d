#pragma once
/*! \file
 *  \brief Exception types Telar raises on bad input. */
#include <stdexcept>
#include <string>

namespace telar {

/*! \brief Base of every exception Telar throws. */
class Error : public std::runtime_error {
public:
  /*! \brief \param what the message, starting with the API that raised it */
  explicit Error(std::string const& what) : std::runtime_error(what) {}
};

/*! \brief Shapes that do not fit: the message names the layer and the shapes. */
class ShapeError : public Error {
public:
  /*! \brief \param what the message */
  explicit ShapeError(std::string const& what) : Error(what) {}
};

/*! \brief A training step met a loss or gradient that is not finite (NaN or
 *  infinity): the message names the step and the first tensor, in model
 *  order, whose gradient is not finite. Every rank throws the same one. */
class NonFiniteError : public Error {
public:
  /*! \brief \param what the message */
  explicit NonFiniteError(std::string const& what) : Error(what) {}
};

} // namespace telar
