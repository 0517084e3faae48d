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

} // namespace telar
