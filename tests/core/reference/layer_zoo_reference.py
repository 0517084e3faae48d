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


if __name__ == "__main__":
    activations()
