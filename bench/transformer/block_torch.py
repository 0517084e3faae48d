"""One pre-norm transformer block in torch.nn, the computation of
bench_transformer at one rank: x + attn(ln1(x)) (causal), then
x + fc2(gelu(fc1(ln2(x)))), fp32, one thread; median of forward + backward
(input and weight gradients).

    OMP_NUM_THREADS=1 /usr/bin/python3 bench/transformer/block_torch.py
    OMP_NUM_THREADS=1 ../shared/peers/torch26.sh python3 bench/transformer/block_torch.py
    ... --precision bf16   # torch.autocast('cpu', dtype=torch.bfloat16), fp32 weights
"""
import contextlib
import argparse
import time

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(),
                                 nn.Linear(4 * hidden, hidden))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    a = p.parse_args()
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.precision == "bf16" \
        else contextlib.nullcontext
    torch.set_num_threads(1)
    torch.manual_seed(0)
    block = Block(a.hidden, a.heads)
    x = torch.rand(a.batch, a.seq, a.hidden, requires_grad=True)
    dy = torch.rand(a.batch, a.seq, a.hidden)
    mask = torch.triu(torch.ones(a.seq, a.seq, dtype=torch.bool), diagonal=1)
    ms = []
    for r in range(a.warmup + a.reps):
        t0 = time.perf_counter()
        with autocast():
            y = block(x, mask)
        y.float().backward(dy)
        t = (time.perf_counter() - t0) * 1e3
        if r >= a.warmup:
            ms.append(t)
    ms.sort()
    med = ms[len(ms) // 2]
    print(f"torch {torch.__version__} block: batch {a.batch} seq {a.seq} hidden {a.hidden} "
          f"heads {a.heads} {a.precision}, forward+backward median {med:.2f} ms "
          f"({a.batch * a.seq / med * 1e3:.0f} tokens/s), {a.reps} reps, threads "
          f"{torch.get_num_threads()}")


if __name__ == "__main__":
    main()
