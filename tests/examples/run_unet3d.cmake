# cmake -DEXE=unet3d -DMPIEXEC=mpiexec -DWORK_DIR=dir -P run_unet3d.cmake
# Example 07 on a tiny U-Net (16^3 volumes, depth 1, width 4), with GroupNorm
# and with BatchNorm: three SGD steps with each volume split over sp = 2
# ranks end with the parameters of the unsplit run (float, within 1e-5),
# and so does the loss.
set(PROGRAM unet3d)
include(${CMAKE_CURRENT_LIST_DIR}/example_checks.cmake)
set(file ${WORK_DIR}/unet3d_check.h5)
set(params ${WORK_DIR}/unet3d_check_sp1.txt)
set(common --size 16 --depth 1 --width 4 --epochs 1 --limit-steps 3 --batch 2 --val 2
    --optimizer sgd --lr 0.05 --json)
foreach(norm group batch)
  file(REMOVE ${params})
  train(a ${EXE} ${common} --norm ${norm} --generate 8 --data ${file} --save-params ${params})
  train(b ${MPIEXEC} -np 2 ${EXE} ${common} --norm ${norm} --data ${file} --sp 2
        --compare-params ${params})
  json_field("${a}" final_loss la)
  json_field("${b}" final_loss lb)
  json_field("${b}" param_max_diff diff)
  json_field("${b}" steps steps)
  if(NOT steps EQUAL 3)
    message(FATAL_ERROR "expected 3 steps at sp = 2 (${norm}): ${b}")
  endif()
  message(STATUS "${norm}: sp = 2 vs sp = 1: largest parameter difference ${diff}")
  execute_process(COMMAND python3 -c "import sys; sys.exit(0 if 0 <= float(sys.argv[1]) < 1e-5 else 1)"
                  ${diff} RESULT_VARIABLE ok)
  if(NOT ok EQUAL 0)
    message(FATAL_ERROR "${norm}: sp = 2 parameters differ from sp = 1 by ${diff}: ${b}")
  endif()
  require_close(${la} ${lb} 1e-5 "${norm}: last-step loss sp = 1 vs sp = 2")
endforeach()
