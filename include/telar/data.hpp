#pragma once
/*! \file
 *  \brief Telar's data room in one include: IDX / Fashion-MNIST reader,
 *  synthetic data, the fortunes text reader, the random number generator, the
 *  distributed sampler and the batch loader. Uses no MPI. */

#include <telar/data/dataset.hpp>
#include <telar/data/error.hpp>
#include <telar/data/idx.hpp>
#include <telar/data/loader.hpp>
#include <telar/data/npy.hpp>
#include <telar/data/random.hpp>
#include <telar/data/sampler.hpp>
#include <telar/data/synthetic.hpp>
#include <telar/data/text.hpp>
