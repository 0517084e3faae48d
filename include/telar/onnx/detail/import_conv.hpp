#pragma once
// Convolutions, pooling, padding, BatchNormalization and Resize/Upsample: members of
// telar::onnx::detail::GraphReader (import_graph.hpp, which includes this
// file at its end).
#include <telar/onnx/detail/import_graph.hpp>

namespace telar::onnx::detail {

// Resize (opset 11+: X, roi, scales, sizes; 10: X, scales) and Upsample
// (X, scales): upsampling by integer factors, nearest or linear.
template <class T, class M>
void GraphReader<T, M>::resize(::onnx::NodeProto const& n) {
  bool const up = n.op_type() == "Upsample";
  Shape const& s = shape_of(n.input(0));
  if (s.rank < 2 || s.rank > 4)
    fail(n, "needs an input [C, L], [C, H, W] or [C, D, H, W], got " + s.str());
  std::string const mode = string_attr(n, "mode", "nearest");
  std::string ct = string_attr(n, "coordinate_transformation_mode", "half_pixel");
  std::string nm = string_attr(n, "nearest_mode", "round_prefer_floor");
  if (up || opset_ < 11) { // Upsample and Resize-10: asymmetric, nearest rounds down
    ct = "asymmetric";
    nm = "floor";
  }
  for (char const* a : {"axes", "antialias"})
    if (find_attr(n, a) && !(std::string(a) == "antialias" && int_attr(n, a, 0) == 0))
      fail(n, std::string("attribute ") + a + " is not supported");
  if (string_attr(n, "keep_aspect_ratio_policy", "stretch") != "stretch")
    fail(n, "attribute keep_aspect_ratio_policy = '" +
                string_attr(n, "keep_aspect_ratio_policy", "") + "' is not supported (stretch)");
  bool const linear = mode == "linear" || mode == "bilinear" || mode == "trilinear";
  if (!linear && mode != "nearest")
    fail(n, "attribute mode = '" + mode + "' is not supported (nearest, linear)");
  bool align = false;
  if (linear) {
    if (ct == "align_corners")
      align = true;
    else if (ct != "half_pixel" && ct != "pytorch_half_pixel")
      fail(n, std::string(up ? "Upsample"
                             : "attribute coordinate_transformation_mode = '" + ct + "'") +
                  (up ? "'s linear mode (asymmetric coordinates)" : "") +
                  " is not supported with linear: half_pixel or pytorch_half_pixel (PyTorch's "
                  "align_corners=False) and align_corners (align_corners=True)");
  } else if (!((ct == "half_pixel" || ct == "pytorch_half_pixel") &&
               (nm == "round_prefer_floor" || nm == "round_prefer_ceil")) &&
             !(ct == "asymmetric" && nm == "floor"))
    fail(n, "attributes coordinate_transformation_mode = '" + ct + "' and nearest_mode = '" + nm +
                "' are not supported with nearest (asymmetric with floor, as PyTorch exports, "
                "or half_pixel with round_prefer_floor/ceil: each output copies input i / factor)");
  int const si = up || opset_ < 11 ? 1 : 2;
  std::size_t const rank = s.rank + 1, sp = s.rank - 1;
  auto const* st =
      n.input_size() > si && !n.input(si).empty() ? index_.constant(n.input(si)) : nullptr;
  if (n.input_size() > si && !n.input(si).empty() && !st)
    fail(n, "its scales '" + n.input(si) + "' must be a constant");
  std::vector<std::size_t> factor(sp), size(sp);
  bool by_size = false;
  std::vector<float> attr; // Upsample before opset 9: the scales an attribute
  if (auto const* a = up && opset_ < 9 ? find_attr(n, "scales") : nullptr)
    attr.assign(a->floats().begin(), a->floats().end());
  if ((st && count(*st) > 0) || !attr.empty()) {
    auto const v = st ? floats_of(*st) : attr;
    if (v.size() != rank)
      fail(n, "its scales have " + std::to_string(v.size()) + " entries for an input of rank " +
                  std::to_string(rank));
    if (v[0] != 1.f || v[1] != 1.f)
      fail(n, "its scales resize the batch or channel axis (" + std::to_string(v[0]) + ", " +
                  std::to_string(v[1]) + "); only spatial axes are supported");
    for (std::size_t d = 0; d < sp; ++d) {
      if (!(v[d + 2] >= 1.f) || v[d + 2] != std::floor(v[d + 2]))
        fail(n, "its scales: factor " + std::to_string(v[d + 2]) + " of spatial axis " +
                    std::to_string(d) + " is not supported (integer upsampling factors only)");
      factor[d] = std::size_t(v[d + 2]);
    }
  } else {
    auto const* zt = !up && opset_ >= 11 && n.input_size() > 3 && !n.input(3).empty()
                         ? index_.constant(n.input(3))
                         : nullptr;
    if (!zt)
      fail(n, "needs constant scales or sizes");
    auto const v = ints_of(*zt);
    if (v.size() != rank || v[1] != std::int64_t(s[0]))
      fail(n, "its sizes must have " + std::to_string(rank) + " entries and keep the channels (" +
                  std::to_string(s[0]) + ")");
    for (std::size_t d = 0; d < sp; ++d) {
      std::size_t const in = s[d + 1];
      if (v[d + 2] < std::int64_t(in))
        fail(n, "its sizes shrink spatial axis " + std::to_string(d) +
                    " (downsampling is not supported)");
      size[d] = std::size_t(v[d + 2]);
      if (!linear && size[d] % in != 0)
        fail(n, "its sizes: " + std::to_string(size[d]) + " is not a multiple of " +
                    std::to_string(in) + " (nearest: integer factors only)");
      factor[d] = size[d] / in;
    }
    by_size = linear;
  }
  UpsampleMode const um = linear ? UpsampleMode::linear : UpsampleMode::nearest;
  if (by_size)
    return emit(n, Upsample<T, M>::to_size(size, um, align), n.input(0));
  emit(n, Upsample<T, M>(factor, um, align), n.input(0));
}

template <class T, class M>
void GraphReader<T, M>::pad(::onnx::NodeProto const& n) {
  std::vector<std::int64_t> p = ints_attr(n, "pads", {});
  if (n.input_size() > 1 && !n.input(1).empty()) {
    auto const* t = index_.constant(n.input(1));
    if (!t)
      fail(n, "its pads must be a constant");
    p = ints_of(*t);
  }
  for (auto v : p)
    if (v != 0)
      fail(n, "only a Pad of zero width is supported (put padding in the Conv or pool)");
  alias(n, n.input(0));
}

// An ints attribute of \p dims entries, each >= \p least.
template <class T, class M>
std::vector<std::size_t> GraphReader<T, M>::extents(::onnx::NodeProto const& n, char const* name,
                                                    int dims, std::int64_t def,
                                                    std::int64_t least) {
  auto const v = ints_attr(n, name, std::vector<std::int64_t>(std::size_t(dims), def));
  bool ok = v.size() == std::size_t(dims);
  for (auto e : v)
    ok = ok && e >= least;
  if (!ok)
    fail(n, std::string("attribute ") + name + " must have " + std::to_string(dims) +
                " entries >= " + std::to_string(least) + " (one per spatial axis)");
  return std::vector<std::size_t>(v.begin(), v.end());
}

// Symmetric padding per spatial axis from pads or auto_pad, or a refusal
// naming the attribute (Telar's layers pad both sides of an axis equally).
template <class T, class M>
std::vector<std::size_t>
GraphReader<T, M>::pads(::onnx::NodeProto const& n, Shape const& in,
                        std::vector<std::size_t> const& k, std::vector<std::size_t> const& stride,
                        std::vector<std::size_t> const& dil, bool transposed) {
  int const dims = int(k.size());
  std::string const ap = string_attr(n, "auto_pad", "NOTSET");
  std::vector<std::size_t> p(k.size(), 0);
  if (ap == "VALID")
    return p;
  if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
    if (transposed)
      fail(n, "attribute auto_pad = " + ap + " is not supported on ConvTranspose (give pads)");
    for (int d = 0; d < dims; ++d) {
      std::size_t const x = in[std::size_t(d + 1)], s = stride[std::size_t(d)];
      std::size_t const out = (x + s - 1) / s;
      std::size_t const span = (k[std::size_t(d)] - 1) * dil[std::size_t(d)] + 1;
      std::size_t const total = (out - 1) * s + span > x ? (out - 1) * s + span - x : 0;
      if (total % 2 != 0)
        fail(n, "attribute auto_pad = " + ap + " pads spatial axis " + std::to_string(d) + " by " +
                    std::to_string(total) +
                    " in all, one more on one side: asymmetric padding is not supported "
                    "(Telar's layers pad both sides equally)");
      p[std::size_t(d)] = total / 2;
    }
    return p;
  }
  if (ap != "NOTSET")
    fail(n, "attribute auto_pad = '" + ap +
                "' is not valid (NOTSET, SAME_UPPER, SAME_LOWER, "
                "VALID)");
  auto const v = ints_attr(n, "pads", std::vector<std::int64_t>(std::size_t(2 * dims), 0));
  if (v.size() != std::size_t(2 * dims))
    fail(n, "attribute pads must have " + std::to_string(2 * dims) + " entries");
  for (int d = 0; d < dims; ++d) {
    auto const b = v[std::size_t(d)], e = v[std::size_t(d + dims)];
    if (b < 0 || b != e)
      fail(n, "attribute pads: asymmetric padding (" + std::to_string(b) + " before, " +
                  std::to_string(e) + " after spatial axis " + std::to_string(d) +
                  ") is not supported (Telar's layers pad both sides equally)");
    p[std::size_t(d)] = std::size_t(b);
  }
  return p;
}

