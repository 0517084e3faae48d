#pragma once
/*! \file
 *  \brief All of Telar in one include, as Kokkos_Core.hpp and ArborX.hpp do:
 *  shapes, layers and blocks, losses, optimizers, communication, strategies,
 *  schedules, the Trainer, data, the memory plan and meter, the gradient
 *  checker and the hyper-parameter search. Each room also has its own headers
 *  (telar/core/..., telar/layers/..., telar/data.hpp, telar/schedule.hpp)
 *  for programs that want fewer.
 *  \code
 *  #include <telar/telar.hpp>
 *  \endcode */
#include <telar/comm/allreduce.hpp>
#include <telar/comm/communicator.hpp>
#include <telar/comm/process_grid.hpp>
#include <telar/config.hpp>
#include <telar/core/branches.hpp>
#include <telar/core/dynamic_graph.hpp>
#include <telar/core/dynamic_sequential.hpp>
#include <telar/core/gemm.hpp>
#include <telar/core/graph_chain.hpp>
#include <telar/core/identity.hpp>
#include <telar/core/layer.hpp>
#include <telar/core/loss.hpp>
#include <telar/core/recompute.hpp>
#include <telar/core/residual.hpp>
#include <telar/core/sequential.hpp>
#include <telar/core/shape.hpp>
#include <telar/data.hpp>
#include <telar/io/error.hpp>
#include <telar/io/gather.hpp>
#if TELAR_HAVE_HDF5
#include <telar/io/checkpoint.hpp>
#endif
#include <telar/layers/activation.hpp>
#include <telar/layers/attention.hpp>
#include <telar/layers/batch_norm.hpp>
#include <telar/layers/bias.hpp>
#include <telar/layers/conv.hpp>
#include <telar/layers/conv_transpose.hpp>
#include <telar/layers/dense.hpp>
#include <telar/layers/dropout.hpp>
#include <telar/layers/embedding.hpp>
#include <telar/layers/flatten.hpp>
#include <telar/layers/losses.hpp>
#include <telar/layers/masked_fill.hpp>
#include <telar/layers/multiplier.hpp>
#include <telar/layers/normalization.hpp>
#include <telar/layers/pooling.hpp>
#include <telar/layers/rearrange.hpp>
#include <telar/layers/softmax.hpp>
#include <telar/layers/softmax_cross_entropy.hpp>
#include <telar/layers/transformer.hpp>
#include <telar/layers/upsample.hpp>
#include <telar/optim/adam.hpp>
#include <telar/optim/lamb.hpp>
#include <telar/optim/lr_schedule.hpp>
#include <telar/optim/sgd.hpp>
#include <telar/parallel/data_parallel.hpp>
#include <telar/parallel/layout_options.hpp>
#include <telar/parallel/memory_plan.hpp>
#include <telar/parallel/run_layout.hpp>
#include <telar/parallel/strategy.hpp>
#include <telar/parallel/tensor_parallel.hpp>
#include <telar/parallel/tensor_parallel_attention.hpp>
#include <telar/profile/gather.hpp>
#include <telar/profile/memory.hpp>
#include <telar/profile/trace.hpp>
#include <telar/schedule.hpp>
#include <telar/testing/check_gradients.hpp>
#include <telar/train/hpsearch.hpp>
#include <telar/train/json.hpp>
#include <telar/train/progress.hpp>
#include <telar/train/trainer.hpp>
