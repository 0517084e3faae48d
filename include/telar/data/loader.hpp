#pragma once
/*! \file
 *  \brief `telar::BatchLoader` (a rank's batches of an epoch, as sample
 *  indices) and `telar::BatchGather` (copies a batch's samples into Kokkos
 *  views in any memory space). */

#include <telar/data/dataset.hpp>
#include <telar/data/sampler.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace telar {

namespace detail {
// Kokkos Tools region for the data room (Kokkos 3.4 has no ScopedRegion).
struct DataProfilingRegion {
  explicit DataProfilingRegion(char const* name) { Kokkos::Profiling::pushRegion(name); }
  ~DataProfilingRegion() { Kokkos::Profiling::popRegion(); }
  DataProfilingRegion(DataProfilingRegion const&) = delete;
  DataProfilingRegion& operator=(DataProfilingRegion const&) = delete;
};
} // namespace detail

/*! \brief One rank's batch at one step: which samples, and how the global
 *  batch they belong to is made up. */
struct LocalBatch {
  std::size_t step = 0;          //!< the step, 0-based within the epoch
  std::size_t global_size = 0;   //!< samples in the global batch (divide summed losses by it)
  std::size_t global_offset = 0; //!< offset of this rank's samples within the global batch
  std::vector<std::size_t>
      indices; //!< this rank's sample indices, in order (may be empty with LastBatch::keep)
};

/*! \brief A rank's batches of one epoch: iterate it with a range-for, and call
 *  `set_epoch` before each epoch.
 *
 *  \code
 *  telar::BatchLoader loader({data.size, dp_size, dp_rank, seed}, 128);
 *  telar::BatchGather<Kokkos::DefaultExecutionSpace::memory_space> gather;
 *  for (std::uint64_t epoch = 0; epoch < epochs; ++epoch) {
 *    loader.set_epoch(epoch);
 *    for (telar::LocalBatch const& batch : loader) {
 *      gather(data, batch);
 *      train_step(gather.x(), gather.y(), batch.global_size);
 *    }
 *  }
 *  \endcode */
class BatchLoader {
public:
  /*! \brief Makes the loader.
   *  \param sampler the epoch order and this rank's place in it
   *  \param local_batch samples per rank per step (at least 1)
   *  \throws std::invalid_argument if `local_batch` is 0 */
  BatchLoader(DistributedSampler sampler, std::size_t local_batch)
      : sampler_(std::move(sampler)), local_batch_(local_batch) {
    if (local_batch == 0) {
      throw std::invalid_argument("telar::BatchLoader: local batch size must be positive");
    }
  }

  /*! \brief Moves to epoch `epoch` (the same on every rank).
   *  \param epoch the epoch */
  void set_epoch(std::uint64_t epoch) { sampler_.set_epoch(epoch); }

  /*! \brief The sampler. */
  DistributedSampler const& sampler() const noexcept { return sampler_; }

  /*! \brief Samples per rank per step (the last step may have fewer with `LastBatch::keep`). */
  std::size_t local_batch() const noexcept { return local_batch_; }

  /*! \brief Steps per epoch (the same on every rank). */
  std::size_t size() const { return sampler_.num_steps(local_batch_); }

  /*! \brief This rank's batch at step `step`, into `out` (its capacity is reused).
   *  \param step the step, below `size()`
   *  \param out receives the batch */
  void batch(std::size_t step, LocalBatch& out) const {
    BatchSlice const s = sampler_.slice(step, local_batch_);
    out.step = step;
    out.global_size = s.global_size;
    out.global_offset = s.local_begin;
    sampler_.local_indices(step, local_batch_, out.indices);
  }

  /*! \brief This rank's batch at step `step`.
   *  \param step the step, below `size()` */
  LocalBatch batch(std::size_t step) const {
    LocalBatch out;
    batch(step, out);
    return out;
  }

  /*! \brief An input iterator over the epoch's batches; it refills one
   *  `LocalBatch` in place, so a reference stays valid only until the next
   *  increment. */
  class iterator {
  public:
    using iterator_category = std::input_iterator_tag; //!< single pass
    using value_type = LocalBatch;                     //!< what it yields
    using difference_type = std::ptrdiff_t;            //!< step distance
    using pointer = LocalBatch const*;                 //!< pointer to a batch
    using reference = LocalBatch const&;               //!< reference to a batch

    /*! \brief An iterator at step `step` of `loader`'s epoch.
     *  \param loader the loader
     *  \param step the step */
    iterator(BatchLoader const* loader, std::size_t step) : loader_(loader), step_(step) {}