template <class T, class M>
template <std::size_t D>
std::array<std::size_t, D> GraphReader<T, M>::arr(std::vector<std::size_t> const& v) {
  std::array<std::size_t, D> a{};
  std::copy(v.begin(), v.end(), a.begin());
  return a;
}

template <class T, class M>
auto GraphReader<T, M>::conv_attrs(::onnx::NodeProto const& n, ::onnx::TensorProto const& w,
                                   bool transposed) -> ConvAttrs {
  ConvAttrs a;
  a.dims = w.dims_size() - 2;
  if (a.dims == 1 && transposed)
    fail(n, "1-D transposed convolutions (weight '" + w.name() +
                "' of rank 3) are not supported: Telar has 2-D and 3-D ones");
  if (a.dims < 1 || a.dims > 3)
    fail(n, "its weight '" + w.name() + "' has rank " + std::to_string(w.dims_size()) +
                "; 1-D, 2-D and 3-D convolutions are supported");
  std::int64_t const g = int_attr(n, "group", 1);
  if (g < 1)
    fail(n, "attribute group = " + std::to_string(g) + " must be positive");
  a.groups = std::size_t(g);
  for (int d = 0; d < a.dims; ++d)
    a.k.push_back(std::size_t(w.dims(d + 2)));
  for (auto e : a.k)
    a.volume *= e;
  if (find_attr(n, "kernel_shape") && extents(n, "kernel_shape", a.dims, 1) != a.k)
    fail(n, "attribute kernel_shape does not match weight '" + w.name() + "'");
  a.stride = extents(n, "strides", a.dims, 1);
  a.dil = extents(n, "dilations", a.dims, 1);
  Shape const& s = shape_of(n.input(0));
  if (s.rank != a.dims + 1)
    fail(n, "a " + std::to_string(a.dims) + "-D convolution needs inputs [C, " +
                (a.dims == 1   ? "L"
                 : a.dims == 2 ? "H, W"
                               : "D, H, W") +
                "], got " + s.str());
  a.pad = pads(n, s, a.k, a.stride, a.dil, transposed);
  if (a.dims == 1) // a Conv2D over [C, 1, L] with a 1 x k window (conv())
    for (auto* v : {&a.k, &a.stride, &a.dil, &a.pad})
      v->insert(v->begin(), v == &a.pad ? 0 : 1);
  return a;
}

