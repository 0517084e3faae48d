#!/usr/bin/env bash
# Weak scaling on this machine, Telar beside PyTorch DDP, for the scaling
# report: the MLP 784-H-H-10 with SGD, batch BATCH per rank, one thread per
# rank (bench_mlp_step and bench/peers/mlp_torch.py: the same model, step and
# synthetic data), at each rank count of RANKS, rounds interleaved (round 1
# of every run, then round 2, ...: the machine's speed moves within minutes).
# Telar runs plain data parallelism (bucketed ring allreduce) and ZeRO-1;
# PyTorch runs DistributedDataParallel over gloo. One JSON line per run on
# stdout, for scaling_report.py:
#   bash bench/planner/peer_scaling.sh BUILD_DIR > peers.jsonl
#   bash bench/planner/scaling_report.sh BUILD_DIR peers.jsonl [VALIDATION.jsonl ...]
# Settings: RANKS (default "1 2 4"), ROUNDS (3), STEPS (30), HIDDEN (2048),
# BATCH (128 per rank). BUILD_DIR needs benchmarks on (TELAR_ENABLE_BENCHMARKS).
set -euo pipefail
build=${1:?usage: peer_scaling.sh BUILD_DIR}
cd "$(dirname "$0")/../.."
ranks=${RANKS:-1 2 4}
rounds=${ROUNDS:-3}
steps=${STEPS:-30}
hidden=${HIDDEN:-2048}
batch=${BATCH:-128}
bench="$build/bench/mlp/bench_mlp_step"
cmake --build "$build" -j1 --target bench_mlp_step >&2
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
cores=$(nproc --all)
common=(--steps "$steps" --hidden "$hidden" --batch "$batch")

# The run's median step (ms): the last JSON line's step_ms_median.
median() { grep -o '"step_ms_median": *[0-9.]*' | tail -1 | sed 's/.*: *//'; }

run() { # peer ranks command...
  local peer=$1 n=$2 load ms
  shift 2
  load=$(cut -d' ' -f1 /proc/loadavg)
  echo "round $r: $peer at $n ranks" >&2
  if ! ms=$("$@" | median) || [ -z "$ms" ]; then
    echo "peer_scaling.sh: $peer at $n ranks gave no step time" >&2
    return 1
  fi
  printf '{"scaling": "weak", "peer": "%s", "ranks": %d, "round": %d, "step_ms": %s, ' \
    "$peer" "$n" "$r" "$ms"
  printf '"batch_per_rank": %d, "hidden": %d, "cores": %d, "load": %s}\n' \
    "$batch" "$hidden" "$cores" "$load"
}

for r in $(seq 1 "$rounds"); do
  for n in $ranks; do
    run "telar dp" "$n" mpirun --oversubscribe -np "$n" "$bench" "${common[@]}" --dp "$n"
    if [ "$n" -gt 1 ]; then
      run "telar dp + ZeRO-1" "$n" \
        mpirun --oversubscribe -np "$n" "$bench" "${common[@]}" --dp "$n" --zero 1
      run "pytorch ddp" "$n" /usr/bin/python3 bench/peers/mlp_torch.py "${common[@]}" \
        --ddp --ranks "$n"
    else
      run "pytorch ddp" 1 /usr/bin/python3 bench/peers/mlp_torch.py "${common[@]}"
    fi
  done
done
