# Functions the example checks (run_*.cmake) share; include() after setting
# PROGRAM (the example's name, for messages).

# Sets `out` to the Fashion-MNIST directory ($TELAR_FASHION_MNIST_DIR or
# Debian's), or ends the check as skipped (77) when it is not installed.
function(fashion_mnist_dir out)
  set(data /usr/share/datasets/fashion-mnist)
  if(DEFINED ENV{TELAR_FASHION_MNIST_DIR})
    set(data $ENV{TELAR_FASHION_MNIST_DIR})
  endif()
  if(NOT EXISTS ${data})
    message(STATUS "Fashion-MNIST not installed in ${data}: skipped")
    cmake_language(EXIT 77)
  endif()
  set(${out} ${data} PARENT_SCOPE)
endfunction()

# The number after "key": in a JSON summary line.
function(json_field json key out)
  string(REGEX MATCH "\"${key}\":([-0-9.eE+]+)" _ "${json}")
  set(${out} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

# Runs the command in ARGN; fails unless it exits 0 and prints a JSON summary,
# which it returns in `out`.
function(train out)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${PROGRAM} failed (${rc}):\n${o}\n${e}")
  endif()
  string(REGEX MATCH "{\"final_loss\"[^\n]*" json "${o}")
  if(NOT json)
    message(FATAL_ERROR "no JSON summary in:\n${o}\n${e}")
  endif()
  set(${out} "${json}" PARENT_SCOPE)
endfunction()

# Fails unless |a - b| / |a| <= tol, saying `what`.
function(require_close a b tol what)
  execute_process(COMMAND python3 -c
    "import sys; a,b,t=map(float,sys.argv[1:4]); sys.exit(0 if abs(a-b)<=t*abs(a) else 1)"
    ${a} ${b} ${tol} RESULT_VARIABLE close)
  if(NOT close EQUAL 0)
    message(FATAL_ERROR "${what}: ${b} differs from ${a} by more than ${tol} (relative)")
  endif()
  message(STATUS "${what}: ${a} and ${b}")
endfunction()
