# cmake -DTELAR_SOURCE_DIR=... -DWORK_DIR=... -DMODE=find_package|add_subdirectory -P consume.cmake
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
  # build the example against the installed package.
  run(${CMAKE_COMMAND} -S ${TELAR_SOURCE_DIR} -B ${WORK_DIR}/telar -G ${GENERATOR}
      -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix -DTELAR_ENABLE_TESTS=OFF
      -DTELAR_ENABLE_EXAMPLES=OFF -DTELAR_ENABLE_BENCHMARKS=OFF -DTELAR_ENABLE_DOCS=OFF)
  run(${CMAKE_COMMAND} --install ${WORK_DIR}/telar)
  run(${CMAKE_COMMAND} -S ${TELAR_SOURCE_DIR}/examples/01_fashion_mnist -B ${WORK_DIR}/example
      -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release -DTelar_ROOT=${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/example)
  set(exe ${WORK_DIR}/example/fashion_mnist)
else()
  run(${CMAKE_COMMAND} -S ${TELAR_SOURCE_DIR}/tests/install/add_subdirectory -B ${WORK_DIR}/build
      -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release -DTELAR_SOURCE_DIR=${TELAR_SOURCE_DIR})
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
  set(exe ${WORK_DIR}/build/fashion_mnist)
endif()

# The program runs: its usage error names the flag.
execute_process(COMMAND ${exe} --no-such-flag RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT err MATCHES "unknown flag --no-such-flag")
  message(FATAL_ERROR "the consumer's build does not run as expected: ${err}")
endif()
message(STATUS "Telar consumed via ${MODE}: OK")
