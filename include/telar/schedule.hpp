#pragma once

/*! \file
    \brief Everything of telar::schedule: instructions, schedules and their generators, the
    validator, the simulator, timelines and SVG charts. Standard C++17 only. */

#include <telar/schedule/cost_model.hpp>
#include <telar/schedule/generators.hpp>
#include <telar/schedule/instruction.hpp>
#include <telar/schedule/schedule.hpp>
#include <telar/schedule/simulate.hpp>
#include <telar/schedule/svg.hpp>
#include <telar/schedule/timeline.hpp>
#include <telar/schedule/validate.hpp>
#include <telar/schedule/validation_result.hpp>
