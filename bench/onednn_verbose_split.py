#!/usr/bin/env python3
"""Sums oneDNN 2.x verbose timings (DNNL_VERBOSE=1 / ONEDNN_VERBOSE=1) per
primitive kind, and the reorders by what they do and which primitive they
feed: an fp32->bf16 reorder is charged to the next convolution or matmul
(its input), a blocked->plain fp32 one to the previous (its output).

    ONEDNN_VERBOSE=1 OMP_NUM_THREADS=1 build/examples/02_cnn/cnn ... > run.txt
    python3 bench/onednn_verbose_split.py run.txt [--json]
"""
import collections
import json
import sys


def parse(path):
    for line in open(path, errors="replace"):
        f = line.rstrip("\n").split(",")
        if len(f) < 11 or f[0] not in ("onednn_verbose", "dnnl_verbose") or f[1] != "exec":
            continue
        try:
            ms = float(f[-1])
        except ValueError:
            continue
        yield f[3], f[4], f[5], f[6], ms


def dtypes(descs):
    # "src_f32::blocked:abcd:f0 dst_bf16::blocked:aBcd16b:f0" -> (f32, abcd, bf16, aBcd16b)
    parts = {}
    for d in descs.split():
        name, rest = d.split("_", 1)
        f = rest.split(":")  # dt, padding flag, "blocked", layout, extra
        parts[name] = (f[0], f[3] if len(f) > 3 else "?")
    s, t = parts.get("src", ("?", "?")), parts.get("dst", ("?", "?"))
    return s[0], s[1], t[0], t[1]


def plain(layout):
    return layout.isalpha() and layout == "".join(sorted(layout))


def split(path):
    ms = collections.Counter()
    calls = collections.Counter()
    pending = []  # input reorders waiting for their primitive
    last = "none"
    for kind, impl, prop, descs, t in parse(path):
        if kind == "reorder":
            sdt, sl, ddt, dl = dtypes(descs)
            if sdt == "f32" and ddt == "bf16":
                pending.append(("reorder f32->bf16", t))
            elif sdt == "bf16" and ddt == "bf16":
                pending.append(("reorder bf16->bf16 (relayout)", t))
            elif sdt == ddt and not plain(sl) and plain(dl):
                key = "reorder blocked->plain (output of %s)" % last
                ms[key] += t
                calls[key] += 1
            else:
                pending.append(("reorder %s:%s->%s:%s" % (sdt, sl, ddt, dl), t))
            continue
        name = kind if kind != "convolution" else "convolution " + prop
        name += " bf16" if "bf16" in impl else " fp32"
        for what, rt in pending:
            key = "%s (input of %s)" % (what, name)
            ms[key] += rt
            calls[key] += 1
        pending = []
        ms[name] += t
        calls[name] += 1
        last = name
    for what, rt in pending:
        ms[what + " (input of nothing)"] += rt
        calls[what + " (input of nothing)"] += 1
    return ms, calls


def main():
    path = sys.argv[1]
    ms, calls = split(path)
    if "--json" in sys.argv:
        print(json.dumps({k: [round(v, 3), calls[k]] for k, v in ms.items()}))
        return
    total = sum(ms.values())
    print("%-60s %10s %6s" % ("primitive", "ms", "calls"))
    for k in sorted(ms, key=lambda k: -ms[k]):
        print("%-60s %10.1f %6d" % (k, ms[k], calls[k]))
    print("%-60s %10.1f" % ("total", total))


if __name__ == "__main__":
    main()
