#!/usr/bin/env bash
# Figures on the emulated cluster (docs/cluster.md, "Scaling"): the
# allreduce, ring (flat) against hierarchical, at 2 nodes x 2 ranks and
# 4 x 1; then fashion_mnist's MLP trained data-parallel on 1, 2 and 4 nodes
# (NODES; one rank per node, the same global batch: strong scaling, or with
# SCALING=weak the same batch per rank), and a small GPT likewise
# (PARTS=gpt), each run's JSON (measured step_ms_median beside
# the cost model's predicted_step_ms), also gathered in OUT/points.jsonl for
# the scaling report.
# Open MPI builds (mpirun inside the allocation). Needs root.
#   bash bench/cluster/scaling.sh BUILD [RATE] [ROUNDS]
#   BUILD  a build tree with bench/allreduce/bench_allreduce and
#          examples/01_fashion_mnist/fashion_mnist (TELAR_ENABLE_BENCHMARKS=ON)
#   RATE   tc rate of every node's link (default 1gbit; "none": unshaped)
#   ROUNDS interleaved rounds (default 5)
# Environment: OUT (default ./cluster-scaling), DATA (Fashion-MNIST), STEPS
# (default 100), BATCH (global, default 256), HIDDEN (default 256), FM (the
# fashion_mnist binary, default BUILD's), GPT (the gpt binary), MLP_BENCH
# (bench_mlp_step), PARTS (default "allreduce mlp"; add gpt for a small GPT,
# zero1 for ZeRO-1 per node against messages at 2 nodes x 2 ranks), NODES
# (default "1 2 4"; the cluster gets the largest), SCALING (strong, the
# default: BATCH and the GPT's 32 are global; weak: they are per rank),
# CORES_PER_NODE (start.sh --cores-per-node: each node its own cores, round
# robin over the machine's; default every node on every core).
# Leaves the cluster up: stop it
# with scripts/cluster/stop.sh.
set -euo pipefail
build=$(cd "$1" && pwd)
rate=${2:-1gbit}
rounds=${3:-5}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
scripts=$here/../../scripts
out=$(mkdir -p "${OUT:-$PWD/cluster-scaling}" && cd "${OUT:-$PWD/cluster-scaling}" && pwd)
data=${DATA:-/usr/share/datasets/fashion-mnist}
fm=${FM:-$build/examples/01_fashion_mnist/fashion_mnist}
steps=${STEPS:-100} batch=${BATCH:-256} hidden=${HIDDEN:-256}
run=$scripts/cluster/run.sh

shape=()
[[ $rate != none ]] && shape=(--rate "$rate")
nodes=${NODES:-1 2 4}
scaling=${SCALING:-strong}
[[ $scaling == strong || $scaling == weak ]] || { echo "scaling.sh: SCALING=$scaling (strong or weak)" >&2; exit 2; }
largest=$(printf '%s\n' $nodes 4 | sort -n | tail -1)
[[ -n ${CORES_PER_NODE:-} ]] && shape+=(--cores-per-node "$CORES_PER_NODE")
bash "$scripts/cluster/start.sh" "$largest" "${shape[@]}"
# job NODES TASKS_PER_NODE OUTPUT CMD: one batch job, waited for.
job() {
  "$run" head sbatch --wait --quiet -N "$1" --ntasks-per-node="$2" --output="$3" --wrap "$4" ||
    echo "scaling.sh: job failed: $4 (see $3)" >&2
}
echo "uptime before: $(uptime)" | tee "$out/load.txt"

parts=${PARTS:-allreduce mlp}
bench=$build/bench/allreduce/bench_allreduce
for layout in "2 2" "4 1"; do
  set -- $layout
  if [[ $parts == *allreduce* ]]; then
    job "$1" "$2" "$out/allreduce-$1x$2.txt" \
      "mpirun $bench --mode interleaved --min-bytes 1048576 --max-bytes 16777216 --rounds $rounds"
  fi
done

