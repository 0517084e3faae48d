#!/usr/bin/env python3
"""Prints the PyTorch 1.13 reference values hard-coded in test_layer_zoo.cpp.

Run with /usr/bin/python3 (which has torch); the numbers are pasted into the
test, so the test itself needs no Python.
"""
import torch
import torch.nn.functional as F

torch.set_printoptions(precision=17)


def show(name, t):
    print(name, "{" + ", ".join(repr(float(v)) for v in t.flatten()) + "}")


def activations():
    # The kinks of every activation, and a point on either side.
    x = torch.tensor([-4.0, -3.0, -1.5, -1.0, 0.0, 0.5, 2.0, 3.0, 6.0, 7.0], dtype=torch.float64,
                     requires_grad=True)
    fns = {
        "ReLU6": F.relu6,
        "Clip(-1,2)": lambda v: torch.clamp(v, -1.0, 2.0),
        "LeakyReLU(0.01)": lambda v: F.leaky_relu(v, 0.01),
        "LeakyReLU(0.2)": lambda v: F.leaky_relu(v, 0.2),
        "ELU(1)": F.elu,
        "ELU(0.5)": lambda v: F.elu(v, 0.5),
        "SiLU": F.silu,
        "HardSwish": F.hardswish,
        "HardSigmoid": F.hardsigmoid,
        "HardSigmoid(0.2,0.5)": lambda v: torch.clamp(0.2 * v + 0.5, 0.0, 1.0),
    }
    for name, f in fns.items():
        y = f(x)
        (g,) = torch.autograd.grad(y.sum(), x)
        show(name + " y", y.detach())
        show(name + " dy/dx", g)


def sample(shape):
    """x[i] = 3 sin(1.7 i), the input the C++ test builds (one sample)."""
    n = 1
    for d in shape:
        n *= d
    i = torch.arange(n, dtype=torch.float64)
    return (3 * torch.sin(1.7 * i)).reshape(1, *shape)


def pooling():
    cases = [
        ("max2d k3 s2 p1 ceil [2,6,6]", (2, 6, 6), lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True)),
        ("max2d k2 s2 ceil [1,5,5]", (1, 5, 5), lambda x: F.max_pool2d(x, 2, 2, 0, ceil_mode=True)),
        ("max2d k2 s2 p1 ceil [1,5,5] (last window dropped)", (1, 5, 5),
         lambda x: F.max_pool2d(x, 2, 2, 1, ceil_mode=True)),
        ("avg2d k3 s2 p1 ceil [1,6,6]", (1, 6, 6),
         lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True)),
        ("avg2d k3 s2 p1 ceil nopad [1,6,6]", (1, 6, 6),
         lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)),
        ("avg2d k2 s2 p1 ceil [1,5,5]", (1, 5, 5),
         lambda x: F.avg_pool2d(x, 2, 2, 1, ceil_mode=True)),
        ("max3d k2 s2 ceil [2,3,5,4]", (2, 3, 5, 4),
         lambda x: F.max_pool3d(x, 2, 2, 0, ceil_mode=True)),
        ("avg3d k3 s2 p1 ceil nopad [1,4,5,5]", (1, 4, 5, 5),
         lambda x: F.avg_pool3d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)),
        ("avg3d k2 [1,4,4,4]", (1, 4, 4, 4), lambda x: F.avg_pool3d(x, 2)),
        ("globalmax [3,4,5]", (3, 4, 5), lambda x: torch.amax(x, dim=(2, 3))),
        ("globalmax [2,3,3,3]", (2, 3, 3, 3), lambda x: torch.amax(x, dim=(2, 3, 4))),
    ]
    for name, shape, f in cases:
        y = f(sample(shape))
        print(name, list(y.shape[1:]))
        show("  y", y)


def upsample():
    cases = [
        ("nearest x(2,3) [2,3,2]", (2, 3, 2), dict(scale_factor=(2, 3), mode="nearest")),
        ("nearest size (6,4) [1,3,2]", (1, 3, 2), dict(size=(6, 4), mode="nearest")),
        ("nearest x(2,1,2) [1,2,2,3]", (1, 2, 2, 3), dict(scale_factor=(2, 1, 2), mode="nearest")),
        ("bilinear x2 [1,3,4]", (1, 3, 4), dict(scale_factor=2, mode="bilinear")),
        ("bilinear x2 align [1,3,4]", (1, 3, 4),
         dict(scale_factor=2, mode="bilinear", align_corners=True)),
        ("bilinear size (5,7) [1,3,4]", (1, 3, 4), dict(size=(5, 7), mode="bilinear")),
        ("bilinear size (5,7) align [1,3,4]", (1, 3, 4),
         dict(size=(5, 7), mode="bilinear", align_corners=True)),
        ("bilinear size (2,3) [1,4,5]", (1, 4, 5), dict(size=(2, 3), mode="bilinear")),
        ("trilinear x2 [1,2,3,2]", (1, 2, 3, 2), dict(scale_factor=2, mode="trilinear")),
        ("trilinear size (3,4,5) align [2,2,3,2]", (2, 2, 3, 2),
         dict(size=(3, 4, 5), mode="trilinear", align_corners=True)),
        ("linear size 7 [2,3]", (2, 3), dict(size=7, mode="linear")),
    ]
    for name, shape, kw in cases:
        y = F.interpolate(sample(shape), **kw)
        print(name, list(y.shape[1:]))
        show("  y", y)


if __name__ == "__main__":
    activations()
    pooling()
    upsample()
