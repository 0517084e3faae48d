# cmake -DTELAR_SOURCE_DIR=... -DWORK_DIR=... -DMODE=find_package|add_subdirectory
#       [-DARGS_FILE=consumer_args.cmake] -P consume.cmake
# ARGS_FILE sets CONSUMER_ARGS (-D settings for every configure: the build's
# compiler, Kokkos, MPI...) and EXPECT_<var> for Kokkos_DIR, MPI_CXX_COMPILER
# and MPI_CXX_LIB_NAMES: what the consumer's configuration must have used;
# EXPECT_TELAR_HAVE_HDF5: the build has parallel HDF5, so the consumer must
# write and read a checkpoint.
set(CONSUMER_ARGS)
if(ARGS_FILE)
  include(${ARGS_FILE})
endif()
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
endfunction()

if(MODE STREQUAL "find_package")
  # Configure Telar alone (no tests, examples, benchmarks), install it, then
  # build the consumer program against the installed package.
  run(${CMAKE_COMMAND} -S ${TELAR_SOURCE_DIR} -B ${WORK_DIR}/telar -G ${GENERATOR}
      -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix -DTELAR_ENABLE_TESTS=OFF
      -DTELAR_ENABLE_EXAMPLES=OFF -DTELAR_ENABLE_BENCHMARKS=OFF -DTELAR_ENABLE_DOCS=OFF
      ${CONSUMER_ARGS})
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/telar) # libtelar (TELAR_COMPILED_LIBRARY)
  run(${CMAKE_COMMAND} --install ${WORK_DIR}/telar)
  run(${CMAKE_COMMAND} -S ${TELAR_SOURCE_DIR}/tests/install/consumer -B ${WORK_DIR}/consumer
      -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release -DTelar_ROOT=${WORK_DIR}/prefix ${CONSUMER_ARGS})
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
  set(exe ${WORK_DIR}/consumer/telar_consumer)
  set(consumer ${WORK_DIR}/consumer)
else()
  run(${CMAKE_COMMAND} -S ${TELAR_SOURCE_DIR}/tests/install/add_subdirectory -B ${WORK_DIR}/build
      -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release -DTELAR_SOURCE_DIR=${TELAR_SOURCE_DIR}
      -DTELAR_COMPILED_LIBRARY=OFF -DTELAR_CONSUMER_HEADER_ONLY=ON ${CONSUMER_ARGS})
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
  set(exe ${WORK_DIR}/build/consumer/telar_consumer)
  set(consumer ${WORK_DIR}/build)
endif()

# The consumer found the same Kokkos and MPI as the build under test.
foreach(var Kokkos_DIR MPI_CXX_COMPILER MPI_CXX_LIB_NAMES)
  file(STRINGS ${consumer}/CMakeCache.txt line REGEX "^${var}:")
  string(REGEX REPLACE "^[^=]*=" "" got "${line}")
  string(REPLACE "\\;" ";" got "${got}")
  if(EXPECT_${var} AND NOT got STREQUAL EXPECT_${var})
    message(FATAL_ERROR "the consumer's ${var} is '${got}', the build's '${EXPECT_${var}}'")
  endif()
  message(STATUS "consumer ${var}: ${got}")
endforeach()

# The program runs: one training step, and a checkpoint round trip when the
# package has parallel HDF5 (its dependencies reach the consumer).
execute_process(COMMAND ${exe} WORKING_DIRECTORY ${consumer} RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "telar consumer: loss [0-9]")
  message(FATAL_ERROR "the consumer's build does not run as expected (${rc}): ${out}${err}")
endif()
if(EXPECT_TELAR_HAVE_HDF5 AND NOT out MATCHES "checkpoint step 1")
  message(FATAL_ERROR "the consumer did not write and read a checkpoint: ${out}${err}")
endif()
message(STATUS "${out}")
message(STATUS "Telar consumed via ${MODE}: OK")
