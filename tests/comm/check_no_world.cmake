# Fails if any header under DIR names MPI_COMM_WORLD: the library only talks on
# the duplicates it owns (tests may use it to build a Communicator).
file(GLOB_RECURSE headers ${DIR}/*.hpp)
foreach(h IN LISTS headers)
  # The whole word: Open MPI's OMPI_COMM_WORLD_RANK (an environment variable
  # that topology.hpp reads) is not the communicator.
  file(STRINGS ${h} hits REGEX "(^|[^A-Za-z0-9_])MPI_COMM_WORLD([^A-Za-z0-9_]|$)")
  if(hits)
    message(FATAL_ERROR "${h} names MPI_COMM_WORLD: ${hits}")
  endif()
endforeach()
list(LENGTH headers n)
message(STATUS "${n} headers checked, none names MPI_COMM_WORLD")
