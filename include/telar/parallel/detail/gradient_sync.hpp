#pragma once
// Every gradient-sync specialisation (see gradient_sync_decl.hpp).
#include <telar/parallel/detail/gradient_sync_decl.hpp>
#include <telar/parallel/detail/sync_no_sharding.hpp>
#include <telar/parallel/detail/sync_zero1.hpp>
#include <telar/parallel/detail/sync_zero2.hpp>
#include <telar/parallel/detail/sync_zero3.hpp>