# Rounds x node counts, interleaved; weak scaling multiplies the batches.
# Unbound ranks: Open MPI would bind each node's first rank to core 0, the
# same core on every node (the nodes share the machine's), and with
# CORES_PER_NODE they keep their node's cores.
gpt=${GPT:-$build/examples/03_gpt/gpt}
for r in $(seq "$rounds"); do
  for n in $nodes; do
    k=1
    [[ $scaling == weak ]] && k=$n
    if [[ $parts == *mlp* ]]; then
      job "$n" 1 "$out/mlp-$n-$r.json" \
        "mpirun --bind-to none $fm --dp $n --batch $((batch * k)) --hidden $hidden --limit-steps $steps --epochs 1 --json --data $data"
    fi
    if [[ $parts == *gpt* ]]; then # a small GPT: 2 layers, 128 wide, context 64, 40 steps
      job "$n" 1 "$out/gpt-$n-$r.json" \
        "mpirun --bind-to none $gpt --dp $n --layers 2 --hidden 128 --heads 4 --context 64 --batch $((32 * k)) --steps 40 --eval-limit 16 --sample 0 --json"
    fi
  done
done
# ZeRO-1 at 2 nodes x 2 ranks (PARTS=zero1): a parameter window per node
# against reduce-scatter and all-gather messages, and plain dp, on
# bench_mlp_step's MLP (HIDDEN wide, BATCH / 4 per rank), rounds interleaved.
mlp_bench=${MLP_BENCH:-$build/bench/mlp/bench_mlp_step}
if [[ $parts == *zero1* ]]; then
  for r in $(seq "$rounds"); do
    for mode in "dp:--zero 0" "window:--zero 1 --shared-memory 1" "messages:--zero 1 --shared-memory 0"; do
      job 2 2 "$out/zero1-${mode%%:*}-$r.txt" \
        "mpirun $mlp_bench --dp 4 ${mode#*:} --hidden $hidden --batch $((batch / 4)) --steps $steps"
    done
  done
fi
echo "uptime after: $(uptime)" | tee -a "$out/load.txt"

# Medians per node count (measured step and prediction, from the JSON lines);
# every run also as a line of $out/points.jsonl, for the scaling report
# (bench/planner/scaling_report.sh BUILD $out/points.jsonl).
python3 - "$out" "$rounds" "$rate" "$nodes" "$scaling" <<'PY'
import json, statistics, sys, glob
out, rounds, rate = sys.argv[1], int(sys.argv[2]), sys.argv[3]
nodes, scaling = [int(n) for n in sys.argv[4].split()], sys.argv[5]
points = open(f"{out}/points.jsonl", "w")
print("| example, nodes x ranks | step_ms_median (median of runs) | runs | predicted_step_ms |")
print("|---|---:|---|---:|")
for ex in ("mlp", "gpt"):
  for n in nodes:
    meas, pred = [], []
    for r in range(1, rounds + 1):
        try:
            line = [l for l in open(f"{out}/{ex}-{n}-{r}.json") if l.startswith("{")][-1]
        except (OSError, IndexError):
            continue
        j = json.loads(line)
        meas.append(j["step_ms_median"]); pred.append(j.get("predicted_step_ms", float("nan")))
        points.write(json.dumps({"cluster": "emulated", "example": ex, "nodes": n, "round": r,
                                 "rate": rate, "scaling": scaling, "step_ms": meas[-1],
                                 "predicted_step_ms": pred[-1]})
                     + "\n")
    if meas:
        print(f"| {ex} {n} x 1 | {statistics.median(meas):.2f} | {', '.join(f'{m:.2f}' for m in meas)} | {statistics.median(pred):.2f} |")
for mode in ("dp", "window", "messages"):
    meas = []
    for r in range(1, rounds + 1):
        try:
            line = [l for l in open(f"{out}/zero1-{mode}-{r}.txt") if l.startswith("{")][-1]
        except (OSError, IndexError):
            continue
        meas.append(json.loads(line)["step_ms_median"])
    if meas:
        print(f"| mlp ZeRO-1 {mode} 2 x 2 | {statistics.median(meas):.2f} | {', '.join(f'{m:.2f}' for m in meas)} | |")
PY
