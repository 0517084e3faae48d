#!/usr/bin/env python3
"""How much of the data-parallel allreduce time runs while backward computes.

Reads a Chrome trace written by a Telar run with tracing on (bench_mlp_step
--timeline PREFIX, or fashion_mnist --timeline PREFIX) and reports, per rank,
the total allreduce time, the part of it that overlaps forward/backward
compute, and the part left exposed after the last backward of a step.

    python3 bench/mlp/overlap.py PREFIX.json
"""
import json
import sys
from collections import defaultdict


def overlap(a, b):
    """Length of the intersection of two sorted lists of disjoint intervals."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def merge(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def main(path):
    events = json.load(open(path))["traceEvents"]
    by_rank = defaultdict(lambda: {"comm": [], "compute": []})
    for e in events:
        iv = (e["ts"], e["ts"] + e["dur"])
        if e["name"].startswith("allreduce bucket"):
            by_rank[e["pid"]]["comm"].append(iv)
        elif e.get("cat") in ("forward", "backward"):
            by_rank[e["pid"]]["compute"].append(iv)
    print("rank  allreduce_ms  hidden_ms  hidden_%")
    for rank in sorted(by_rank):
        comm = merge(by_rank[rank]["comm"])
        compute = merge(by_rank[rank]["compute"])
        total = sum(e - s for s, e in comm)
        hidden = overlap(comm, compute)
        pct = 100 * hidden / total if total else 0.0
        print(f"{rank:4d}  {total / 1e3:12.2f}  {hidden / 1e3:9.2f}  {pct:8.1f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
