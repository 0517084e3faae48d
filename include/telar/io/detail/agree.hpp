#pragma once
// One error for every rank: a failure seen by some ranks (a file only they
// open, a slab only they own) must stop all of them with the same message,
// never leave the others waiting in the next collective.
#include <telar/comm/communicator.hpp>

#include <exception>
#include <string>

namespace telar::detail {

// Throws E(the lowest failing rank's message) on every rank of comm when any
// rank has a non-empty error; returns on every rank otherwise. Collective.
template <class E>
void agree_as(Communicator const* comm, std::string const& error) {
  if (comm == nullptr || comm->size() == 1) {
    if (!error.empty())
      throw E(error);
    return;
  }
  int first = error.empty() ? comm->size() : comm->rank();
  comm->allreduce(&first, 1, ReduceOp::min);
  if (first == comm->size())
    return;
  std::string msg = error;
  unsigned long long n = msg.size();
  comm->broadcast(&n, 1, first);
  msg.resize(std::size_t(n));
  comm->broadcast(msg.data(), std::size_t(n), first);
  throw E(msg);
}

// Runs f(), catching what it throws as this rank's message (`unknown` when
// the exception has none); then agrees. Collective.
template <class E, class F>
void agreed_as(Communicator const* comm, char const* unknown, F&& f) {
  std::string error;
  try {
    f();
  } catch (std::exception const& e) {
    error = e.what();
    if (error.empty())
      error = unknown;
  }
  agree_as<E>(comm, error);
}

} // namespace telar::detail
