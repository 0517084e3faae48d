# cmake -DEXE=onnx_train -DMPIEXEC=mpiexec -DPYTHON=/usr/bin/python3 -DSRC=<tests/onnx>
#       -DOUT=<dir> -P run_onnx_train.cmake
# Example 04 as a user runs it: export an MLP from PyTorch, train it 60 steps
# under dp=2 at 2 ranks, write it back; PyTorch loads the result and the JSON
# summary shows it learnt. Then a BatchNorm model on one sample per rank.
# First, without Fashion-MNIST: --predict runs a CNN of input [1, 10, 10] and
# 3 outputs on a NumPy batch as PyTorch does, and --data synthetic trains it
# on synthetic samples of that shape in 3 classes.
execute_process(COMMAND ${PYTHON} ${SRC}/make_models.py ${OUT} --fashion RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "make_models.py --fashion failed (${rc})")
endif()
file(REMOVE ${OUT}/cnn_telar.npy)
execute_process(COMMAND ${MPIEXEC} -n 1 ${EXE} --model ${OUT}/cnn.onnx --predict ${OUT}/cnn_x.npy
                        --output ${OUT}/cnn_telar.npy RESULT_VARIABLE rc ERROR_VARIABLE e)
execute_process(COMMAND ${PYTHON} -c "
import numpy as np, sys
got, want = np.load(sys.argv[1]), np.load(sys.argv[2])
err = float(np.abs(got - want).max() / np.abs(want).max()) if got.shape == want.shape else 1
print(f'--predict: shape {got.shape}, max relative difference {err:.2e}')
sys.exit(0 if err <= 1e-5 else 1)" ${OUT}/cnn_telar.npy ${OUT}/cnn_y.npy RESULT_VARIABLE ok)
if(NOT rc EQUAL 0 OR NOT ok EQUAL 0)
  message(FATAL_ERROR "onnx_train --predict (${rc}) differs from PyTorch's outputs:\n${e}")
endif()
execute_process(COMMAND ${MPIEXEC} -n 2 ${EXE} --model ${OUT}/cnn.onnx --data synthetic --dp 2
                        --batch 16 --epochs 20 --optimizer sgd --lr 0.5 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
string(REGEX MATCH "\"test_accuracy\":([-0-9.eE+]+)" _ "${o}")
set(acc "${CMAKE_MATCH_1}")
if(NOT rc EQUAL 0 OR NOT o MATCHES "\"data\":\"synthetic\"" OR NOT acc OR acc LESS 0.6) # chance: 1/3
  message(FATAL_ERROR "onnx_train --data synthetic did not learn (${rc}, accuracy '${acc}'):\n${o}\n${e}")
endif()
message(STATUS "--data synthetic: test accuracy ${acc}")
set(data /usr/share/datasets/fashion-mnist)
if(DEFINED ENV{TELAR_FASHION_MNIST_DIR})
  set(data $ENV{TELAR_FASHION_MNIST_DIR})
endif()
if(NOT EXISTS ${data})
  message(STATUS "Fashion-MNIST not installed in ${data}: skipped")
  cmake_language(EXIT 77)
endif()
file(REMOVE ${OUT}/fashion_mlp_trained.onnx)
execute_process(COMMAND ${MPIEXEC} -n 2 ${EXE} --model ${OUT}/fashion_mlp.onnx --dp 2
                        --batch 32 --limit-steps 60 --optimizer sgd --lr 0.1 --json --data ${data}
                        --export ${OUT}/fashion_mlp_trained.onnx
                RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "onnx_train failed (${rc}):\n${o}\n${e}")
endif()
string(REGEX MATCH "\"test_accuracy\":([-0-9.eE+]+)" _ "${o}")
set(acc "${CMAKE_MATCH_1}")
if(NOT acc OR acc LESS 0.3) # chance: 0.1
  message(FATAL_ERROR "onnx_train did not learn (test accuracy '${acc}'):\n${o}\n${e}")
endif()
execute_process(COMMAND ${PYTHON} -c "
import onnx, sys
m = onnx.load(sys.argv[1]); onnx.checker.check_model(m)
print('exported model loads:', [t.name for t in m.graph.initializer])" ${OUT}/fashion_mlp_trained.onnx
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the exported model does not load in onnx")
endif()
message(STATUS "test accuracy ${acc}")
# A BatchNorm after a Gemm on one sample per rank: SyncStats normalises over
# both ranks' samples, so dp=2 --batch 2 trains (only 1 sample per micro-batch
# on one rank is refused, docs/errors.md), step-time prediction included.
execute_process(COMMAND ${PYTHON} ${SRC}/../examples/make_bad_onnx.py ${OUT} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "make_bad_onnx.py failed (${rc})")
endif()
execute_process(COMMAND ${MPIEXEC} -n 2 ${EXE} --model ${OUT}/cat_bn.onnx --dp 2 --batch 2
                        --limit-steps 3 --json --data ${data}
                RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
if(NOT rc EQUAL 0 OR NOT o MATCHES "\"predicted_step_ms\"")
  message(FATAL_ERROR "BatchNorm on 1 sample per rank under dp=2 (SyncStats) failed (${rc}):\n${o}\n${e}")
endif()
