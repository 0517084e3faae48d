#pragma once
// What the oneDNN primitives behind telar::OneDnnConv, telar::OneDnnConvBf16
// and telar::Bf16Gemm share: the process-wide engine, a stream per thread, an
// argument port (caller's buffer plus a cached reorder into the layout and
// data type a primitive wants), and the run-time check that the CPU has bf16
// instructions.
#include <telar/config.hpp>

#if TELAR_HAVE_ONEDNN
#include <telar/core/detail/bf16_env.hpp>
#include <telar/core/detail/onednn_staged.hpp>
#include <telar/core/error.hpp>

#include <dnnl.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace telar {
namespace detail {

// One process-wide CPU engine; one stream per thread (streams are cheap, and
// a layer may run on several threads over its life).
inline dnnl::engine& onednn_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}
inline dnnl::stream& onednn_stream() {
  thread_local dnnl::stream s(onednn_engine());
  return s;
}

// The primitives of one kind, cached by their shapes: the entry whose key
// is `key`, or null once there is room for a new one (the oldest goes;
// shapes repeat step after step, so a few entries serve a whole run).
template <class Entry, class Key>
Entry* cached_primitive(std::vector<std::unique_ptr<Entry>>& entries, Key const& key,
                        std::size_t capacity) {
  for (auto& e : entries)
    if (e->key == key)
      return e.get();
  if (entries.size() >= capacity)
    entries.erase(entries.begin());
  return nullptr;
}

// One argument of a primitive: the caller's plain buffer (`user`, whose
// handle is set per call) and, when the primitive wants another layout or
// data type, a buffer in that layout with the reorder between them (the
// reorder converts f32 <-> bf16 too).
struct OneDnnPort {
  dnnl::memory user, inner;
  dnnl::reorder convert; // user -> inner for inputs, inner -> user for outputs
  bool reordered = false;
  std::shared_ptr<OneDnnStagedInput> staged; // an input converted in two steps instead

  void init(dnnl::memory::desc const& plain, dnnl::memory::desc const& want, bool input) {
    auto& eng = onednn_engine();
    user = dnnl::memory(plain, eng, DNNL_MEMORY_NONE);
    reordered = !(want == plain);
    if (reordered) {
      inner = dnnl::memory(want, eng);
      convert = input ? dnnl::reorder(user, inner) : dnnl::reorder(inner, user);
    } else {
      inner = user;
    }
  }
  // An input port from the caller's buffers of another type or layout
  // (`given`: bf16 words a layer kept) into `target`'s buffer, which then
  // holds the same operand whichever port filled it.
  void init_into(dnnl::memory::desc const& given, OneDnnPort const& target) {
    user = dnnl::memory(given, onednn_engine(), DNNL_MEMORY_NONE);
    reordered = !(target.inner.get_desc() == given);
    inner = reordered ? target.inner : user;
    if (reordered)
      convert = dnnl::reorder(user, inner);
  }
  // An input port's activations (dims d, layout `plain`) converted through
  // OneDnnStagedInput where it applies (f32 into a blocked bf16 layout).
  void stage(dnnl::memory::dims const& d, dnnl::memory::format_tag plain) {
    if (reordered)
      staged =
          OneDnnStagedInput::make(onednn_engine(), user.get_desc(), inner.get_desc(), d, plain);
  }
  // The primitive's input, from the caller's buffer p.
  dnnl::memory& in(dnnl::stream& s, void const* p) {
    user.set_data_handle(const_cast<void*>(p));
    if (staged)
      staged->run(s, static_cast<float const*>(p),
                  static_cast<std::uint16_t*>(inner.get_data_handle()));
    else if (reordered)
      convert.execute(s, user, inner);
    return inner;
  }
  // The primitive's output; finish() moves it to the caller's buffer p.
  dnnl::memory& out(void* p) {
    user.set_data_handle(p);
    return inner;
  }
  void finish(dnnl::stream& s) {
    if (reordered)
      convert.execute(s, inner, user);
  }
};

// Name of a oneDNN instruction-set level, for messages.
inline char const* onednn_isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
  case dnnl_cpu_isa_sse41:
    return "sse41";
  case dnnl_cpu_isa_avx:
    return "avx";
  case dnnl_cpu_isa_avx2:
    return "avx2";
  case dnnl_cpu_isa_avx2_vnni:
    return "avx2_vnni";
#if DNNL_VERSION_MAJOR < 3 // Xeon Phi: gone from oneDNN 3
  case dnnl_cpu_isa_avx512_mic:
    return "avx512_mic";
  case dnnl_cpu_isa_avx512_mic_4ops:
    return "avx512_mic_4ops";
#endif
  case dnnl_cpu_isa_avx512_core:
    return "avx512_core";
  case dnnl_cpu_isa_avx512_core_vnni:
    return "avx512_core_vnni";
  case dnnl_cpu_isa_avx512_core_bf16:
    return "avx512_core_bf16";
  case dnnl_cpu_isa_avx512_core_amx:
    return "avx512_core_amx";
  default:
    return "unknown";
  }
}

// Whether oneDNN runs bf16 matmuls and convolutions with native instructions
// (AVX512-BF16, or AMX which implies it). The ISA levels are bit masks, each
// containing the ones below it. Without them oneDNN would emulate bf16 with
// integer shifts around fp32 FMAs: slower than fp32, so Telar refuses.
inline bool bf16_isa_available() {
  static bool const native = [] {
    unsigned const isa = unsigned(dnnl_get_effective_cpu_isa());
    unsigned const need = unsigned(dnnl_cpu_isa_avx512_core_bf16);
    return (isa & need) == need;
  }();
  return native && !bf16_isa_hidden();
}

// true: run bf16. false: run fp32 (fallback allowed, warned once). Throws
// when the instructions are missing and no fallback was asked for.
inline bool bf16_check_isa(char const* who) {
  if (bf16_isa_available())
    return true;
  std::string const found = bf16_isa_hidden() ? std::string("hidden by TELAR_TEST_HIDE_BF16")
                                              : std::string("oneDNN's effective ISA is ") +
                                                    onednn_isa_name(dnnl_get_effective_cpu_isa());
  static std::once_flag warned;
  return bf16_fall_back(
      who,
      {"no AVX512-BF16/AMX instructions",
       "this CPU lacks the AVX512-BF16 (avx512_core_bf16) or AMX instruction set (",
       "telar::OneDnnGemm, telar::OneDnnConv"},
      found, warned);
}

} // namespace detail
} // namespace telar

#endif // TELAR_HAVE_ONEDNN