template <class T, class M>
void GraphReader<T, M>::conv(::onnx::NodeProto const& n) {
  auto const& w = initializer(n, 1, "weight");
  ConvAttrs const a = conv_attrs(n, w, false);
  std::size_t const out = std::size_t(w.dims(0)), in = std::size_t(w.dims(1)) * a.groups;
  if (shape_of(n.input(0))[0] != in)
    fail(n, "weight '" + w.name() + "' takes " + std::to_string(in) + " channels (group " +
                std::to_string(a.groups) + "); the input is " + shape_of(n.input(0)).str());
  bool const bias = n.input_size() > 2 && !n.input(2).empty();
  // 1-D: [C, L] read as [C, 1, L] (a Rearrange before the bindings, which
  // go with the next node), the same weight values as [out, in / g, 1, k].
  Shape const& s = shape_of(n.input(0));
  std::string const x = a.dims == 1 ? n.output(0) + "#2d" : n.input(0);
  if (a.dims == 1)
    emit(n, Rearrange<T, M>::reshape(s, Shape{s[0], 1, s[1]}), n.input(0), x);
  bind(n, 1, "weight", "weight", false, out, in / a.groups * a.volume);
  if (bias)
    bind(n, 2, "bias", "bias", false, out, 1);
  if (a.dims <= 2) {
    Conv2D<T, M> conv2d(in, out, arr<2>(a.k), arr<2>(a.stride), arr<2>(a.pad), bias, arr<2>(a.dil),
                        a.groups);
    if (a.dims == 2)
      return emit(n, std::move(conv2d), x);
    emit(n, std::move(conv2d), x, n.output(0) + "#conv");
    Shape const y = shape_of(n.output(0) + "#conv");
    return emit(n, Rearrange<T, M>::reshape(y, Shape{y[0], y[2]}), n.output(0) + "#conv");
  }
  emit(n,
       Conv3D<T, M>(in, out, arr<3>(a.k), arr<3>(a.stride), arr<3>(a.pad), bias, arr<3>(a.dil),
                    a.groups),
       n.input(0));
}

