#pragma once
// Every gradient-sync specialisation (see gradient_sync_decl.hpp).
#include <telar/parallel/detail/gradient_sync_decl.hpp>
#include <telar/parallel/detail/sync_group_gradients.hpp>
#include <telar/parallel/detail/sync_no_sharding.hpp>
#include <telar/parallel/detail/sync_zero1.hpp>
