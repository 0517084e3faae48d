// Example 01's pieces shared by its translation units. The example trains
// 36 Trainer types (4 optimizers x 4 ZeRO stages x recomputation on/off, and
// bf16 at stage 0 with each optimizer); in one file they took about 100 s to
// compile. Each ZeRO stage's types, with and without recomputation, therefore
// have their own file, train_zero<k>[_recompute].cpp (train.hpp defines them:
// 4 Trainer types each), and the bf16 ones too (train_bf16.cpp); main.cpp
// parses the flags, plans and picks the file. The split is by strategy and
// model, not by optimizer: a Trainer's heaviest parts (executor, gradient
// sync, memory plan) depend on the model and the strategy, not on the
// optimizer, so each file compiles them once for its 4 optimizers and no two
// files compile the same ones.
#pragma once
#include "layout_planning.hpp"

#include <telar/telar.hpp>

#include <mpi.h>

#include <cstddef>
#include <optional>
#include <string>

namespace fashion_mnist {

using T = float; // the model's value type

struct Args : example::CommonArgs {
  Args() : CommonArgs(/*epochs*/ 3, /*hidden*/ 256) { takes_precision = true; }
  int zero = 0; // ZeRO stage
  std::string recompute = "none";
};

// Prints why and the usage line, then throws 2 (main.cpp).
[[noreturn]] void usage(char const* why);

using R = telar::ReLU<T>;
// The first two layers form a Megatron pair under --tp (plain Dense at tp 1).
// Gemm: AutoGemm (fp32) or Bf16Gemm (--precision bf16).
template <class Gemm>
using ModelWith =
    telar::Sequential<telar::ColumnParallel<telar::Dense<T, telar::DefaultMemorySpace, Gemm>>, R,
                      telar::RowParallel<telar::Dense<T, telar::DefaultMemorySpace, Gemm>>, R,
                      telar::Dense<T, telar::DefaultMemorySpace, Gemm>>;
using Model = ModelWith<telar::AutoGemm>;
// One strategy type per ZeRO stage: degrees left at 1 cost nothing.
template <int Stage>
struct ShardingFor {
  using type = telar::ZeRO<Stage>;
};
template <>
struct ShardingFor<0> {
  using type = telar::NoSharding;
};
template <int Stage>
using StrategyFor =
    telar::Strategy<telar::DataParallel<telar::RingAllreduce, typename ShardingFor<Stage>::type>,
                    telar::PipelineParallel<telar::OneFOneB>, telar::TensorParallel<>>;

template <class Gemm = telar::AutoGemm>
ModelWith<Gemm> make_model(std::size_t hidden) {
  using D = telar::Dense<T, telar::DefaultMemorySpace, Gemm>;
  return ModelWith<Gemm>(telar::ColumnParallel<D>(784, hidden), {},
                         telar::RowParallel<D>(hidden, hidden), {}, D(hidden, 10));
}

// Trains the model `a` asks for (--optimizer, --precision) under the
// strategy of ZeRO stage `Stage`, with every layer recomputed in backward or
// not (train.hpp); `plan` is the planner's ranking when one was made. One
// file per stage and recomputation instantiates it.
template <int Stage, bool Recompute>
int train_stage(MPI_Comm comm, Args const& a, std::optional<telar::LayoutPlan> const& plan);

extern template int train_stage<0, false>(MPI_Comm, Args const&,
                                          std::optional<telar::LayoutPlan> const&);
extern template int train_stage<0, true>(MPI_Comm, Args const&,
                                         std::optional<telar::LayoutPlan> const&);
extern template int train_stage<1, false>(MPI_Comm, Args const&,
                                          std::optional<telar::LayoutPlan> const&);
extern template int train_stage<1, true>(MPI_Comm, Args const&,
                                         std::optional<telar::LayoutPlan> const&);
extern template int train_stage<2, false>(MPI_Comm, Args const&,
                                          std::optional<telar::LayoutPlan> const&);
extern template int train_stage<2, true>(MPI_Comm, Args const&,
                                         std::optional<telar::LayoutPlan> const&);
extern template int train_stage<3, false>(MPI_Comm, Args const&,
                                          std::optional<telar::LayoutPlan> const&);
extern template int train_stage<3, true>(MPI_Comm, Args const&,
                                         std::optional<telar::LayoutPlan> const&);

// --precision bf16: plans (when the flags ask) and trains at ZeRO stage 0
// without recomputation (train_bf16.cpp).
int train_bf16(MPI_Comm comm, Args a);

} // namespace fashion_mnist
