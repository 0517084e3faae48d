#!/usr/bin/python3
"""PyTorch peer of Telar's unet3d (examples/07_unet3d): one training step.

The same 3-D U-Net as telar::spatial_unet (parallel/spatial_unet.hpp) with
the example's defaults: per level two [Conv3d 3^3 (no bias), GroupNorm
(min(groups, channels) groups), ReLU] blocks, MaxPool3d(2) going down,
ConvTranspose3d(2w, w, 2, stride 2) going up, the skip concatenated before
the upsampled tensor, a 1^3 Conv3d to the classes. A step: forward,
voxel cross entropy + soft Dice (Telar's SoftDice: per sample and class
(2 sum p t + 1) / (sum p + sum t + 1)), backward, Adam. fp32, NCDHW,
training mode, one thread. Prints the median and mean of --steps timed
steps after --warmup, and one JSON line starting with '{"peer":"pytorch"'.
Each step is wall-clock and this thread's CPU time (time.thread_time).

    OMP_NUM_THREADS=1 /usr/bin/python3 bench/peers/unet3d_torch.py --size 96 --batch 1
    ... --precision bf16   # torch.autocast('cpu', dtype=torch.bfloat16), fp32 weights

--precision bf16 runs the forward under torch.autocast('cpu',
dtype=torch.bfloat16) (bf16 Conv3d and ConvTranspose3d, fp32 weights and
Adam's state; the losses in fp32 on the logits made fp32), as cnn_torch.py
does. GroupNorm computes in fp32 on its input made fp32 (as Telar's does):
PyTorch 1.13's CPU autocast does not list group_norm, and its bf16 kernel
refuses the fp32 weight ("expected scalar type BFloat16 but found Float").
"""

import argparse
import contextlib
import json
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402


class GroupNorm32(nn.GroupNorm):
    """nn.GroupNorm on its input made fp32 (a no-op in fp32; under bf16
    autocast the next convolution casts the output back to bf16)."""

    def forward(self, x):
        return super().forward(x.float())


def block(cin, cout, groups):
    layers = []
    for _ in range(2):
        layers += [nn.Conv3d(cin, cout, 3, 1, 1, bias=False),
                   GroupNorm32(min(groups, cout), cout), nn.ReLU()]
        cin = cout
    return nn.Sequential(*layers)


class UNet3D(nn.Module):
    def __init__(self, cin, classes, depth, width, groups):
        super().__init__()
        self.down = nn.ModuleList()
        c = cin
        for level in range(depth + 1):
            w = width << level
            self.down.append(block(c, w, groups))
            c = w
        self.up = nn.ModuleList()
        self.dec = nn.ModuleList()
        for level in range(depth - 1, -1, -1):
            w = width << level
            self.up.append(nn.ConvTranspose3d(2 * w, w, 2, 2))
            self.dec.append(block(2 * w, w, groups))
        self.head = nn.Conv3d(width, classes, 1)
        self.pool = nn.MaxPool3d(2)

    def forward(self, x):
        skips = []
        for level, b in enumerate(self.down):
            if level > 0:
                x = self.pool(x)
            x = b(x)
            skips.append(x)
        for i, (u, b) in enumerate(zip(self.up, self.dec)):
            x = b(torch.cat([skips[-2 - i], u(x)], 1))
        return self.head(x)


def soft_dice(logits, labels, classes, eps=1.0):
    p = torch.softmax(logits, 1).flatten(2)
    t = nn.functional.one_hot(labels.flatten(1), classes).permute(0, 2, 1).to(p.dtype)
    dice = (2 * (p * t).sum(2) + eps) / (p.sum(2) + t.sum(2) + eps)
    return (1 - dice.mean(1)).mean()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=96, help="cube edge (96)")
    p.add_argument("--batch", type=int, default=1, help="volumes per step (1)")
    p.add_argument("--depth", type=int, default=2, help="poolings (2)")
    p.add_argument("--width", type=int, default=8, help="first level's channels (8)")
    p.add_argument("--groups", type=int, default=4, help="GroupNorm groups (4)")
    p.add_argument("--classes", type=int, default=2, help="classes (2)")
    p.add_argument("--steps", type=int, default=5, help="timed steps (5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: forward under torch.autocast('cpu', dtype=torch.bfloat16)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    net = UNet3D(1, a.classes, a.depth, a.width, a.groups).train()
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    x = torch.randn(a.batch, 1, a.size, a.size, a.size)
    y = torch.randint(0, a.classes, (a.batch, a.size, a.size, a.size))
    ce = nn.CrossEntropyLoss()
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.precision == "bf16" \
        else contextlib.nullcontext
    wall, cpu = [], []
    for s in range(a.warmup + a.steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        opt.zero_grad(set_to_none=True)
        with autocast():
            z = net(x)
        z = z.float()
        loss = ce(z, y) + soft_dice(z, y, a.classes)
        loss.backward()
        opt.step()
        t, c = time.perf_counter() - t0, time.thread_time() - c0
        if s >= a.warmup:
            wall.append(t)
            cpu.append(c)
    row = {"peer": "pytorch", "torch": torch.__version__, "size": a.size, "batch": a.batch,
           "depth": a.depth, "width": a.width, "precision": a.precision, "threads": a.threads,
           "step_ms_median": 1e3 * statistics.median(wall),
           "step_ms_mean": 1e3 * statistics.mean(wall),
           "cpu_ms_median": 1e3 * statistics.median(cpu)}
    print(f"torch {torch.__version__}: U-Net {a.size}^3 batch {a.batch}, {a.precision}: step median "
          f"{row['step_ms_median']:.1f} ms (cpu {row['cpu_ms_median']:.1f} ms)")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