    /*! \brief The batch at the current step. */
    reference operator*() const {
      if (!filled_) {
        loader_->batch(step_, current_);
        filled_ = true;
      }
      return current_;
    }
    /*! \brief Access to the batch at the current step. */
    pointer operator->() const { return &**this; }
    /*! \brief Moves to the next step. */
    iterator& operator++() {
      ++step_;
      filled_ = false;
      return *this;
    }
    /*! \brief Whether two iterators are at the same step.
     *  \param other the other iterator */
    bool operator==(iterator const& other) const { return step_ == other.step_; }
    /*! \brief Whether two iterators are at different steps.
     *  \param other the other iterator */
    bool operator!=(iterator const& other) const { return step_ != other.step_; }

  private:
    BatchLoader const* loader_;
    std::size_t step_;
    mutable LocalBatch current_;
    mutable bool filled_ = false;
  };

  /*! \brief The first batch of the current epoch. */
  iterator begin() const { return iterator(this, 0); }
  /*! \brief Past the last batch of the current epoch. */
  iterator end() const { return iterator(this, size()); }

private:
  DistributedSampler sampler_;
  std::size_t local_batch_;
};

/*! \brief Copies a batch's samples (rows of `Dataset::x`, labels of
 *  `Dataset::y`) into Kokkos views in `MemorySpace`, reusing its allocations
 *  from step to step.
 *
 *  It fills a host staging copy and `deep_copy`s it to `MemorySpace` (no copy
 *  when that is host memory). The views returned by `x()` and `y()` have as
 *  many rows as the last batch gathered; they are windows into buffers that
 *  grow to the largest batch seen and are overwritten by the next gather.
 *  \tparam MemorySpace where the views live, e.g. `Kokkos::HostSpace` or
 *          `Kokkos::DefaultExecutionSpace::memory_space` */
template <class MemorySpace = Kokkos::HostSpace>
class BatchGather {
  static_assert(Kokkos::is_memory_space<MemorySpace>::value,
                "telar::BatchGather<MemorySpace>: MemorySpace must be a Kokkos memory space, "
                "e.g. Kokkos::HostSpace");

public:
  /*! \brief The memory space of the views. */
  using memory_space = MemorySpace;
  /*! \brief The execution space that copies into `MemorySpace`. */
  using execution_space = typename MemorySpace::execution_space;
  /*! \brief The features of a batch: one row per sample. */
  using x_view = Kokkos::View<float**, Kokkos::LayoutRight, MemorySpace>;
  /*! \brief The labels of a batch. */
  using y_view = Kokkos::View<int*, MemorySpace>;

  /*! \brief Makes an empty gatherer; buffers are allocated by the first gather. */
  BatchGather() = default;

  /*! \brief Makes a gatherer with room for `max_batch` samples of `features` floats.
   *  \param max_batch rows to allocate
   *  \param features floats per row */
  BatchGather(std::size_t max_batch, std::size_t features) { reserve(max_batch, features); }

  /*! \brief Not copyable: copies would share (and overwrite) one set of buffers. */
  BatchGather(BatchGather const&) = delete;
  /*! \brief Not copyable: copies would share (and overwrite) one set of buffers. */
  BatchGather& operator=(BatchGather const&) = delete;
  /*! \brief Moves the buffers into a new gatherer. */
  BatchGather(BatchGather&& other)
      : x_(std::move(other.x_)), y_(std::move(other.y_)), host_x_(std::move(other.host_x_)),
        host_y_(std::move(other.host_y_)), features_(other.features_), size_(other.size_),
        pending_space_(std::move(other.pending_space_)) {
    other.pending_space_.reset(); // the fence is now ours
  }
  /*! \brief Waits for this gatherer's copy in flight, then takes `other`'s buffers.
   *  \param other the gatherer to move from */
  BatchGather& operator=(BatchGather&& other) {
    if (this != &other) {
      wait();
      x_ = std::move(other.x_);
      y_ = std::move(other.y_);
      host_x_ = std::move(other.host_x_);
      host_y_ = std::move(other.host_y_);
      features_ = other.features_;
      size_ = other.size_;
      pending_space_ = std::move(other.pending_space_);
      other.pending_space_.reset();
    }
    return *this;
  }
  /*! \brief Waits for an asynchronous copy still in flight, then frees the buffers. */
  ~BatchGather() { wait(); }

  /*! \brief Copies samples `indices[0..count)` of `data`, in that order, and
   *  waits until the copy is done.
   *  \param data the data set
   *  \param indices sample indices, each below `data.size`
   *  \param count number of indices
   *  \throws std::out_of_range for an index past the data set
   *  \throws std::invalid_argument if `data`'s members disagree on its size */
  void gather(Dataset const& data, std::size_t const* indices, std::size_t count) {
    detail::DataProfilingRegion region("telar::BatchGather::gather");
    stage(data, indices, count);
    if (host_x_.data() != x_.data()) {
      Kokkos::deep_copy(
          x(), Kokkos::subview(host_x_, std::make_pair(std::size_t(0), count), Kokkos::ALL()));
      Kokkos::deep_copy(y(), Kokkos::subview(host_y_, std::make_pair(std::size_t(0), count)));
    }
  }

