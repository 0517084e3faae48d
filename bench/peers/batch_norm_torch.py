#!/usr/bin/python3
"""PyTorch peer of Telar's bench_batch_norm (bench/conv/bench_batch_norm.cpp).

nn.BatchNorm2d in training mode, fp32, NCHW, one thread, at the same ResNet
shapes: forward (batch statistics, running ones updated), backward (dx,
dgamma, dbeta) and both. Prints the median and mean of N timed repetitions
after a warm-up, per shape and phase, and one JSON line per row starting with
'{"peer":"pytorch"'. Each time is wall-clock and this thread's CPU time
(time.thread_time, one thread): on a loaded machine compare the CPU time with
google-benchmark's CPU column.

    OMP_NUM_THREADS=1 /usr/bin/python3 bench/peers/batch_norm_torch.py --reps 20
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

SHAPES = [(16, 64, 56), (16, 256, 28), (16, 128, 28)]  # batch, C, H = W


def time_phase(bn, x, dy, phase, reps, warmup):
    times, cpu = [], []
    for r in range(warmup + reps):
        if phase == "backward":  # the graph is built untimed
            y = bn(x)
            t0, c0 = time.perf_counter(), time.thread_time()
            y.backward(dy)
        else:
            t0, c0 = time.perf_counter(), time.thread_time()
            y = bn(x)
            if phase == "forward_backward":
                y.backward(dy)
        t, c = time.perf_counter() - t0, time.thread_time() - c0
        x.grad = None
        bn.zero_grad(set_to_none=True)
        if r >= warmup:
            times.append(t)
            cpu.append(c)
    return times, cpu


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=20, help="timed repetitions (20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed repetitions first (3)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    for n, c, hw in SHAPES:
        bn = nn.BatchNorm2d(c).train()
        x = torch.randn(n, c, hw, hw, requires_grad=True)
        dy = torch.randn(n, c, hw, hw)
        for phase in ("forward", "backward", "forward_backward"):
            t, cpu = time_phase(bn, x, dy, phase, a.reps, a.warmup)
            med, mean = statistics.median(t) * 1e3, statistics.mean(t) * 1e3
            cmed = statistics.median(cpu) * 1e3
            print(f"BatchNorm2d/{phase}/{n}/{c}/{hw}: median {med:.3f} ms, mean {mean:.3f} ms, "
                  f"CPU median {cmed:.3f} ms")
            print(json.dumps({"peer": "pytorch", "torch": torch.__version__, "phase": phase,
                              "shape": [n, c, hw, hw], "median_ms": med, "mean_ms": mean,
                              "cpu_median_ms": cmed}))


if __name__ == "__main__":
    main()
