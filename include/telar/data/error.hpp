#pragma once
/*! \file
 *  \brief The exception every failure of Telar's data room throws. */

#include <telar/core/error.hpp>

#include <string>

namespace telar {

/*! \brief A data set could not be read or is not what it claims to be.
 *
 *  Thrown by the IDX reader and the data set loaders. The message names the
 *  API, the file path and what is wrong, for example
 *  `telar::read_idx: /data/train-images-idx3-ubyte.gz: truncated: ...`, so it
 *  can be shown to the user as it is. Misuse of an API (a rank out of range,
 *  a zero batch size) throws `std::invalid_argument` instead. A telar::Error. */
class DataError : public Error {
public:
  /*! \brief Makes the error.
   *  \param message the full message, as returned by `what()` */
  explicit DataError(std::string const& message) : Error(message) {}
};

} // namespace telar