  /*! \brief Like the blocking `gather`, but enqueues the copy to `MemorySpace`
   *  on `space` and returns; kernels later submitted to `space` see the batch.
   *  The next gather waits for this copy before it reuses the staging buffers.
   *  \param space the execution space instance to copy on
   *  \param data the data set
   *  \param indices sample indices, each below `data.size`
   *  \param count number of indices */
  void gather(execution_space const& space, Dataset const& data, std::size_t const* indices,
              std::size_t count) {
    detail::DataProfilingRegion region("telar::BatchGather::gather");
    stage(data, indices, count);
    if (host_x_.data() != x_.data()) {
      Kokkos::deep_copy(
          space, x(),
          Kokkos::subview(host_x_, std::make_pair(std::size_t(0), count), Kokkos::ALL()));
      Kokkos::deep_copy(space, y(),
                        Kokkos::subview(host_y_, std::make_pair(std::size_t(0), count)));
      pending_space_ = space;
    }
  }

  /*! \brief Copies the samples of `indices`.
   *  \param data the data set
   *  \param indices sample indices, each below `data.size` */
  void gather(Dataset const& data, std::vector<std::size_t> const& indices) {
    gather(data, indices.data(), indices.size());
  }

  /*! \brief Copies the samples of a loader's batch.
   *  \param data the data set
   *  \param batch the batch */
  void operator()(Dataset const& data, LocalBatch const& batch) {
    gather(data, batch.indices.data(), batch.indices.size());
  }

  /*! \brief Makes room for `max_batch` rows of `features` floats (reallocates
   *  only if the buffers are smaller or the feature count changes).
   *  \param max_batch rows
   *  \param features floats per row */
  void reserve(std::size_t max_batch, std::size_t features) {
    if (max_batch <= capacity() && features == features_ && x_.data() != nullptr) {
      return;
    }
    wait();
    std::size_t const rows = std::max(max_batch, capacity());
    x_ = x_view(Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::BatchGather::x"), rows,
                features);
    y_ = y_view(Kokkos::view_alloc(Kokkos::WithoutInitializing, "telar::BatchGather::y"), rows);
    host_x_ = Kokkos::create_mirror_view(x_);
    host_y_ = Kokkos::create_mirror_view(y_);
    features_ = features;
  }

  /*! \brief The last batch's features: `size()` rows of `features` floats. */
  x_view x() const {
    return Kokkos::subview(x_, std::make_pair(std::size_t(0), size_), Kokkos::ALL());
  }
  /*! \brief The last batch's labels: `size()` integers. */
  y_view y() const { return Kokkos::subview(y_, std::make_pair(std::size_t(0), size_)); }
  /*! \brief Samples in the last batch. */
  std::size_t size() const noexcept { return size_; }
  /*! \brief Rows the buffers hold. */
  std::size_t capacity() const noexcept { return x_.extent(0); }

private:
  void wait() {
    if (pending_space_) {
      pending_space_->fence();
      pending_space_.reset();
    }
  }

  void stage(Dataset const& data, std::size_t const* indices, std::size_t count) {
    if (data.x.size() != data.size * data.features || data.y.size() != data.size) {
      throw std::invalid_argument("telar::BatchGather: data set '" + data.name +
                                  "' is inconsistent: size " + std::to_string(data.size) +
                                  " x features " + std::to_string(data.features) + " but x holds " +
                                  std::to_string(data.x.size()) + " floats and y " +
                                  std::to_string(data.y.size()) + " labels");
    }
    for (std::size_t k = 0; k < count; ++k) {
      if (indices[k] >= data.size) {
        throw std::out_of_range("telar::BatchGather: sample index " + std::to_string(indices[k]) +
                                " is past the end of data set '" + data.name + "' (" +
                                std::to_string(data.size) + " samples)");
      }
    }
    reserve(count, data.features);
    wait(); // an asynchronous copy may still read the staging buffers
    std::size_t const f = data.features;
    float* rows = host_x_.data(); // LayoutRight: row k starts at k * f
    for (std::size_t k = 0; k < count; ++k) {
      if (f != 0) {
        std::memcpy(rows + k * f, data.x.data() + indices[k] * f, f * sizeof(float));
      }
      host_y_(k) = static_cast<int>(data.y[indices[k]]);
    }
    size_ = count;
  }

  x_view x_;
  y_view y_;
  typename x_view::host_mirror_type host_x_;
  typename y_view::host_mirror_type host_y_;
  std::size_t features_ = 0;
  std::size_t size_ = 0;
  std::optional<execution_space> pending_space_; // set while an asynchronous copy may run
};

} // namespace telar
