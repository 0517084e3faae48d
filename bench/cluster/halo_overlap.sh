#!/usr/bin/env bash
# What the halo exchange's overlap hides on a network (docs/spatial.md,
# "Halo time hidden on a network"): unet3d with each sample split over two
# emulated nodes (sp = 2, one rank per node, each node its own core), the
# link between them shaped to RATE, the exchanges overlapped with the
# interior rows (the default) and completed before computing
# (--no-overlap), each without and with Open MPI's TCP progress thread
# (btl_tcp_progress_thread: without one, a message above the eager limit
# moves only inside MPI calls), beside sp = 1 on one node; ROUNDS rounds
# interleaved.
# Prints a table of the medians (step time, exposed halo wait per step,
# halo bytes per step) and the fraction of the no-overlap wait hidden.
# Open MPI builds. Needs root (the cluster's namespaces).
#   bash bench/cluster/halo_overlap.sh BUILD [RATE] [ROUNDS]
#   BUILD  a build tree with examples/07_unet3d/unet3d
#   RATE   tc rate of every node's link (default 100mbit; "none": unshaped)
#   ROUNDS interleaved rounds (default 3)
# Environment: OUT (default ./halo-overlap), SIZE (cube edge, default 48),
# STEPS (timed steps per run after the first, default 6), WIDTH (default 8),
# DEPTH (default 2). Leaves the cluster up: stop it with
# scripts/cluster/stop.sh.
set -euo pipefail
build=$(cd "$1" && pwd)
rate=${2:-100mbit}
rounds=${3:-3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
scripts=$here/../../scripts
out=$(mkdir -p "${OUT:-$PWD/halo-overlap}" && cd "${OUT:-$PWD/halo-overlap}" && pwd)
unet=$build/examples/07_unet3d/unet3d
size=${SIZE:-48} steps=${STEPS:-6} width=${WIDTH:-8} depth=${DEPTH:-2}
run=$scripts/cluster/run.sh

shape=(--cores-per-node 1)
[[ $rate != none ]] && shape+=(--rate "$rate")
bash "$scripts/cluster/start.sh" 2 "${shape[@]}"
volumes=$((steps + 2)) # steps + 1 to train on, one to validate
data=$out/volumes_${size}_$volumes.h5
[[ -f $data ]] || "$unet" --generate "$volumes" --data "$data" --size "$size" --val 1 --batch 1 \
  --epochs 1 --limit-steps 1 --memory-budget 1KiB > /dev/null 2>&1 || true
[[ -f $data ]] || { echo "halo_overlap.sh: could not write $data" >&2; exit 1; }
common="--data $data --val 1 --batch 1 --epochs 1 --limit-steps $((steps + 1)) --json \
--width $width --depth $depth"
# job NODES OUTPUT PROGRESS FLAGS: one batch job of NODES ranks, one per
# node, waited for; PROGRESS 1 runs Open MPI's TCP progress thread. Ranks
# unbound: Open MPI would bind each node's rank to core 0 of the machine
# (every node sees all of them), and both ranks would share it; unbound,
# each keeps its node's core.
job() {
  "$run" head sbatch --wait --quiet -N "$1" --ntasks-per-node=1 --output="$2" \
    --export=ALL,OMP_NUM_THREADS=1,OMPI_MCA_btl_tcp_progress_thread=$3 \
    --wrap "mpirun --bind-to none $unet $common $4" ||
    echo "halo_overlap.sh: job failed: $4 (see $2)" >&2
}
echo "uptime before: $(uptime)" | tee "$out/load.txt"
for r in $(seq 1 "$rounds"); do
  job 1 "$out/sp1-$r.json" 0 "--sp 1"
  job 2 "$out/overlap-$r.json" 0 "--sp 2"
  job 2 "$out/no-overlap-$r.json" 0 "--sp 2 --no-overlap"
  job 2 "$out/overlap+progress-$r.json" 1 "--sp 2"
  job 2 "$out/no-overlap+progress-$r.json" 1 "--sp 2 --no-overlap"
done
echo "uptime after: $(uptime)" | tee -a "$out/load.txt"
python3 - "$out" "$rounds" "$rate" <<'PY'
import json, statistics, sys
out, rounds, rate = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def runs(name):
    got = []
    for r in range(1, rounds + 1):
        try:
            line = [l for l in open(f"{out}/{name}-{r}.json") if l.startswith("{")][-1]
        except (OSError, IndexError):
            continue
        got.append(json.loads(line))
    return got
med = lambda js, k: statistics.median(j[k] for j in js) if js else float("nan")
print(f"link {rate}; medians of {rounds} rounds")
print("| run | step ms | CPU ms/step (rank 0) | halo exposed ms/step (rank 0) | halo window ms/step | halo bytes/step | runs (step ms) |")
print("|---|---:|---:|---:|---:|---:|---|")
table = {}
for name in ("sp1", "overlap", "no-overlap", "overlap+progress", "no-overlap+progress"):
    js = runs(name)
    table[name] = js
    if js:
        print(f"| {name} | {med(js, 'step_ms'):.1f} | {med(js, 'step_cpu_ms'):.1f} | "
              f"{med(js, 'halo_exposed_ms_per_step_rank0'):.1f} | "
              f"{med(js, 'halo_window_ms_per_step_rank0'):.1f} | {med(js, 'halo_bytes_per_step_rank0'):.0f} | "
              + ", ".join(f"{j['step_ms']:.1f}" for j in js) + " |")
for tail in ("", "+progress"):
    on, off = table["overlap" + tail], table["no-overlap" + tail]
    if on and off:
        hidden = 1 - med(on, "halo_exposed_ms_per_step_rank0") / \
            med(off, "halo_exposed_ms_per_step_rank0")
        print(f"halo wait hidden by the overlap{tail.replace('+', ', with the ')}"
              f"{' thread' if tail else ''}: {100 * hidden:.0f}% of the no-overlap wait")
PY