template <class T, class M>
void GraphReader<T, M>::conv_transpose(::onnx::NodeProto const& n) {
  auto const& w = initializer(n, 1, "weight");
  ConvAttrs const a = conv_attrs(n, w, true);
  if (find_attr(n, "output_shape"))
    fail(n, "attribute output_shape is not supported (give pads and output_padding, as "
            "PyTorch exports)");
  auto const opad = extents(n, "output_padding", a.dims, 0, 0);
  std::size_t const in = std::size_t(w.dims(0)), out = std::size_t(w.dims(1)) * a.groups;
  if (shape_of(n.input(0))[0] != in)
    fail(n, "weight '" + w.name() + "' takes " + std::to_string(in) + " channels; the input is " +
                shape_of(n.input(0)).str());
  bool const bias = n.input_size() > 2 && !n.input(2).empty();
  bind(n, 1, "weight", "weight", false, in, out / a.groups * a.volume);
  if (bias)
    bind(n, 2, "bias", "bias", false, out, 1);
  if (a.dims == 2)
    return emit(n,
                ConvTranspose2D<T, M>(in, out, arr<2>(a.k), arr<2>(a.stride), arr<2>(a.pad),
                                      arr<2>(opad), bias, arr<2>(a.dil), a.groups),
                n.input(0));
  emit(n,
       ConvTranspose3D<T, M>(in, out, arr<3>(a.k), arr<3>(a.stride), arr<3>(a.pad), arr<3>(opad),
                             bias, arr<3>(a.dil), a.groups),
       n.input(0));
}

