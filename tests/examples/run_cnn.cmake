# cmake -DEXE=cnn -DMPIEXEC=mpiexec -DCHECK=<train|dp> -P run_cnn.cmake
# Quick checks of example 02 (the full 5-epoch run is too slow for ctest).

set(PROGRAM cnn)
include(${CMAKE_CURRENT_LIST_DIR}/example_checks.cmake)
fashion_mnist_dir(data)

if(CHECK STREQUAL "train")
  # 200 steps of 32: the mean training loss falls well below ln(10) = 2.30 and
  # the accuracy on 2000 test images is far above chance (10%).
  train(json ${EXE} --epochs 1 --batch 32 --limit-steps 200 --eval-limit 2000 --json
        --data ${data})
  json_field("${json}" test_accuracy acc)
  json_field("${json}" final_loss loss)
  message(STATUS "mean loss ${loss}, test accuracy ${acc}")
  execute_process(COMMAND python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 1.6 and float(sys.argv[2]) > 0.6 else 1)" ${loss} ${acc}
                  RESULT_VARIABLE ok)
  if(NOT ok EQUAL 0)
    message(FATAL_ERROR "cnn did not learn: mean loss ${loss}, accuracy ${acc}: ${json}")
  endif()
  # tools/kernel_times.cpp sees the step, Telar's kernels and, in regions,
  # the convolutions oneDNN runs.
  if(TIMES_LIB)
    set(times ${CMAKE_CURRENT_BINARY_DIR}/cnn_kernel_times.txt)
    file(REMOVE ${times})
    execute_process(COMMAND ${CMAKE_COMMAND} -E env KOKKOS_PROFILE_LIBRARY=${TIMES_LIB}
                            TELAR_KERNEL_TIMES=${times} ${EXE} --epochs 1 --batch 32
                            --limit-steps 3 --eval-limit 64 --json --data ${data}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
    set(want "telar::Trainer::step" "telar::activation" "telar::MaxPool")
    if(o MATCHES "\"conv\":\"onednn\"")
      list(APPEND want "telar::conv::onednn::forward" "telar::conv::onednn::backward_weights")
    endif()
    set(got "")
    if(EXISTS ${times})
      file(READ ${times} got)
    endif()
    foreach(w IN LISTS want)
      string(FIND "${got}" "${w}" at)
      if(NOT rc EQUAL 0 OR at EQUAL -1)
        message(FATAL_ERROR "kernel times (exit ${rc}) lack '${w}':\n${got}\n${e}")
      endif()
    endforeach()
    message(STATUS "kernel times: ${want} timed")
  endif()
elseif(CHECK STREQUAL "dp")
  set(common --epochs 1 --limit-steps 10 --batch 32 --lr 0.01 --optimizer sgd --eval-limit 200
      --json --data ${data})
  train(s ${EXE} ${common})
  train(d ${MPIEXEC} -np 2 ${EXE} ${common} --dp 2)
  json_field("${s}" param_l2 ls)
  json_field("${d}" param_l2 ld)
  execute_process(COMMAND python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b)/a<=1e-5 else 1)" ${ls} ${ld}
                  RESULT_VARIABLE close)
  if(NOT close EQUAL 0)
    message(FATAL_ERROR "dp=2 param_l2 ${ld} differs from serial ${ls} by more than 1e-5")
  endif()
  message(STATUS "param_l2 serial ${ls}, dp=2 ${ld}")
  # --precision bf16 (AdamW): dp=2 against serial within the bf16 bound of
  # docs/precision.md, and oneDNN's bf16 kernels ran (where the CPU has them).
  file(READ /proc/cpuinfo cpu)
  if(cpu MATCHES "avx512_bf16|amx_bf16")
    set(bf16 --epochs 1 --limit-steps 6 --batch 32 --optimizer adamw --eval-limit 64 --json
        --precision bf16 --data ${data})
    train(bs ${EXE} ${bf16})
    # The step prediction calibrates the model the run trains (issue 23):
    # every convolution oneDNN runs, the calibration's after training
    # included, is a bf16 one (the fp32 model's calibration ran 144 fp32).
    execute_process(COMMAND ${CMAKE_COMMAND} -E env ONEDNN_VERBOSE=1 ${EXE} ${bf16}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
    string(REGEX MATCHALL "onednn_verbose,exec,cpu,convolution,[^\n]*" convs "${o}\n${e}")
    set(fp32_convs ${convs})
    list(FILTER fp32_convs EXCLUDE REGEX "_bf16::")
    list(LENGTH convs n)
    list(LENGTH fp32_convs n32)
    if(NOT rc EQUAL 0 OR n LESS 48 OR n32 GREATER 0)
      message(FATAL_ERROR "bf16 run (exit ${rc}): ${n32} of ${n} convolutions not bf16 "
                          "(the prediction calibrated another model than the trained one?)")
    endif()
    message(STATUS "bf16 run: ${n} convolutions, all bf16")
    # --bf16-weight-copy 0: the weights converted in every product instead of
    # once a step: the same parameters bit for bit, without the copy's 2
    # bytes per parameter (measured and planned alike).
    train(bn ${EXE} ${bf16} --bf16-weight-copy 0)
    foreach(run bs bn)
      json_field("${${run}}" param_l2 l_${run})
      string(REGEX MATCH "\"memory\":{\"parameters\":([0-9]+)" _ "${${run}}")
      set(p_${run} "${CMAKE_MATCH_1}")
      string(REGEX MATCH "\"memory_plan\":{\"parameters\":([0-9]+)" _ "${${run}}")
      if(p_${run} STREQUAL "" OR NOT p_${run} EQUAL CMAKE_MATCH_1)
        message(FATAL_ERROR "${run}: parameters measured ${p_${run}}, planned ${CMAKE_MATCH_1}")
      endif()
    endforeach()
    if(NOT l_bs STREQUAL l_bn OR NOT p_bn LESS p_bs)
      message(FATAL_ERROR "--bf16-weight-copy 0: param_l2 ${l_bn} (with the copy ${l_bs}), "
                          "parameters ${p_bn} bytes (with the copy ${p_bs})")
    endif()
    message(STATUS "bf16 without the weight copy: param_l2 ${l_bn}, parameters ${p_bn} against ${p_bs} bytes")
    train(bd ${MPIEXEC} -np 2 ${EXE} ${bf16} --dp 2)
    json_field("${bs}" param_l2 lbs)
    json_field("${bd}" param_l2 lbd)
    require_close(${lbs} ${lbd} 7.9e-3 "bf16 param_l2, serial and dp=2")
    if(NOT bd MATCHES "\"gemm_kernels\":\"[^\"]*(bf16|amx)")
      message(FATAL_ERROR "no bf16 kernel in the dp=2 summary: ${bd}")
    endif()
    if(NOT bd MATCHES "\"host_loops\":\"(avx512|baseline)\"")
      message(FATAL_ERROR "the dp=2 summary does not say which host loops ran: ${bd}")
    endif()
  endif()
else()
  message(FATAL_ERROR "unknown CHECK ${CHECK}")
endif()
