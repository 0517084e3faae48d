# Phase 1 must die (a rank is killed mid-write); phase 2 must pass.
set(ENV{TELAR_TEST_KILL_DIR} ${DIR})
file(REMOVE_RECURSE ${DIR})
execute_process(COMMAND ${MPIEXEC} ${NPFLAG} ${NP} ${EXE} "[.kill_write]"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 120)
if(rc EQUAL 0)
  message(FATAL_ERROR "the write phase survived:\n${out}")
endif()
execute_process(COMMAND ${MPIEXEC} ${NPFLAG} ${NP} ${EXE} "[.kill_check]"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the check phase failed (${rc}):\n${out}")
endif()
file(REMOVE_RECURSE ${DIR})
