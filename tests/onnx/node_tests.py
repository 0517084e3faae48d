#!/usr/bin/python3
"""ONNX's node conformance tests (onnx.backend.test) for every operator
Telar's importer lists as supported, converted as a training importer reads
a model: the first graph input is the data, every other input becomes an
initializer with the test's value; a rank-1 element-wise case gets a batch
axis of 1, and a model of an opset before 9 (Telar's first) is raised to 13
by onnx.version_converter where it can be. Debian's python3-onnx ships the test
generators but not their data, so the cases are generated here.

Writes into OUT_DIR, per case, <case>/model.onnx, <case>/x.bin and
<case>/y.bin (float32; the first output), and cases.txt with one line per
case: "<case> <op> <rows> <last>" (rows of x, extent of the output's last
axis) or "<case> <op> skip <reason>" for a case whose expected output is
random (Dropout with training_mode and a ratio > 0).
Run: /usr/bin/python3 node_tests.py OUT_DIR
"""
import os
import sys
import warnings

import numpy as np

warnings.simplefilter("ignore")
for alias, t in (("float", float), ("int", int), ("bool", bool), ("object", object), ("str", str)):
    if alias not in np.__dict__:  # removed in numpy 1.24; the generators of onnx 1.12 use them
        setattr(np, alias, t)

import onnx  # noqa: E402
import onnx.numpy_helper  # noqa: E402
import onnx.version_converter  # noqa: E402
from onnx.backend.test.case import node  # noqa: E402

# As telar::onnx::detail::supported_ops() (import_graph.hpp).
SUPPORTED = {"Gemm", "MatMul", "Relu", "Gelu", "Sigmoid", "Tanh", "Clip", "LeakyRelu", "Elu",
             "HardSigmoid", "HardSwish", "Conv", "ConvTranspose", "BatchNormalization",
             "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Resize",
             "Upsample", "Flatten", "Reshape", "Add", "Mul", "Concat", "Pad", "Identity",
             "Dropout", "Softmax", "LogSoftmax", "Transpose", "Slice", "ReduceMean", "Sub", "Div",
             "Gather", "Where", "Exp", "Sqrt", "Erf", "Pow", "Split", "Equal",
             "LayerNormalization"}
# Element-wise: a rank-1 case ([n], no batch axis) gets a batch axis of 1.
ELEMENTWISE = {"Relu", "Gelu", "Sigmoid", "Tanh", "Clip", "LeakyRelu", "Elu", "HardSigmoid",
               "HardSwish", "Exp", "Sqrt", "Erf", "Pow"}
MIN_OPSET = 7  # telar::onnx::detail::min_opset


def convert(case, out, lines):
    nodes = [n for n in case.model.graph.node if n.op_type != "Constant"]
    if len(nodes) != 1 or nodes[0].op_type not in SUPPORTED:
        return  # another operator, or an expanded (function body) version
    op = nodes[0].op_type
    inputs, outputs = case.data_sets[0]
    g = case.model.graph
    if op == "Dropout" and len(inputs) > 2 and bool(inputs[2]) and (
            len(inputs) < 2 or float(inputs[1]) != 0.0):
        lines.append(f"{case.name} {op} skip random mask (training_mode true, ratio > 0)")
        return
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    graph = model.graph
    keep = graph.input[0]
    for vi, v in list(zip(g.input, inputs))[1:]:
        if vi.name:
            graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(v), vi.name))
    del graph.input[1:]
    graph.input[0].CopyFrom(keep)
    # A node of several outputs (Split; LayerNormalization's Y, Mean and
    # InvStdDev; MaxPool's Indices): one case per output, the others left
    # unread, since Telar's models have one output.
    names = [o.name for o in graph.output]
    for k, (name, y) in enumerate(zip(names, outputs)):
        single = onnx.ModelProto()
        single.CopyFrom(model)
        del single.graph.output[:]
        single.graph.output.append(graph.output[k])
        suffix = f"__{name}" if len(names) > 1 else ""
        if k == 0 and op == "BatchNormalization" and any(
                a.name == "training_mode" and a.i == 1 for a in nodes[0].attribute):
            lines.append(f"{case.name}{suffix} {op} skip batch statistics (training_mode 1; "
                         "the harness compares outputs in evaluation mode)")
            continue
        write_case(single, case.name + suffix, op, np.asarray(inputs[0]), np.asarray(y), out,
                   lines)


def write_case(model, name, op, x, y, out, lines):
    graph = model.graph
    if op in ELEMENTWISE and x.ndim == 1:
        for vi in (graph.input[0], graph.output[0]):
            dims = vi.type.tensor_type.shape.dim
            dims.insert(0, onnx.TensorShapeProto.Dimension(dim_value=1))
        x, y = x[None], y[None]
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset < MIN_OPSET:  # an operator unchanged since: ONNX's own converter
        try:
            model = onnx.version_converter.convert_version(model, 13)
        except Exception:  # noqa: BLE001 - left as it is: the importer refuses the opset
            pass
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    onnx.save(model, os.path.join(d, "model.onnx"))
    np.ascontiguousarray(x.astype(np.float32)).tofile(os.path.join(d, "x.bin"))
    np.ascontiguousarray(y.astype(np.float32)).tofile(os.path.join(d, "y.bin"))
    rows = x.shape[0] if x.ndim > 0 else 1
    last = y.shape[-1] if y.ndim > 0 else 1
    lines.append(f"{name} {op} {rows} {last}")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "node_tests"
    os.makedirs(out, exist_ok=True)
    lines, seen = [], {}
    for case in sorted(node.collect_testcases(None), key=lambda c: c.name):
        if case.model is not None and case.data_sets:
            seen[case.name] = seen.get(case.name, 0) + 1
            if seen[case.name] > 1:  # onnx 1.12 generates two test_resize_tf_crop_and_resize
                case.name = f"{case.name}_{seen[case.name]}"
            convert(case, out, lines)
    with open(os.path.join(out, "cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} node tests written to {out}")


if __name__ == "__main__":
    main()
