#!/usr/bin/env python3
"""The scaling report: Markdown with SVG plots of the cost model's
data-parallel curves to 1,024 GPUs on published hardware profiles (from
telar_scaling_curves), each beside the published result it reproduces, a
table of Megatron-LM's published layouts against the model, its published
comparisons of layouts (which is fastest) against the model's, the layouts
measured on this machine by bench/planner/validate.sh (predicted against
measured step time) and the weak scaling bench/planner/peer_scaling.sh
measured here for Telar and PyTorch DDP.

    python3 scaling_report.py CURVES.jsonl [VALIDATION.jsonl | PEERS.jsonl | POINTS.jsonl ...] --out DIR

Writes DIR/scaling_report.md, DIR/efficiency.svg, DIR/throughput.svg and,
with validation files, DIR/measured.svg, with peer files, DIR/peers.svg,
with the emulated cluster's points (bench/cluster/scaling.sh), DIR/cluster.svg,
and DIR/layouts_N.svg for the published comparisons of layouts.
Standard library only."""
import json
import math
import os
import sys
from statistics import median

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


class Plot:
    """A log-x (or log-log) line and point plot as SVG text."""

    def __init__(self, title, xlabel, ylabel, xs, ys, logy=False, w=560, h=360):
        self.title, self.xlabel, self.ylabel = title, xlabel, ylabel
        self.logy, self.w, self.h = logy, w, h
        self.x0, self.x1 = math.log2(min(xs)), math.log2(max(xs))
        fy = (lambda v: math.log10(v)) if logy else (lambda v: v)
        self.fy = fy
        self.y0, self.y1 = fy(min(ys)), fy(max(ys))
        if self.y1 - self.y0 < 1e-9:
            self.y1 = self.y0 + 1
        pad = 0.05 * (self.y1 - self.y0)
        self.y0 -= pad
        self.y1 += pad
        self.items = []
        self.legend = []

    def px(self, x):
        return 60 + (self.w - 80) * (math.log2(x) - self.x0) / max(self.x1 - self.x0, 1e-9)

    def py(self, y):
        return self.h - 45 - (self.h - 75) * (self.fy(y) - self.y0) / (self.y1 - self.y0)

    def line(self, pts, colour, label, dash=False):
        d = " ".join("%s%.1f,%.1f" % ("M" if i == 0 else "L", self.px(x), self.py(y))
                     for i, (x, y) in enumerate(pts))
        self.items.append('<path d="%s" fill="none" stroke="%s" stroke-width="2"%s/>'
                          % (d, colour, ' stroke-dasharray="5,4"' if dash else ""))
        self.legend.append((colour, label, "line"))

    def points(self, pts, colour, label, shape="circle", legend=True):
        for x, y in pts:
            cx, cy = self.px(x), self.py(y)
            if shape == "circle":
                self.items.append('<circle cx="%.1f" cy="%.1f" r="4" fill="%s"/>' % (cx, cy, colour))
            else:
                self.items.append('<rect x="%.1f" y="%.1f" width="9" height="9" fill="none" '
                                  'stroke="%s" stroke-width="2"/>' % (cx - 4.5, cy - 4.5, colour))
        if legend:
            self.legend.append((colour, label, shape))

    def svg(self):
        out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
               'font-family="sans-serif" font-size="11">' % (self.w, self.h + 16 * len(self.legend)),
               '<rect width="100%" height="100%" fill="white"/>',
               '<text x="%d" y="16" font-size="13" text-anchor="middle">%s</text>'
               % (self.w // 2, self.title)]
        left, right, top, bottom = 60, self.w - 20, 30, self.h - 45
        out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>'
                   % (left, top, right - left, bottom - top))
        for e in range(int(math.floor(self.x0)), int(math.ceil(self.x1)) + 1):
            x = self.px(2 ** e)
            out.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (x, bottom + 14, 2 ** e))
        for i in range(6):
            v = self.y0 + (self.y1 - self.y0) * i / 5
            y = bottom - (bottom - top) * i / 5
            label = ("%.3g" % (10 ** v)) if self.logy else ("%.3g" % v)
            out.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>' % (left - 4, y + 4, label))
            out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/>' % (left, right, y, y))
        out.append('<text x="%d" y="%d" text-anchor="middle">%s</text>'
                   % ((left + right) // 2, bottom + 30, self.xlabel))
        out.append('<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">%s</text>'
                   % ((top + bottom) // 2, (top + bottom) // 2, self.ylabel))
        out += self.items
        for i, (colour, label, shape) in enumerate(self.legend):
            y = self.h + 16 * i - 4
            if shape == "line":
                out.append('<line x1="60" x2="80" y1="%d" y2="%d" stroke="%s" stroke-width="2"/>'
                           % (y, y, colour))
            else:
                out.append('<circle cx="70" cy="%d" r="4" fill="%s"/>' % (y, colour))
            out.append('<text x="86" y="%d">%s</text>' % (y + 4, label))
        out.append("</svg>")
        return "\n".join(out)


def curves_section(curves, out):
    xs = [p["ranks"] for c in curves for p in c["points"]]
    eff = Plot("Data-parallel scaling efficiency (model) and published results",
               "GPUs", "efficiency", xs, [0.5, 1.0])
    thr = Plot("Throughput (model)", "GPUs", "samples/s", xs,
               [p["samples_per_s"] for c in curves for p in c["points"]], logy=True)
    rows = []
    for i, c in enumerate(curves):
        col = COLOURS[i % len(COLOURS)]
        pts = [(p["ranks"], p["efficiency"]) for p in c["points"] if p["ranks"] >= c["baseline"]]
        label = "%s: %s, %d/GPU (%s)" % (c["source"], c["model"], c["batch_per_gpu"], c["profile"])
        eff.line(pts, col, label)
        if c.get("zero1_points"):
            eff.line([(p["ranks"], p["efficiency"]) for p in c["zero1_points"]
                      if p["ranks"] >= c["baseline"]], col, "%s under ZeRO-1" % c["model"], True)
        eff.points([(c["ranks"], c["published"])], col, "published: %s" % c["source"])
        thr.line([(p["ranks"], p["samples_per_s"]) for p in c["points"]], col, label)
        at = {p["ranks"]: p for p in c["points"]}
        model = next((p["efficiency"] for p in c["points"] if p["ranks"] == c["ranks"]), None)
        z = {p["ranks"]: p for p in c.get("zero1_points", [])}
        rows.append("| %s | %s, %d/GPU | %d (vs %d) | %.0f%% | %.1f%% | %.1f%% | %.1f ms | %s |" % (
            c["source"], c["model"], c["batch_per_gpu"], c["ranks"], c["baseline"],
            100 * c["published"], 100 * model, 100 * at[1024]["efficiency"], at[1024]["step_ms"],
            "%.1f%%" % (100 * z[1024]["efficiency"]) if 1024 in z else "–"))
    for name, plot in (("efficiency.svg", eff), ("throughput.svg", thr)):
        with open(os.path.join(out, name), "w") as f:
            f.write(plot.svg())
    return ["## The model at scale (hardware profiles from published figures)", "",
            "![efficiency](efficiency.svg)", "", "![throughput](throughput.svg)", "",
            "| published result | model | GPUs | published | model | model at 1,024 | step at 1,024 "
            "| ZeRO-1 at 1,024 |",
            "|---|---|---|---|---|---|---|---|"] + rows + [
            "", "Assumptions: docs/planner.md, \"At scale, on paper\"; profiles: "
            "bench/planner/profiles/. Dashed: the same setting under ZeRO-1 (optimizer state "
            "sharded; on GPUs reduce-scatter and all-gather over the flat ring, after backward, "
            "not hidden).", ""]


def measured_section(runs, out):
    groups = {}
    for r in runs:
        run = r["run"]
        if run.get("predicted_step_ms", 0) <= 0 or run.get("step_ms_median", 0) <= 0:
            continue
        key = (r["example"], r["np"])
        groups.setdefault(key, {}).setdefault(r["flags"], []).append(
            (run["predicted_step_ms"], run["step_ms_median"], r.get("load", 0)))
    if not groups:
        return []
    allv = [v for g in groups.values() for lst in g.values() for t in lst for v in t[:2]]
    plot = Plot("This machine: predicted (line: equal) against measured step time",
                "predicted ms (log2 axis)", "measured ms", [min(allv), max(allv)], allv, logy=True)
    plot.line([(min(allv), min(allv)), (max(allv), max(allv))], "#888", "measured = predicted", True)
    rows = []
    for i, ((example, np_), layouts) in enumerate(sorted(groups.items())):
        pairs = [(median([t[0] for t in v]), median([t[1] for t in v])) for v in layouts.values()]
        loads = [t[2] for v in layouts.values() for t in v]
        plot.points(pairs, COLOURS[i % len(COLOURS)], "%s, %d ranks" % (example, np_))
        err = median([abs(p - m) / m for p, m in pairs])
        best = min(pairs, key=lambda t: t[1])
        rows.append("| %s | %d | %d | %.0f%% | %.2f ms (predicted %.2f) | %.1f–%.1f |" % (
            example, np_, len(pairs), 100 * err, best[1], best[0], min(loads), max(loads)))
    with open(os.path.join(out, "measured.svg"), "w") as f:
        f.write(plot.svg())
    return ["## Measured on this machine (bench/planner/validate.sh)", "",
            "![measured](measured.svg)", "",
            "| example | ranks | layouts | median abs error | fastest measured | load |",
            "|---|---|---|---|---|---|"] + rows + [
            "", "Each point: one layout, the median over rounds of its run's median step.", ""]


def peers_section(lines, out):
    """Weak scaling measured here (peer_scaling.sh): Telar beside PyTorch DDP."""
    steps = {}
    for l in lines:
        steps.setdefault((l["peer"], l["ranks"]), []).append(l["step_ms"])
    if not steps:
        return []
    first = lines[0]
    batch, cores = first["batch_per_rank"], first["cores"]
    peers = sorted({p for p, _ in steps})
    ranks = sorted({n for _, n in steps})
    med = {k: median(v) for k, v in steps.items()}

    def baseline(peer):  # ZeRO-1 at 1 rank is plain dp at 1 rank
        return med.get((peer, 1)) or med.get((peer.split(" + ")[0], 1))

    plot = Plot("This machine: weak-scaling efficiency, Telar and PyTorch DDP",
                "ranks (%d cores)" % cores, "efficiency T(1) / T(ranks)", ranks, [0.0, 1.2])
    rows = []
    for i, peer in enumerate(peers):
        pts = []
        for n in ranks:
            if (peer, n) not in steps:
                continue
            b = baseline(peer)
            eff = b / med[(peer, n)] if b else float("nan")
            if b:
                pts.append((n, eff))
            v = steps[(peer, n)]
            rows.append("| %s | %d | %.2f (%.2f–%.2f) | %.0f | %s |" % (
                peer, n, med[(peer, n)], min(v), max(v), 1e3 * n * batch / med[(peer, n)],
                "%.2f" % eff if b else "–"))
        plot.line(pts, COLOURS[i % len(COLOURS)], peer)
        plot.points(pts, COLOURS[i % len(COLOURS)], peer, legend=False)
    with open(os.path.join(out, "peers.svg"), "w") as f:
        f.write(plot.svg())
    loads = [l["load"] for l in lines]
    return ["## Weak scaling on this machine: Telar beside PyTorch DDP "
            "(bench/planner/peer_scaling.sh)", "",
            "![peers](peers.svg)", "",
            "MLP 784-%d-%d-10, SGD, batch %d per rank, one thread per rank, synthetic data; "
            "%d rounds interleaved, load %.1f–%.1f. Ranks beyond the %d cores share them." % (
                first["hidden"], first["hidden"], batch, max(l["round"] for l in lines),
                min(loads), max(loads), cores), "",
            "| peer | ranks | step ms, median (range) | samples/s | efficiency |",
            "|---|---|---|---|---|"] + rows + [""]


def cluster_section(lines, out):
    """Strong (and weak) scaling measured through Slurm on the emulated
    cluster (bench/cluster/scaling.sh), beside the run's own prediction."""
    runs = {}
    for l in lines:
        ex = l["example"] + (" (weak)" if l.get("scaling") == "weak" else "")
        runs.setdefault((ex, l["nodes"]), []).append(l)
    if not runs:
        return []
    nodes = sorted({n for _, n in runs})
    allv = [v for rs in runs.values() for l in rs for v in (l["step_ms"], l["predicted_step_ms"])]
    plot = Plot("Emulated cluster (Slurm, one rank per node): step time", "nodes", "step ms",
                nodes, allv, logy=True)
    rows = []
    for i, ex in enumerate(sorted({e for e, _ in runs})):
        col = COLOURS[i % len(COLOURS)]
        meas, pred = [], []
        for n in nodes:
            rs = runs.get((ex, n))
            if not rs:
                continue
            m = median([l["step_ms"] for l in rs])
            p = median([l["predicted_step_ms"] for l in rs])
            meas.append((n, m))
            pred.append((n, p))
            rows.append("| %s | %d | %.2f (%s) | %.2f | %.2f |" % (
                ex, n, m, ", ".join("%.2f" % l["step_ms"] for l in rs), p, p / m))
        plot.line(pred, col, "%s: predicted" % ex, True)
        plot.points(meas, col, "%s: measured" % ex)
    with open(os.path.join(out, "cluster.svg"), "w") as f:
        f.write(plot.svg())
    return ["## Through Slurm on the emulated cluster (bench/cluster/scaling.sh)", "",
            "![cluster](cluster.svg)", "",
            "Links shaped to %s; one rank per node, the same global batch (strong scaling; "
            "\"(weak)\": the same batch per rank); the nodes share the machine's cores "
            "(docs/cluster.md)." % lines[0]["rate"], "",
            "| example | nodes | step ms, median (runs) | predicted | predicted / measured |",
            "|---|---|---|---|---|"] + rows + [""]


def transformer_section(rows):
    """Megatron-LM's published FLOP rates per GPU beside the model's."""
    if not rows:
        return []
    body = ["| %s | %d x %d x %d | %d | %.0f (%.0f%%) | %.0f (%.0f%%) | %.0f%% | %.3f | %.2f s |" % (
        r["model"], r["tp"], r["pp"], r["gpus"] // (r["tp"] * r["pp"]), r["gpus"],
        r["published_tflops"], 100 * r["published_tflops"] / r["peak_tflops"], r["tflops"],
        100 * r["tflops"] / r["peak_tflops"], 100 * r["model_tflops"] / r["peak_tflops"],
        r["bubble"], r["dp_s"]) for r in rows]
    return ["## Megatron-LM's layouts on paper", "",
            "%s, on `%s`: TFLOP/s per GPU as they count it (recomputation included), "
            "published and modelled; MFU: the model's rate without recomputation." % (
                rows[0]["source"], rows[0]["profile"]), "",
            "| model | tp x pp x dp | GPUs | published | model | model MFU | bubble | dp allreduce |",
            "|---|---|---|---|---|---|---|---|"] + body + [""]


def layouts_plot(st, name, out):
    """One study's rates against the degree it varies (tp or pp), a line per
    batch, the published fastest layout marked, written to DIR/name."""
    by_tp = len({l["pp"] for l in st["layouts"]}) == 1
    degree = [l["tp"] if by_tp else l["pp"] for l in st["layouts"]]
    plot = Plot("%s: %s" % (st["model"], st["question"]),
                "%s-parallel size (of %d GPUs)" % ("tensor" if by_tp else "pipeline", st["gpus"]),
                "TFLOP/s per GPU (model)", degree,
                [r for l in st["layouts"] for r in l["tflops"]])
    for b, batch in enumerate(st["batches"]):
        col = COLOURS[b % len(COLOURS)]
        pts = [(d, l["tflops"][b]) for d, l in zip(degree, st["layouts"])]
        plot.line(pts, col, "batch %d" % batch)
        plot.points([p for p, l in zip(pts, st["layouts"])
                     if [l["tp"], l["pp"]] == st["published_best"]], col,
                    "the published fastest layout", "square", b == 0)
    with open(os.path.join(out, name), "w") as f:
        f.write(plot.svg())


def layouts_section(studies, out):
    """Published comparisons of layouts beside the model's per-GPU rates."""
    if not studies:
        return []
    lines = ["## Which layout is fastest: Megatron-LM's comparisons on paper", "",
             "TFLOP/s per GPU (recomputation counted) that the model gives each layout "
             "(tp x pp x dp) of %d GPUs (`%s`), the fastest per batch in bold, beside the "
             "layout the paper found fastest. The models' shapes are ours (docs/planner.md)." % (
                 studies[0]["gpus"], studies[0]["profile"]), ""]
    for i, st in enumerate(studies):
        name = "layouts_%d.svg" % (i + 1)
        layouts_plot(st, name, out)
        names = ["%d x %d x %d" % (l["tp"], l["pp"], st["gpus"] // (l["tp"] * l["pp"]))
                 for l in st["layouts"]]
        lines += ["### %s: %s (%s)" % (st["source"], st["question"], st["model"]), "",
                  "![%s](%s)" % (st["question"], name), "",
                  "| batch | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for b, batch in enumerate(st["batches"]):
            rates = [l["tflops"][b] for l in st["layouts"]]
            lines.append("| %d | " % batch + " | ".join(
                ("**%.0f**" if r == max(rates) else "%.0f") % r for r in rates) + " |")
        lines += ["", "Published fastest: %d x %d x %d." % (
            st["published_best"][0], st["published_best"][1],
            st["gpus"] // (st["published_best"][0] * st["published_best"][1])), ""]
    return lines


def main():
    args = sys.argv[1:]
    if "--out" not in args or len(args) < 3:
        sys.exit(__doc__)
    i = args.index("--out")
    out = args[i + 1]
    files = args[:i] + args[i + 2:]
    os.makedirs(out, exist_ok=True)
    model = [json.loads(l) for l in open(files[0]) if l.startswith("{")]
    curves = [c for c in model if "kind" not in c]
    transformers = [c for c in model if c.get("kind") == "transformer"]
    studies = [c for c in model if c.get("kind") == "layouts"]
    lines = [json.loads(l) for f in files[1:] for l in open(f) if l.startswith("{")]
    runs = [l for l in lines if "scaling" not in l and "cluster" not in l]
    peers = [l for l in lines if l.get("scaling") == "weak" and "cluster" not in l]
    cluster = [l for l in lines if "cluster" in l]
    md = (["# Telar scaling report", ""] + curves_section(curves, out) +
          transformer_section(transformers) + layouts_section(studies, out) +
          peers_section(peers, out) + cluster_section(cluster, out) +
          measured_section(runs, out))
    with open(os.path.join(out, "scaling_report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print(os.path.join(out, "scaling_report.md"))


if __name__ == "__main__":
    main()
