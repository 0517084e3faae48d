#!/usr/bin/python3
"""PyTorch peer of Telar's example 02 CNN (examples/02_cnn).

The same network: conv 3x3 1->32 (padding 1), ReLU, max-pool 2, residual
{conv 3x3 32->32, ReLU, conv 3x3 32->32}, ReLU, conv 3x3 32->64, ReLU,
max-pool 2, flatten, dense 3136->128, ReLU, dense 128->10; softmax
cross-entropy, AdamW (lr 1e-3), fp32, NCHW, one thread, synthetic inputs
[batch, 1, 28, 28]. Times N steps (zero_grad + forward + backward + optimizer
step) after a warm-up; prints the median and mean step time and one JSON line
starting with '{"peer":"pytorch"'.

    OMP_NUM_THREADS=1 /usr/bin/python3 bench/peers/cnn_torch.py --batch 128 --steps 30
    ../shared/peers/torch26.sh python3 bench/peers/cnn_torch.py --batch 128 --steps 30
    ... --precision bf16   # torch.autocast('cpu', dtype=torch.bfloat16), fp32 weights
"""

import argparse
import contextlib
import json
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402


class Residual(nn.Module):
    def __init__(self, *body):
        super().__init__()
        self.body = nn.Sequential(*body)

    def forward(self, x):
        return self.body(x) + x


def make_model(hidden=128):
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        Residual(nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1)),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    a = p.parse_args()
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.precision == "bf16" \
        else contextlib.nullcontext
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.rand(a.batch, 1, 28, 28)
    y = torch.randint(0, 10, (a.batch,))
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast():
            out = model(x)
        loss = loss_fn(out.float(), y)
        loss.backward()
        opt.step()
        t = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(t * 1e3)
    med, mean = statistics.median(times), statistics.mean(times)
    print(f"pytorch {torch.__version__}: CNN batch {a.batch}, {a.precision}, {a.threads} thread(s), "
          f"median step {med:.2f} ms, mean {mean:.2f} ms, mkldnn {torch.backends.mkldnn.is_available()}")
    print(json.dumps({"peer": "pytorch", "version": torch.__version__, "model": "cnn",
                      "batch": a.batch, "precision": a.precision, "threads": a.threads, "steps": a.steps,
                      "step_ms_median": med, "step_ms_mean": mean}))


if __name__ == "__main__":
    main()
