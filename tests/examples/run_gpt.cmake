# cmake -DEXE=gpt -DMPIEXEC=mpiexec -DCHECK=<train|strategies> -P run_gpt.cmake
# Quick checks of example 03 (the default run is far too slow for ctest).
set(data /usr/share/games/fortunes)
if(DEFINED ENV{TELAR_FORTUNES_DIR})
  set(data $ENV{TELAR_FORTUNES_DIR})
endif()
if(NOT EXISTS ${data})
  message(STATUS "fortunes not installed in ${data} (Debian package 'fortunes'): skipped")
  cmake_language(EXIT 77)
endif()

set(PROGRAM gpt)
include(${CMAKE_CURRENT_LIST_DIR}/example_checks.cmake)

# The memory plan is what the run measured (rank 0), to the byte.
function(check_memory j what)
  foreach(key activations workspace total)
    string(REGEX MATCH "\"memory\":{[^}]*\"${key}\":([0-9]+)" _ "${j}")
    set(got "${CMAKE_MATCH_1}")
    string(REGEX MATCH "\"memory_plan\":{[^}]*\"${key}\":([0-9]+)" _ "${j}")
    if(got STREQUAL "" OR NOT got EQUAL CMAKE_MATCH_1)
      message(FATAL_ERROR "${what}: ${key} measured ${got}, planned ${CMAKE_MATCH_1}:\n${j}")
    endif()
  endforeach()
endfunction()

if(CHECK STREQUAL "train")
  # 400 steps of 16 windows of 64 bytes (about 20 s): the validation loss
  # falls well below ln(256) = 5.55 (a uniform guess) and below 3.32, the
  # entropy of the fortunes' byte frequencies (what a model without context
  # can reach); it reaches about 2.6.
  train(json ${EXE} --steps 400 --layers 2 --hidden 64 --heads 4 --context 64 --batch 16
        --lr 3e-3 --eval-limit 128 --sample 40 --json --data ${data})
  json_field("${json}" val_loss loss)
  message(STATUS "validation loss ${loss}: ${json}")
  execute_process(COMMAND python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 2.8 else 1)" ${loss}
                  RESULT_VARIABLE ok)
  if(NOT ok EQUAL 0)
    message(FATAL_ERROR "gpt did not learn: validation loss ${loss}: ${json}")
  endif()
elseif(CHECK STREQUAL "strategies")
  # dp=2, pp=2 and tp=2 on 2 ranks train to the serial parameters (dropout on:
  # its masks are keyed by step and sample, the same in every layout).
  set(common --steps 4 --layers 2 --hidden 32 --heads 4 --context 16 --batch 8 --optimizer sgd
      --lr 0.05 --eval-limit 16 --sample 8 --json --data ${data})
  train(s ${EXE} ${common})
  json_field("${s}" param_l2 ls)
  json_field("${s}" final_loss fs)
  check_memory("${s}" serial)
  foreach(layout "--dp;2" "--pp;2;--dp;1" "--pp;2;--dp;1;--schedule;zb-h1" "--tp;2;--dp;1")
    train(p ${MPIEXEC} -np 2 ${EXE} ${common} ${layout})
    json_field("${p}" param_l2 lp)
    json_field("${p}" final_loss fp)
    check_memory("${p}" "${layout}")
    execute_process(COMMAND python3 -c "import sys; a,b,c,d=map(float,sys.argv[1:]); sys.exit(0 if abs(a-b)/a<=1e-5 and abs(c-d)/c<=1e-5 else 1)" ${ls} ${lp} ${fs} ${fp}
                    RESULT_VARIABLE close)
    if(NOT close EQUAL 0)
      message(FATAL_ERROR "${layout}: param_l2 ${lp}, final_loss ${fp} differ from serial ${ls}, ${fs} by more than 1e-5")
    endif()
    message(STATUS "${layout}: param_l2 ${lp} (serial ${ls}), final_loss ${fp} (serial ${fs})")
  endforeach()
else()
  message(FATAL_ERROR "unknown CHECK ${CHECK}")
endif()
