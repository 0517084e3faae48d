# cmake -DEXE=unet3d -DMPIEXEC=mpiexec -DWORK_DIR=dir [-DCHECK=budget|bf16|auto] -P run_unet3d.cmake
# Example 07 on a tiny U-Net (16^3 volumes, depth 1, width 4, GroupNorm;
# BatchNorm on slabs is checked in tests/parallel/test_spatial.cpp): three SGD steps with each volume split over sp = 2
# ranks end with the parameters of the unsplit run (float, within 1e-5),
# and so does the loss. With GroupNorm (per-sample statistics) dp = 2 with
# one volume per rank also equals the serial run's batches of two, with
# and without ZeRO-1 and ZeRO-2 over dp.
set(PROGRAM unet3d)
include(${CMAKE_CURRENT_LIST_DIR}/example_checks.cmake)

# CHECK=budget: a 32^3 volume that a --memory-budget refuses at sp = 1 (the
# message names the activations and --sp 4) trains one step at sp = 4 under
# the same budget, and its measured peak stays under it.
if(CHECK STREQUAL "budget")
  set(budget 8MiB)
  set(tiny --size 32 --depth 1 --width 4 --batch 1 --val 1 --epochs 1 --limit-steps 1
      --optimizer sgd --json --memory-budget ${budget})
  execute_process(COMMAND ${EXE} ${tiny} --generate 2 --data ${WORK_DIR}/unet3d_budget.h5
                  RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  if(rc EQUAL 0 OR NOT e MATCHES "over the --memory-budget of 8 MiB at sp=1"
     OR NOT e MATCHES "activations [0-9.]+ MiB" OR NOT e MATCHES "--sp 4 \\(4 ranks\\) needs")
    message(FATAL_ERROR "sp = 1 was not refused as expected (${rc}):\n${o}\n${e}")
  endif()
  message(STATUS "sp = 1 refused: ${e}")
  train(r ${MPIEXEC} -np 4 ${EXE} ${tiny} --data ${WORK_DIR}/unet3d_budget.h5 --sp 4)
  json_field("${r}" peak_bytes_per_rank peak)
  json_field("${r}" training_bytes_plan_rank0 plan)
  message(STATUS "sp = 4 trains: peak ${peak} B per rank, plan ${plan} B (rank 0)")
  if(peak GREATER 8388608)
    message(FATAL_ERROR "sp = 4 peaked at ${peak} B, over the 8 MiB budget: ${r}")
  endif()
  return()
endif()
# CHECK=bf16: --precision bf16 (oneDNN's bf16 convolutions, fp32 masters) at
# width 16, where oneDNN converts into blocked layouts: the bf16 kernels ran,
# sp = 2 (with overlap) ends within 1e-5 of the unsplit bf16 run's
# parameters (the same bf16 products, fp32 sums split apart; measured
# 2e-8), and fp32 ends near bf16 but not on it (bf16's rounding: measured
# 6.5e-5 after 3 steps).
if(CHECK STREQUAL "bf16")
  set(data ${WORK_DIR}/unet3d_bf16.h5)
  set(params ${WORK_DIR}/unet3d_bf16.txt)
  file(REMOVE ${params})
  set(args --size 16 --depth 1 --width 16 --epochs 1 --limit-steps 3 --batch 2 --val 2
      --optimizer sgd --lr 0.05 --json)
  execute_process(COMMAND ${EXE} ${args} --generate 8 --data ${data} --precision bf16
                  --save-params ${params} RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  if(NOT rc EQUAL 0 AND e MATCHES "lacks the AVX512-BF16")
    message(STATUS "no bf16 instructions: skipped\n${e}")
    cmake_language(EXIT 77)
  endif()
  string(REGEX MATCH "{\"final_loss\"[^\n]*" s "${o}")
  if(NOT rc EQUAL 0 OR NOT s)
    message(FATAL_ERROR "unet3d --precision bf16 failed (${rc}):\n${o}\n${e}")
  endif()
  string(JSON conv GET "${s}" conv)
  string(JSON kernels GET "${s}" gemm_kernels)
  string(JSON precision GET "${s}" precision)
  if(NOT precision STREQUAL "bf16" OR NOT conv STREQUAL "onednn-bf16"
     OR NOT kernels MATCHES "conv_fwd:[^,]*bf16" OR NOT kernels MATCHES "conv_bwd_weights:[^,]*bf16")
    message(FATAL_ERROR "--precision bf16 did not run bf16 convolutions: ${s}")
  endif()
  message(STATUS "bf16 kernels: ${kernels}")
  train(p ${MPIEXEC} -np 2 ${EXE} ${args} --data ${data} --sp 2 --precision bf16
        --compare-params ${params})
  json_field("${p}" param_max_diff dp)
  json_field("${s}" final_loss ls)
  json_field("${p}" final_loss lp)
  require_close(${ls} ${lp} 1e-5 "bf16, sp = 2 vs serial: last-step loss")
  train(f ${EXE} ${args} --data ${data} --compare-params ${params})
  json_field("${f}" param_max_diff df)
  string(JSON fconv GET "${f}" conv)
  message(STATUS "bf16 sp = 2 vs serial: ${dp}; fp32 (${fconv}) vs bf16: ${df}")
  execute_process(COMMAND python3 -c
    "import sys; p,f=map(float,sys.argv[1:3]); sys.exit(0 if 0 <= p < 1e-5 and 0 < f < 1e-3 else 1)"
    ${dp} ${df} RESULT_VARIABLE ok)
  if(NOT ok EQUAL 0 OR fconv STREQUAL "onednn-bf16")
    message(FATAL_ERROR "bf16: sp = 2 differs from serial by ${dp} (bound 1e-5), fp32 from bf16 by ${df} (expected in (0, 1e-3)):\n${p}\n${f}")
  endif()
  return()
endif()
# CHECK=auto: --dry-run --json at 2 ranks ranks dp = 2 and sp = 2 under
# every ZeRO stage (over both ranks; each with a predicted step, its parts
# and its memory, ZeRO-1's less than no sharding's, the first saying why),
# trains nothing and caches the calibration in the --profile file; --layout
# auto then trains the first of them and reports predicted beside measured;
# with a global batch of one, dp = 2 is refused (it does not divide) and
# sp = 2 trains (under the stage ranked first). No time is asserted.
if(CHECK STREQUAL "auto")
  set(ENV{TELAR_CPU_SHARE} 1) # both runs plan with the same share (run_plan.cmake)
  set(data ${WORK_DIR}/unet3d_auto.h5)
  set(profile ${WORK_DIR}/unet3d_auto_profile.json)
  file(REMOVE ${profile})
  set(args --size 16 --depth 1 --width 4 --epochs 1 --limit-steps 2 --val 2 --optimizer sgd
      --json --profile ${profile})
  execute_process(COMMAND ${MPIEXEC} -np 2 ${EXE} ${args} --generate 8 --data ${data} --dry-run
                  RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  string(REGEX MATCH "{\"program\"[^\n]*" plan "${o}")
  if(NOT rc EQUAL 0 OR NOT plan OR o MATCHES "final_loss" OR NOT EXISTS ${profile})
    message(FATAL_ERROR "--dry-run failed, trained, or cached no calibration (${rc}):\n${o}\n${e}")
  endif()
  string(JSON n LENGTH "${plan}" layouts)
  string(JSON first GET "${plan}" layouts 0)
  string(JSON why GET "${first}" reason)
  if(NOT n EQUAL 8 OR NOT why MATCHES "^(the fastest|plain data parallelism)")
    message(FATAL_ERROR "expected dp = 2 and sp = 2 under ZeRO stages 0 to 3, the first saying "
                        "why:\n${plan}")
  endif()
  set(stages1 "")
  set(stages2 "")
  foreach(k RANGE 7)
    string(JSON l GET "${plan}" layouts ${k})
    string(JSON fits GET "${l}" fits)
    string(JSON ms GET "${l}" predicted_step_ms)
    string(JSON bytes GET "${l}" memory_bytes)
    string(JSON sp GET "${l}" sp)
    string(JSON zero GET "${l}" zero)
    string(JSON halo GET "${l}" halo_bytes)
    if(NOT fits OR NOT ms GREATER 0 OR NOT bytes GREATER 0 OR (sp EQUAL 2 AND NOT halo GREATER 0))
      message(FATAL_ERROR "layout ${k} lacks a prediction, memory or halo bytes:\n${l}")
    endif()
    list(APPEND stages${sp} ${zero})
    set(bytes${sp}_zero${zero} ${bytes})
  endforeach()
  # ZeRO-1 plans less per rank than no sharding (its optimizer state
  # sharded; ZeRO-2 and -3 add their groups in flight), at sp = 2 too.
  foreach(sp 1 2)
    list(SORT stages${sp})
    if(NOT stages${sp} STREQUAL "0;1;2;3" OR NOT bytes${sp}_zero1 LESS bytes${sp}_zero0)
      message(FATAL_ERROR "sp = ${sp} not ranked under every ZeRO stage, ZeRO-1 not smaller "
                          "(${bytes${sp}_zero1} B against ${bytes${sp}_zero0} B):\n${plan}")
    endif()
  endforeach()
  message(STATUS "ranked: ${plan}")
  string(JSON dp0 GET "${first}" dp)
  string(JSON sp0 GET "${first}" sp)
  string(JSON zero0 GET "${first}" zero)
  foreach(batch 2 1)
    train(r ${MPIEXEC} -np 2 ${EXE} ${args} --data ${data} --batch ${batch} --layout auto)
    json_field("${r}" dp dp)
    json_field("${r}" sp sp)
    json_field("${r}" zero zero)
    json_field("${r}" predicted_step_ms ms)
    string(JSON why GET "${r}" layout_reason)
    if(batch EQUAL 2)
      set(want_dp ${dp0})
      set(want_sp ${sp0})
      set(want_zero ${zero0})
    else() # the stage ranked first at sp = 2
      set(want_dp 1)
      set(want_sp 2)
      foreach(k RANGE 7)
        string(JSON l GET "${plan}" layouts ${k})
        string(JSON lsp GET "${l}" sp)
        if(lsp EQUAL 2 AND NOT DEFINED want_zero2)
          string(JSON want_zero2 GET "${l}" zero)
        endif()
      endforeach()
      set(want_zero ${want_zero2})
    endif()
    if(NOT dp EQUAL want_dp OR NOT sp EQUAL want_sp OR NOT zero EQUAL want_zero
       OR NOT ms GREATER 0 OR why STREQUAL "given by flags")
      message(FATAL_ERROR "--batch ${batch} --layout auto: expected dp ${want_dp} x sp ${want_sp} "
                          "ZeRO-${want_zero} with a prediction and a reason: ${r}")
    endif()
    message(STATUS "--batch ${batch}: dp ${dp} x sp ${sp}, predicted ${ms} ms (${why})")
  endforeach()
  return()
endif()
set(file ${WORK_DIR}/unet3d_check.h5)
# Fails unless run b (with --compare-params) took 3 steps, ended within 1e-5
# of run a's parameters and with its loss.
function(same_run a b what)
  json_field("${a}" final_loss la)
  json_field("${b}" final_loss lb)
  json_field("${b}" param_max_diff diff)
  json_field("${b}" steps steps)
  if(diff STREQUAL "")
    message(FATAL_ERROR "no param_max_diff (${what}): ${b}")
  endif()
  if(NOT steps EQUAL 3)
    message(FATAL_ERROR "expected 3 steps (${what}): ${b}")
  endif()
  message(STATUS "${what} vs serial: largest parameter difference ${diff}")
  execute_process(COMMAND python3 -c "import sys; sys.exit(0 if 0 <= float(sys.argv[1]) < 1e-5 else 1)"
                  ${diff} RESULT_VARIABLE ok)
  if(NOT ok EQUAL 0)
    message(FATAL_ERROR "${what}: parameters differ from the serial run's by ${diff}: ${b}")
  endif()
  require_close(${la} ${lb} 1e-5 "${what}: last-step loss")
endfunction()

set(common --size 16 --depth 1 --width 4 --epochs 1 --limit-steps 3 --batch 2 --val 2
    --optimizer sgd --lr 0.05 --json)
foreach(norm group) # add batch to check BatchNorm too (two more runs)
  set(params ${WORK_DIR}/unet3d_check_${norm}.txt)
  file(REMOVE ${params})
  train(a ${EXE} ${common} --norm ${norm} --generate 8 --data ${file} --save-params ${params})
  file(REMOVE ${WORK_DIR}/unet3d_timeline.json)
  train(b ${MPIEXEC} -np 2 ${EXE} ${common} --norm ${norm} --data ${file} --sp 2
        --compare-params ${params} --timeline ${WORK_DIR}/unet3d_timeline)
  same_run("${a}" "${b}" "${norm}, sp = 2")
  # No layer sums its gradients over the group itself: the update sums
  # both slabs' parts in its buckets' allreduce over the world (and the
  # parameters equal the serial run's, above).
  json_field("${a}" group_sums_per_step sums1)
  json_field("${b}" group_sums_per_step sums2)
  if(NOT sums1 EQUAL 0 OR NOT sums2 EQUAL 0)
    message(FATAL_ERROR "${norm}: layers summed their gradients themselves: ${sums1} a step at "
                        "sp = 1, ${sums2} at sp = 2 (expected none)")
  endif()
  # --timeline: both ranks' spans agree with the run: 3 steps, each node's
  # forward (3 steps and the validation batch) and backward, no layer's
  # gradient sum, the update's bucket allreduces over both ranks (at least
  # one a step), and every exchange once in flight and once waited for.
  json_field("${b}" halo_exchanges_per_step exchanges)
  json_field("${b}" nodes nodes)
  execute_process(COMMAND python3 -c "
import json, sys
from collections import Counter
path, nodes, sums, exchanges = sys.argv[1], int(sys.argv[2]) - 1, float(sys.argv[3]), float(sys.argv[4])
def kind(name):
    if name.startswith('step '):
        return 'step'
    if name.startswith('allreduce bucket '):
        return 'bucket'
    return name[0] if name[0] in 'FB' and name[1].isdigit() else name
events = json.load(open(path))['traceEvents']
for pid in (0, 1):
    c = Counter((e['tid'], kind(e['name'])) for e in events if e['pid'] == pid)
    want = {(0, 'F'): 4 * nodes, (0, 'B'): 3 * nodes, (2, 'step'): 3, (0, 'loss'): 3,
            (0, 'optimizer'): 3, (0, 'gradient sum'): round(3 * sums)}
    bad = {k: (c[k], n) for k, n in want.items() if c[k] != n}
    if bad or c[(1, 'bucket')] < 3 or c[(1, 'halo')] < 3 * exchanges or c[(0, 'halo wait')] != c[(1, 'halo')]:
        sys.exit('rank %d: (found, expected) %s; %d buckets; %d exchanges in flight, %d waits, %g a step' %
                 (pid, bad, c[(1, 'bucket')], c[(1, 'halo')], c[(0, 'halo wait')], exchanges))
" ${WORK_DIR}/unet3d_timeline.json ${nodes} ${sums2} ${exchanges}
    RESULT_VARIABLE ok ERROR_VARIABLE why)
  if(NOT ok EQUAL 0)
    message(FATAL_ERROR "${norm}: the sp = 2 timeline does not hold the run's spans: ${why}")
  endif()
  set(serial_${norm} "${a}")
  set(split_${norm} "${b}")
endforeach()
train(c ${MPIEXEC} -np 2 ${EXE} ${common} --norm group --data ${file} --dp 2 --batch 1
      --compare-params ${WORK_DIR}/unet3d_check_group.txt)
same_run("${serial_group}" "${c}" "group, dp = 2")
# ZeRO over dp (telar::SlabDataParallel): the optimizer state sharded
# (--zero 1), the gradients reduce-scattered group by group (--zero 2), and
# the values sharded, gathered per group (--zero 3), train to the same
# parameters; the state each rank holds shrinks stage by stage, as planned
# (to the byte: the store's alignment counted).
json_field("${c}" state_bytes_rank0 held)
foreach(zero 1 2 3)
  train(z ${MPIEXEC} -np 2 ${EXE} ${common} --norm group --data ${file} --dp 2 --batch 1
        --zero ${zero} --compare-params ${WORK_DIR}/unet3d_check_group.txt)
  json_field("${z}" zero stage)
  json_field("${z}" state_bytes_rank0 state)
  json_field("${z}" state_bytes_plan_rank0 plan)
  if(NOT stage EQUAL zero OR NOT state EQUAL plan OR NOT state LESS held)
    message(FATAL_ERROR "--zero ${zero}: stage ${stage}, state ${state} B (plan ${plan} B, "
                        "the stage before ${held} B): ${z}")
  endif()
  message(STATUS "ZeRO-${zero}: ${state} B of state per rank (plan ${plan}, the stage before ${held})")
  set(held ${state})
  same_run("${serial_group}" "${z}" "group, dp = 2, ZeRO-${zero}")
endforeach()
# At sp = 2 the one replica's state is sharded over its two ranks: ZeRO-3
# there (each group gathered from both slabs' ranks) trains to the serial
# parameters and holds less than sp = 2 unsharded, as planned.
json_field("${split_group}" state_bytes_rank0 held)
train(z ${MPIEXEC} -np 2 ${EXE} ${common} --norm group --data ${file} --sp 2 --zero 3
      --compare-params ${WORK_DIR}/unet3d_check_group.txt)
json_field("${z}" state_bytes_rank0 state)
json_field("${z}" state_bytes_plan_rank0 plan)
if(NOT state EQUAL plan OR NOT state LESS held)
  message(FATAL_ERROR "sp = 2 --zero 3: state ${state} B (plan ${plan} B, unsharded ${held} B): ${z}")
endif()
message(STATUS "sp = 2 ZeRO-3: ${state} B of state per rank (plan ${plan}, unsharded ${held})")
same_run("${serial_group}" "${z}" "group, sp = 2, ZeRO-3")
# Checkpoints (telar::save_checkpoint of the SlabDataParallel): dp = 2 with
# ZeRO-1 saves at step 2 (and 3, at its end); the step-3 file removed, the
# serial run resumes from step 2 and takes the third step: the serial
# run's parameters and loss, as if never stopped.
set(ckpt ${WORK_DIR}/unet3d_checkpoints)
file(REMOVE_RECURSE ${ckpt})
train(w ${MPIEXEC} -np 2 ${EXE} ${common} --norm group --data ${file} --dp 2 --batch 1 --zero 1
      --checkpoint-dir ${ckpt} --checkpoint-every 2)
if(NOT EXISTS ${ckpt}/step-000002.h5 OR NOT EXISTS ${ckpt}/step-000003.h5)
  message(FATAL_ERROR "--checkpoint-every 2 over 3 steps did not save steps 2 and 3: ${w}")
endif()
file(REMOVE ${ckpt}/step-000003.h5)
execute_process(COMMAND ${EXE} ${common} --norm group --data ${file} --checkpoint-dir ${ckpt}
                --resume --compare-params ${WORK_DIR}/unet3d_check_group.txt
                RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
string(REGEX MATCH "{\"final_loss\"[^\n]*" r "${o}")
if(NOT rc EQUAL 0 OR NOT r OR NOT e MATCHES "resumed at step 2 \\(epoch 1, batch 2\\)")
  message(FATAL_ERROR "--resume from step 2 failed (${rc}):\n${o}\n${e}")
endif()
json_field("${r}" steps ran)
json_field("${r}" param_max_diff diff)
json_field("${serial_group}" final_loss la)
json_field("${r}" final_loss lb)
message(STATUS "resumed serial from dp = 2 ZeRO-1's step 2: ${ran} step, parameters ${diff} from serial")
execute_process(COMMAND python3 -c "import sys; sys.exit(0 if 0 <= float(sys.argv[1]) < 1e-5 else 1)"
                ${diff} RESULT_VARIABLE ok)
if(NOT ran EQUAL 1 OR NOT ok EQUAL 0)
  message(FATAL_ERROR "resumed run: ${ran} steps (expected 1), parameters ${diff} from serial: ${r}")
endif()
require_close(${la} ${lb} 1e-5 "resumed: last-step loss")
