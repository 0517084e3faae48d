#pragma once
/*! \file
 *  \brief telar::CheckpointError: a checkpoint that cannot be written, found,
 *  read or trusted. */
#include <telar/core/error.hpp>

#include <string>

namespace telar {

/*! \brief A checkpoint that cannot be written, found, read or trusted
 *  (missing, truncated, corrupted, or made for another model or optimizer).
 *  The message names the file and, where one is at fault, the tensor and the
 *  shapes; every rank throws the same message. */
class CheckpointError : public Error {
public:
  /*! \brief \param what the message */
  explicit CheckpointError(std::string const& what) : Error(what) {}
};

} // namespace telar
