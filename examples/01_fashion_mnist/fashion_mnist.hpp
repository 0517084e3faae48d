// Example 01's pieces shared by its translation units (see CMakeLists.txt:
// main.cpp parses the flags and picks the optimizer; train_<optimizer>.cpp
// each compile the Trainer types of one optimizer, defined in train.hpp).
#pragma once
#include "layout_planning.hpp"

#include <telar/optim/adam.hpp>
#include <telar/optim/lamb.hpp>
#include <telar/optim/sgd.hpp>

#include <mpi.h>

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

// Trains with optimizer `opt` under the layout `a` asks for (train.hpp). Each
// optimizer's instantiation has its own translation unit: the example
// instantiates about 36 Trainer types (4 optimizers x (4 ZeRO stages x
// recomputation on/off + bf16)), about 100 s of compilation in one file.
template <class Optimizer>
int train_model(MPI_Comm comm, Args const& given, Optimizer opt);

extern template int train_model(MPI_Comm, Args const&, telar::SGD<T>);
extern template int train_model(MPI_Comm, Args const&, telar::Adam<T>);
extern template int train_model(MPI_Comm, Args const&, telar::AdamW<T>);
extern template int train_model(MPI_Comm, Args const&, telar::LAMB<T>);

} // namespace fashion_mnist
