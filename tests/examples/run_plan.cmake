# cmake -DEXE=<example> -DMPIEXEC=mpiexec -DNP=2 -DWORK_DIR=<dir> -DBUDGET=3MiB
#       [-DARGS="--hidden 64"] -DCHECK=dry_run|auto -P run_plan.cmake
#
# dry_run: --dry-run --json under a budget that refuses some layouts: the
# planner's JSON has fitting layouts, each with a predicted time and memory,
# the fastest first saying why, and refused ones saying why; nothing trains
# (runs without the data set). The profile starts from the built-in
# defaults, calibrated at the model's sizes and cached in WORK_DIR, so the
# auto run below plans with the same times as the dry run.
# auto: --layout auto --json trains a few steps with the layout the planner
# chose: the JSON summary has predicted_step_ms and the planner's reason
# beside the measured median, and the layout is the dry run's first; then
# --layout auto --precision bf16 trains 3 steps of the bf16 model's plan.
# No time is asserted. TELAR_CPU_SHARE=1 stands in for the scheduler
# measurement each run makes (docs/planner.md): the two runs would else plan
# with the load of their own moment and might rank two layouts apart.
set(ENV{TELAR_CPU_SHARE} 1)
set(budget_args --memory-budget ${BUDGET})
get_filename_component(program ${EXE} NAME)
set(profile ${WORK_DIR}/plan_profile_${program}_${NP}_${CHECK}.json)
file(REMOVE ${profile})
separate_arguments(args UNIX_COMMAND "${ARGS}")
set(common --json --profile ${profile} ${args})

function(run_example out_json out_err)
  execute_process(COMMAND ${MPIEXEC} -np ${NP} ${EXE} ${common} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  if(rc EQUAL 77 OR e MATCHES "not installed in|cannot open|No such file")
    message(STATUS "data not installed: skipped\n${e}")
    cmake_language(EXIT 77)
  endif()
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${EXE} ${ARGN} failed (${rc}):\n${o}\n${e}")
  endif()
  string(REGEX MATCH "{\"[a-z_]+\"[^\n]*" json "${o}")
  set(${out_json} "${json}" PARENT_SCOPE)
  set(${out_err} "${e}" PARENT_SCOPE)
endfunction()

run_example(plan err --dry-run ${budget_args})
foreach(key ranked refused)
  string(JSON n LENGTH "${plan}" ${key})
  if(n LESS 1)
    message(FATAL_ERROR "no ${key} layouts in:\n${plan}\n${err}")
  endif()
endforeach()
string(JSON first GET "${plan}" ranked 0)
foreach(key dp pp tp zero microbatches schedule)
  string(JSON v GET "${first}" ${key})
endforeach()
string(JSON ms GET "${first}" predicted_step_ms)
string(JSON bytes GET "${first}" memory_bytes)
string(JSON why GET "${first}" reason)
string(JSON refused GET "${plan}" refused 0 reason)
if(NOT ms GREATER 0 OR NOT bytes GREATER 0)
  message(FATAL_ERROR "the best layout has no predicted time or memory:\n${first}")
endif()
if(NOT why MATCHES "^(fastest of|plain data parallelism)" OR NOT err MATCHES "refused: " OR refused STREQUAL ""
   OR NOT EXISTS ${profile})
  message(FATAL_ERROR "the best layout does not say why, or none refused:\n${plan}\n${err}")
endif()
if(plan MATCHES "final_loss" OR err MATCHES "final: ")
  message(FATAL_ERROR "--dry-run trained:\n${plan}\n${err}")
endif()
if(NOT CHECK STREQUAL "auto")
  return()
endif()

# The chosen layout is the dry run's first; the summary says why and what
# was predicted, beside what was measured.
run_example(run err --layout auto ${budget_args} --limit-steps 6)
foreach(key dp pp tp microbatches)
  string(JSON want GET "${first}" ${key})
  string(JSON got GET "${run}" config ${key})
  if(NOT want EQUAL got)
    message(FATAL_ERROR "--layout auto ran ${key}=${got}, the plan's first has ${want}:\n"
                        "${first}\n${run}\n${err}")
  endif()
endforeach()
string(JSON predicted GET "${run}" predicted_step_ms)
string(JSON measured GET "${run}" step_ms_median)
string(JSON reason GET "${run}" layout_reason)
if(NOT predicted GREATER 0 OR NOT measured GREATER 0 OR NOT reason MATCHES "^(fastest of|plain data parallelism)"
   OR NOT err MATCHES "layout auto: chose .*step time: predicted [0-9.]+ ms, measured")
  message(FATAL_ERROR "no prediction or reason in the summary:\n${run}\n${err}")
endif()

# --precision bf16 is planned too (examples 01-03): the planner's layout of
# the bf16 model (no ZeRO, no recomputation: bf16's one strategy set) trains
# in bf16, and the profile gains the bf16 times it was planned with.
run_example(run err --layout auto ${budget_args} --precision bf16 --limit-steps 3)
string(JSON precision GET "${run}" config precision)
string(JSON zero GET "${run}" config zero)
string(JSON recompute GET "${run}" config recompute)
string(JSON reason GET "${run}" layout_reason)
file(READ ${profile} timings)
if(NOT precision STREQUAL "bf16" OR NOT zero EQUAL 0 OR NOT recompute STREQUAL "none"
   OR NOT reason MATCHES "^(fastest of|plain data parallelism)"
   OR NOT err MATCHES "layout auto: chose .*precision bf16" OR NOT timings MATCHES " bf16 ")
  message(FATAL_ERROR "--precision bf16 was not planned:\n${run}\n${err}")
endif()
