#!/usr/bin/python3
"""Broken ONNX graphs for the error catalogue's onnx_train rows (docs/errors.md).

Each takes Fashion-MNIST's [N, 1, 28, 28] and is wrong in one way, written
with the onnx package alone (no PyTorch: these graphs cannot be exported
from a working model) into OUT_DIR:
  cat_concat.onnx  a Concat joining [2, 26, 26] and [2, 28, 28] (two Convs)
  cat_resize.onnx  a Resize by 1.5 (Telar upsamples by integer factors)
  cat_cycle.onnx   'a' = Relu('b') and 'b' = Sigmoid('a'): a cycle
  cat_bn.onnx      Flatten, Gemm 784 -> 16, BatchNormalization, Relu, Gemm 16 -> 10:
                   a valid model, refused when trained on 1-sample micro-batches
  cat_where.onnx   a Where (masked_fill) whose constant mask [3, 3] is not the shape of the
                   sample's last axes [28, 28]
  cat_bias.onnx    a Sub of a constant [2, 1, 28, 28] that spans the batch (a Bias is
                   broadcast over each sample)
  cat_scale.onnx   a Mul by a constant [2, 1, 28, 28] that spans the batch (a Multiplier is
                   broadcast over each sample too)
  cat_div_zero.onnx  a Div by a constant [1, 28, 1] holding a zero (a divisor trained as such)
Run: /usr/bin/python3 make_bad_onnx.py OUT_DIR
"""
import os
import sys

import numpy as np
import onnx
from onnx import helper as h
from onnx import numpy_helper

RNG = np.random.default_rng(11)


def init(name, *shape):
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32) * 0.1, name)


def save(out, name, nodes, inits, output_shape=None):
    x = h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 1, 28, 28])
    y = h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, output_shape)
    graph = h.make_graph(nodes, name, [x], [y], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    onnx.save(model, os.path.join(out, name + ".onnx"))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    save(out, "cat_concat",
         [h.make_node("Conv", ["x", "w3"], ["a"], name="conv3", kernel_shape=[3, 3]),
          h.make_node("Conv", ["x", "w1"], ["b"], name="conv1", kernel_shape=[1, 1]),
          h.make_node("Concat", ["a", "b"], ["y"], name="cat", axis=1)],
         [init("w3", 2, 1, 3, 3), init("w1", 2, 1, 1, 1)])
    empty = numpy_helper.from_array(np.zeros(0, np.float32), "roi")
    scales = numpy_helper.from_array(np.array([1, 1, 1.5, 1.5], np.float32), "scales")
    save(out, "cat_resize", [h.make_node("Resize", ["x", "roi", "scales"], ["y"], name="up")],
         [empty, scales])
    save(out, "cat_cycle",
         [h.make_node("Relu", ["b"], ["a"], name="a"),
          h.make_node("Sigmoid", ["a"], ["b"], name="b"),
          h.make_node("Add", ["x", "b"], ["y"], name="sum")], [])
    ones, zeros = np.ones(16, np.float32), np.zeros(16, np.float32)
    bn = [numpy_helper.from_array(v, n) for v, n in
          ((ones, "gamma"), (zeros, "beta"), (zeros, "mean"), (ones, "var"))]
    save(out, "cat_bn",
         [h.make_node("Flatten", ["x"], ["f"], name="flat"),
          h.make_node("Gemm", ["f", "w1", "b1"], ["g"], name="fc1", transB=1),
          h.make_node("BatchNormalization", ["g", "gamma", "beta", "mean", "var"], ["n"],
                      name="bn"),
          h.make_node("Relu", ["n"], ["r"], name="relu"),
          h.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="fc2", transB=1)],
         [init("w1", 16, 784), init("b1", 16), init("w2", 10, 16), init("b2", 10)] + bn,
         ["N", 10])
    mask = numpy_helper.from_array(np.triu(np.ones((3, 3), bool), 1), "causal")
    fill = numpy_helper.from_array(np.array(-np.inf, np.float32), "fill")
    save(out, "cat_where", [h.make_node("Where", ["causal", "fill", "x"], ["y"], name="mask")],
         [mask, fill])
    save(out, "cat_bias", [h.make_node("Sub", ["x", "shift"], ["y"], name="shift")],
         [init("shift", 2, 1, 28, 28)])
    save(out, "cat_scale", [h.make_node("Mul", ["x", "gain"], ["y"], name="gain")],
         [init("gain", 2, 1, 28, 28)])
    std = np.ones((1, 28, 1), np.float32)
    std[0, 5, 0] = 0
    save(out, "cat_div_zero", [h.make_node("Div", ["x", "std"], ["y"], name="norm")],
         [numpy_helper.from_array(std, "std")])


if __name__ == "__main__":
    main()
