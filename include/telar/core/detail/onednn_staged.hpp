#pragma once
// f32 activations converted into a channel-blocked bf16 layout in two steps
// (telar::OneDnnConvBf16's inputs: x and dy).
//
// oneDNN 2.6 does the conversion from plain NCHW f32 to nChw16c bf16 with
// one reorder (jit:uni) that is bound by its instructions: 0.31 ms for a
// 128x32x14x14 tensor already in cache, 0.68 ms for 128x64x14x14, 1.3-1.5
// ms for 128x32x28x28 (one thread). Moving the values into the blocked
// layout in f32 (jit:blk) and converting that as a flat array (the 1-D
// reorder Bf16Gemm's operands use) takes 0.12-0.16, 0.30 and 0.84 ms, and
// gives the same words: the same rounding of the same values. The f32 step
// goes through a buffer of a few samples (512 KiB, one per thread), so it
// stays in cache and no tensor-sized copy is held; smaller buffers mean
// more, shorter calls (256 KiB was no faster). Example 02's bf16 step, 8
// interleaved rounds: 33.6 -> 32.3 ms (docs/precision.md).
#include <telar/config.hpp>

#if TELAR_HAVE_ONEDNN
#include <dnnl.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace telar::detail {

class OneDnnStagedInput {
public:
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  using desc = dnnl::memory::desc;

  // The staged conversion from `from` (f32, dims d, layout `plain`: dense,
  // samples outermost) into `to`, or null where `to` is not bf16 in a
  // channel-blocked layout of the same dims (where oneDNN's one reorder is
  // what there is).
  static std::shared_ptr<OneDnnStagedInput> make(dnnl::engine const& eng, desc const& from,
                                                 desc const& to, dnnl::memory::dims const& d,
                                                 tag plain) {
    if (d.size() != 4 && d.size() != 5)
      return nullptr;
    if (!(from == desc(d, dt::f32, plain)))
      return nullptr;
    tag const blocked4[] = {tag::aBcd16b, tag::aBcd8b, tag::aBcd4b};
    tag const blocked5[] = {tag::aBcde16b, tag::aBcde8b, tag::aBcde4b};
    for (tag t : d.size() == 4 ? blocked4 : blocked5)
      if (to == desc(d, dt::bf16, t))
        return std::make_shared<OneDnnStagedInput>(eng, d, plain, t);
    return nullptr;
  }

  OneDnnStagedInput(dnnl::engine const& eng, dnnl::memory::dims d, tag plain, tag blocked) {
    std::int64_t const n = d[0];
    d[0] = 1;
    plain_ = std::int64_t(desc(d, dt::f32, plain).get_size() / sizeof(float));
    blocked_ = std::int64_t(desc(d, dt::f32, blocked).get_size() / sizeof(float));
    per_ = std::clamp<std::int64_t>(std::int64_t(stage_bytes / sizeof(float)) / blocked_, 1, n);
    full_ = Part(eng, d, per_, plain, blocked);
    if (n % per_ != 0)
      rest_ = Part(eng, d, n % per_, plain, blocked);
    n_ = n;
  }

  // `out` (the blocked bf16 buffer) from `in` (plain f32), per_ samples at a time.
  void run(dnnl::stream& s, float const* in, std::uint16_t* out) {
    float* const stage = buffer(std::size_t(per_ * blocked_));
    for (std::int64_t n0 = 0; n0 < n_; n0 += per_) {
      Part& p = n_ - n0 >= per_ ? full_ : rest_;
      p.from.set_data_handle(const_cast<float*>(in + n0 * plain_));
      p.stage.set_data_handle(stage);
      p.flat.set_data_handle(stage);
      p.to.set_data_handle(out + n0 * blocked_);
      p.relayout.execute(s, p.from, p.stage);
      p.convert.execute(s, p.flat, p.to);
    }
  }

private:
  static constexpr std::size_t stage_bytes = 512 * 1024;

  // The two reorders for `samples` samples.
  struct Part {
    dnnl::memory from, stage, flat, to;
    dnnl::reorder relayout, convert;
    Part() = default;
    Part(dnnl::engine const& eng, dnnl::memory::dims d, std::int64_t samples, tag plain,
         tag blocked) {
      d[0] = samples;
      from = dnnl::memory(desc(d, dt::f32, plain), eng, DNNL_MEMORY_NONE);
      stage = dnnl::memory(desc(d, dt::f32, blocked), eng, DNNL_MEMORY_NONE);
      std::int64_t const values = std::int64_t(stage.get_desc().get_size() / sizeof(float));
      flat = dnnl::memory(desc({values}, dt::f32, tag::a), eng, DNNL_MEMORY_NONE);
      to = dnnl::memory(desc({values}, dt::bf16, tag::a), eng, DNNL_MEMORY_NONE);
      relayout = dnnl::reorder(from, stage);
      convert = dnnl::reorder(flat, to);
    }
  };

  // This thread's staging buffer, at least `count` floats, 64-byte aligned.
  static float* buffer(std::size_t count) {
    thread_local std::vector<float> b;
    constexpr std::size_t pad = 64 / sizeof(float);
    if (b.size() < count + pad)
      b.resize(count + pad);
    auto const at = reinterpret_cast<std::uintptr_t>(b.data());
    return b.data() + (64 - at % 64) % 64 / sizeof(float);
  }

  std::int64_t n_ = 0, per_ = 1;
  std::int64_t plain_ = 0, blocked_ = 0; // values per sample in each layout
  Part full_, rest_;
};

} // namespace telar::detail

#endif // TELAR_HAVE_ONEDNN
