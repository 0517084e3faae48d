#pragma once
/*! \file
 *  \brief Exceptions raised by Telar's communication layer.
 */

#include <telar/core/error.hpp>

#include <string>
#include <utility>

namespace telar {

/*! \brief An MPI call made by Telar failed, or an argument to a communication
 *         call was invalid.
 *
 *  The message names the rank (within the communicator used), the MPI
 *  operation, the peer where one is involved and MPI's own error string, e.g.
 *  `MPI_Recv from rank 1 (tag 7) failed on rank 0 of 2 (communicator 'world'):
 *  MPI_ERR_TRUNCATE: message truncated`. The fields are also available
 *  separately so callers can react without parsing text. A telar::Error
 *  (and so a std::runtime_error), like every exception Telar throws.
 */
class CommError : public Error {
public:
  /*! \brief Builds the error from its full message and its parts.
   *  \param message   full text returned by what()
   *  \param rank      rank of the calling process in the communicator used (-1 if unknown)
   *  \param operation MPI or Telar operation, e.g. "MPI_Allreduce"
   *  \param peer      peer rank where relevant, else -1
   *  \param mpi_error MPI error code, or 0 (MPI_SUCCESS) when the error is Telar's own
   */
  CommError(std::string const& message, int rank, std::string operation, int peer = -1,
            int mpi_error = 0)
      : Error(message), rank_(rank), operation_(std::move(operation)), peer_(peer),
        mpi_error_(mpi_error) {}

  /*! \brief Rank of the calling process in the communicator that failed (-1 if unknown). */
  int rank() const noexcept { return rank_; }
  /*! \brief The operation that failed, e.g. "MPI_Allreduce" or "telar::RingAllreduce". */
  std::string const& operation() const noexcept { return operation_; }
  /*! \brief Peer rank involved, or -1 for collectives. */
  int peer() const noexcept { return peer_; }
  /*! \brief MPI error code, 0 (MPI_SUCCESS) for errors detected by Telar itself. */
  int mpi_error() const noexcept { return mpi_error_; }

private:
  int rank_;
  std::string operation_;
  int peer_;
  int mpi_error_;
};

/*! \brief A bounded wait expired: the operation did not complete within the
 *         communicator's timeout (see telar::BasicCommunicator::set_timeout and
 *         the environment variable `TELAR_COMM_TIMEOUT`).
 *
 *  The message says which rank waited on which operation, with which peer and
 *  tag, for how long. The operation is still pending when this is thrown;
 *  the usual reaction is telar::abort_on_error, which ends the whole job.
 */
class CommTimeout : public CommError {
public:
  /*! \brief Builds the error.
   *  \param message   full text returned by what()
   *  \param rank      rank of the waiting process
   *  \param operation operation waited on
   *  \param peer      peer rank waited on, or -1
   *  \param seconds   how long the process waited
   */
  CommTimeout(std::string const& message, int rank, std::string operation, int peer, double seconds)
      : CommError(message, rank, std::move(operation), peer, 0), seconds_(seconds) {}

  /*! \brief How long the process waited before giving up, in seconds. */
  double seconds() const noexcept { return seconds_; }

private:
  double seconds_;
};

/*! \brief A peer this rank was waiting for has died (its process is gone):
 *         found by asking the operating system about the peers on this
 *         host while a wait lasts; or a peer on another host has sent no
 *         heartbeat for `TELAR_HEARTBEAT_TIMEOUT` seconds (died, stopped, or
 *         its link is down).
 *
 *  The message names the lost rank (in the communicator waited on), its pid
 *  and host (for a silent host: every silent rank there), and the operation
 *  this rank was waiting in.
 *  The usual reaction is telar::abort_on_error, which ends the whole job.
 */
class PeerLost : public CommError {
public:
  /*! \brief Builds the error.
   *  \param message   full text returned by what()
   *  \param rank      rank of the waiting process in the communicator
   *  \param operation operation waited in
   *  \param peer      the lost rank in the communicator
   */
  PeerLost(std::string const& message, int rank, std::string operation, int peer)
      : CommError(message, rank, std::move(operation), peer, 0) {}
};

/*! \brief A telar::ProcessGrid shape does not fit the communicator.
 *
 *  Computed from deterministic data only (the shape and the world size), so
 *  every rank throws the same error with the same message, without
 *  communicating. A telar::Error.
 */
class GridError : public Error {
public:
  /*! \brief Builds the error from its message.
   *  \param message full text returned by what()
   */
  explicit GridError(std::string const& message) : Error(message) {}
};

} // namespace telar