// Scale and bias are parameters; the running mean and variance buffers,
// trained as PyTorch does (batch statistics in training mode).
template <class T, class M>
void GraphReader<T, M>::batch_norm(::onnx::NodeProto const& n) {
  if (n.input_size() != 5)
    fail(n, "needs 5 inputs (X, scale, B, input_mean, input_var)");
  if (int_attr(n, "spatial", 1) != 1) // opsets 7 and 8
    fail(n, "attribute spatial = 0 (statistics per position) is not supported: one mean and "
            "variance per channel, as PyTorch's BatchNorm");
  for (int o = 1; o < n.output_size(); ++o)
    if (!n.output(o).empty() && !index_.readers(n.output(o)).empty())
      fail(n, "its output '" + n.output(o) +
                  "' (running statistics) is read by another node; Telar keeps them in the "
                  "layer (export with training=TrainingMode.EVAL or PRESERVE)");
  Shape const& s = shape_of(n.input(0));
  std::size_t const c = s[0];
  double const eps = double(float_attr(n, "epsilon", 1e-5f));
  double const momentum = 1.0 - double(float_attr(n, "momentum", 0.9f)); // ONNX: of the old
  bind(n, 1, "scale", "weight", false, c, 1);
  bind(n, 2, "bias", "bias", false, c, 1);
  bind(n, 3, "running mean", "running_mean", false, c, 1, true);
  bind(n, 4, "running variance", "running_var", false, c, 1, true);
  emit(n, BatchNorm<T, M, SyncStats>(c, eps, momentum), n.input(0));
}

template <class T, class M>
void GraphReader<T, M>::pool(::onnx::NodeProto const& n) {
  bool const max = n.op_type() == "MaxPool";
  int const dims = int(ints_attr(n, "kernel_shape", {}).size());
  if (dims != 2 && dims != 3)
    fail(n, "attribute kernel_shape has " + std::to_string(dims) +
                " entries: 2-D and 3-D pooling are supported");
  Shape const& in = shape_of(n.input(0));
  std::vector<std::size_t> const ones(std::size_t(dims), 1);
  auto const k = extents(n, "kernel_shape", dims, 1), s = extents(n, "strides", dims, 1);
  auto const p = pads(n, in, k, s, ones, false);
  auto same = [](std::vector<std::size_t> const& v) {
    return std::all_of(v.begin(), v.end(), [&](std::size_t e) { return e == v[0]; });
  };
  if (!same(k) || !same(s) || !same(p))
    fail(n, "attributes kernel_shape, strides and pads must be equal along every axis "
            "(Telar's pools are square or cubic)");
  if (2 * p[0] > k[0])
    fail(n, "attribute pads: " + std::to_string(p[0]) + " is more than half the window " +
                std::to_string(k[0]) + " (as PyTorch, Telar's pools pad at most kernel / 2)");
  if (extents(n, "dilations", dims, 1) != ones) // AveragePool has them from opset 19
    fail(n, "attribute dilations is not supported (only 1)");
  if (max && int_attr(n, "storage_order", 0) != 0)
    fail(n, "attribute storage_order = 1 is not supported");
  if (n.output_size() > 1 && !n.output(1).empty())
    fail(n, "its second output (Indices) is not supported");
  bool const ceil = int_attr(n, "ceil_mode", 0) != 0;
  if (ceil) // PyTorch drops a last window that starts in the right padding; ONNX keeps it
    for (int d = 0; d < dims; ++d) {
      std::size_t const x = in[std::size_t(d + 1)];
      if (x + 2 * p[0] < k[0])
        break; // output_shape refuses it
      std::size_t const o = (x + 2 * p[0] - k[0] + s[0] - 1) / s[0] + 1;
      if ((o - 1) * s[0] >= x + p[0])
        fail(n, "attribute ceil_mode = 1 with a last window that starts in the padding is "
                "not supported (PyTorch drops that window, ONNX keeps it)");
    }
  bool const count_pad = int_attr(n, "count_include_pad", 0) != 0;
  if (dims == 2) {
    if (max)
      return emit(n, MaxPool2D<T, M>(k[0], s[0], p[0], ceil), n.input(0));
    return emit(n, AvgPool2D<T, M>(k[0], s[0], p[0], ceil, count_pad), n.input(0));
  }
  if (max)
    return emit(n, MaxPool3D<T, M>(k[0], s[0], p[0], ceil), n.input(0));
  emit(n, AvgPool3D<T, M>(k[0], s[0], p[0], ceil, count_pad), n.input(0));
}

} // namespace telar::onnx::detail
