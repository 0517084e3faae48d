#!/usr/bin/env python3
"""Reference values of test_conv.cpp's "match PyTorch" cases (PyTorch 1.13).

Each case fills x, W and b by closed formulas (the same in the C++ test),
runs PyTorch's grouped or transposed convolution in double and prints the
output's shape and the checksum sum_i y[i] * ((i % 7) - 3), which depends on
every value's position. Run: python3 tests/core/conv_reference.py
"""
import math

import torch
import torch.nn.functional as F


def filled(shape, f):
    n = math.prod(shape)
    return torch.tensor([f(i) for i in range(n)], dtype=torch.float64).reshape(shape)


def checksum(y):
    flat = y.reshape(-1)
    return sum(float(flat[i]) * ((i % 7) - 3) for i in range(flat.numel()))


def run(name, transposed, dims, cin, cout, k, spatial, stride, pad, dil, groups, outpad=0):
    x = filled([2, cin] + spatial, lambda i: math.sin(0.37 * i + 0.1))
    if transposed:
        wshape = [cin, cout // groups] + [k] * dims
    else:
        wshape = [cout, cin // groups] + [k] * dims
    w = filled(wshape, lambda i: 0.5 * math.cos(0.23 * i))
    b = filled([cout], lambda i: 0.1 * i - 0.2)
    if transposed:
        f = F.conv_transpose2d if dims == 2 else F.conv_transpose3d
        y = f(x, w, b, stride, pad, outpad, groups, dil)
    else:
        f = F.conv2d if dims == 2 else F.conv3d
        y = f(x, w, b, stride, pad, dil, groups)
    print(f'{{"{name}", {list(y.shape[1:])}, {checksum(y)!r}}},')


torch.set_printoptions(precision=17)
run("grouped 2-D", False, 2, 4, 6, 3, [5, 6], 1, 1, 1, 2)
run("depthwise 2-D s2", False, 2, 3, 6, 3, [7, 6], 2, 1, 1, 3)
run("grouped 3-D", False, 3, 4, 2, 2, [3, 4, 3], 1, 0, 1, 2)
run("transposed 2-D s2 p1 op1", True, 2, 3, 4, 3, [4, 5], 2, 1, 1, 1, 1)
run("transposed 2-D grouped d2", True, 2, 4, 6, 2, [3, 4], 1, 0, 2, 2)
run("transposed 2-D s2 d3 op2", True, 2, 2, 3, 2, [3, 3], 2, 1, 3, 1, 2)
run("transposed 3-D s2 op1", True, 3, 2, 3, 2, [2, 3, 2], 2, 0, 1, 1, 1)
