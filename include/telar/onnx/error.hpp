#pragma once
/*! \file
 *  \brief telar::onnx::OnnxError: a model file Telar cannot import or write. */
#include <telar/core/error.hpp>

#include <string>

namespace telar::onnx {

/*! \brief An ONNX file outside what Telar imports (operator, opset, data
 *  type, dynamic dimension, graph form) or that cannot be read or written;
 *  the message names the file, the node and its operator, and what is
 *  supported. */
class OnnxError : public Error {
public:
  /*! \brief \param what the message */
  explicit OnnxError(std::string const& what) : Error(what) {}
};

} // namespace telar::onnx
