#!/usr/bin/env python3
"""Summarises bench/planner/validate.sh's runs: per example and rank count,
median absolute % error of predicted vs measured step time, Spearman rank
correlation, and the planner's choice against the fastest measured layout
and against plain data parallelism. A layout run in several rounds counts
once, with the median of its rounds (measured and predicted).

  summarise.py RESULTS.jsonl      the table (markdown)
  summarise.py --layouts [EVERY] < PLAN   the flags of the fitting layouts of a --dry-run
                                          --json plan: every EVERY-th in flag order (a
                                          selection that does not depend on the cost
                                          model) plus the chosen one and plain dp
"""
import json
import sys


def flags(c):
    f = f"--dp {c['dp']} --pp {c['pp']} --tp {c['tp']} --microbatches {c['microbatches']}"
    if c['pp'] > 1:
        f += f" --schedule {c['schedule']}"
    if c['zero']:
        f += f" --zero {c['zero']}"
    if c['recompute']:
        f += " --recompute full"
    return f


def is_plain_dp(c, ranked):
    """Plain data parallelism: dp = world, no sharding, no recomputation, one micro-batch."""
    world = max(r['dp'] * r['pp'] * r['tp'] for r in ranked)
    return (c['dp'] == world and c['zero'] == 0 and not c['recompute']
            and c['microbatches'] == 1)


def ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0.0] * len(v)
    for k, i in enumerate(order):
        r[i] = float(k)
    return r


def spearman(a, b):
    if len(a) < 2:
        return float('nan')
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va > 0 and vb > 0 else float('nan')


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def rounds_median(runs):
    """One layout's runs as one: the median over rounds of measured and predicted."""
    r = dict(runs[0])
    r['run'] = dict(r['run'])
    for k in ('step_ms_median', 'predicted_step_ms'):
        r['run'][k] = median([x['run'][k] for x in runs])
    r['rounds'] = len(runs)
    return r


def json_layout(f):
    """The layout fields of a flags string that flags() wrote."""
    t = f.split()
    get = lambda k, d: int(t[t.index(k) + 1]) if k in t else d
    return {'dp': get('--dp', 1), 'pp': get('--pp', 1), 'tp': get('--tp', 1),
            'microbatches': get('--microbatches', 1), 'zero': get('--zero', 0),
            'recompute': '--recompute' in t}


def main():
    if sys.argv[1:2] == ['--layouts']:
        plan = json.loads(sys.stdin.read())
        every = int(sys.argv[2]) if len(sys.argv) > 2 else 1
        ranked = plan['ranked']
        canonical = sorted(ranked, key=flags)
        keep = [flags(c) for i, c in enumerate(canonical) if i % every == 0]
        keep += [flags(c) for c in ranked if c is ranked[0] or is_plain_dp(c, ranked)]
        for f in dict.fromkeys(keep):  # once each, in order
            print(f)
        return
    groups = {}
    loads = []
    for line in open(sys.argv[1]):
        r = json.loads(line)
        loads.append(r.get('load', float('nan')))
        groups.setdefault((r['example'], r['np']), {}).setdefault(r['flags'], []).append(r)
    groups = {k: [rounds_median(v) for v in g.values()] for k, g in groups.items()}
    print("| example | ranks | layouts | median abs error | Spearman | chosen (measured) "
          "| best measured | chosen vs best | plain dp (measured) |")
    print("|---|---|---|---|---|---|---|---|---|")
    pooled_err = []
    for (ex, np), rs in sorted(groups.items()):
        pred = [r['run']['predicted_step_ms'] for r in rs]
        meas = [r['run']['step_ms_median'] for r in rs]
        err = sorted(abs(p - m) / m * 100 for p, m in zip(pred, meas))
        chosen = flags(rs[0]['plan']['ranked'][0])
        best = min(rs, key=lambda r: r['run']['step_ms_median'])
        got = [r for r in rs if r['flags'] == chosen]
        chosen_ms = got[0]['run']['step_ms_median'] if got else float('nan')
        plain = [r for r in rs if is_plain_dp(json_layout(r['flags']), rs[0]['plan']['ranked'])]
        plain_ms = plain[0]['run']['step_ms_median'] if plain else float('nan')
        best_ms = best['run']['step_ms_median']
        print(f"| {ex} | {np} | {len(rs)} | {median(err):.0f}% | {spearman(pred, meas):.2f} "
              f"| `{chosen}` ({chosen_ms:.2f} ms) | `{best['flags']}` ({best_ms:.2f} ms) "
              f"| {100 * (chosen_ms / best_ms - 1):+.0f}% | {plain_ms:.2f} ms |")
        pooled_err.extend(err)
    print(f"\nAll {len(pooled_err)} layouts: median abs error {median(pooled_err):.0f}%; "
          f"{len(loads)} runs, load average (1 min) median {median(loads):.1f}, "
          f"range {min(loads):.1f}-{max(loads):.1f}")


if __name__ == '__main__':
    main()
