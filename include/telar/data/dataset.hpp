#pragma once
/*! \file
 *  \brief `telar::Dataset`: an in-memory classification data set. */

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace telar {

/*! \brief An in-memory classification data set: `size` samples of `features`
 *  floats each, with one integer label per sample.
 *
 *  Samples are rows of `x` (row-major, `size * features` floats); `y[i]` is the
 *  label of row `i`, in `[0, classes)`. The loaders fill every member; code
 *  that builds a `Dataset` by hand should keep the sizes consistent, which
 *  `telar::BatchGather` checks. */
struct Dataset {
  std::size_t size = 0;        //!< number of samples
  std::size_t features = 0;    //!< floats per sample (the product of `shape`)
  int classes = 0;             //!< number of classes; labels are in `[0, classes)`
  std::vector<float> x;        //!< `size * features` floats, row-major; images are scaled to [0, 1]
  std::vector<std::int32_t> y; //!< `size` labels
  std::vector<std::size_t> shape; //!< shape of one sample, e.g. `{28, 28}`; `{features}` if flat
  std::string name;               //!< where it came from, for logs (a path or a generator)
};

} // namespace telar
