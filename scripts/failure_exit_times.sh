#!/usr/bin/env bash
# Kill-a-rank exit times: starts fashion_mnist on 2 ranks under dp, pp and tp,
# SIGKILLs the last rank once training runs, and measures the time from the
# kill until every process of the job is gone. Prints the median and the
# maximum per layout, and how many runs ended with Telar's own message
# ("... is gone; rank R was waiting for it in ...") rather than the launcher's.
#
#   scripts/failure_exit_times.sh [BUILD_DIR]
# Environment:
#   REPS=20             runs per layout
#   LAYOUTS="dp pp tp"  which layouts (--dp 2, --pp 2, --tp 2)
#   LAUNCHER=default    default: the launcher cleans up as it does out of the
#                       box (Open MPI's mpirun and MPICH's hydra kill the job
#                       when a rank dies by a signal); keep: it is told not to
#                       (--mca orte_abort_on_non_zero_status 0 /
#                       -disable-auto-cleanup), so Telar must end the job
#   MPIEXEC=mpirun      the launcher
#   MAX_S=60            a run not over after this long counts as a failure
# Exit status: 0 when every run ended within MAX_S, 77 when Fashion-MNIST is missing.
set -uo pipefail
build=${1:-build}
reps=${REPS:-20} layouts=${LAYOUTS:-dp pp tp} launcher=${LAUNCHER:-default}
mpiexec=${MPIEXEC:-mpirun} max_s=${MAX_S:-60}
program=$build/examples/01_fashion_mnist/fashion_mnist
data=${TELAR_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
[[ -x $program ]] || { echo "$program not built (cmake --build $build --target fashion_mnist)"; exit 2; }
[[ -d $data ]] || { echo "Fashion-MNIST not installed in $data: skipped"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
flags=()
if [[ $launcher == keep ]]; then
  if "$mpiexec" --version 2>&1 | grep -qE "Open MPI|OpenRTE"; then
    flags=(--mca orte_abort_on_non_zero_status 0)
  else
    flags=(-disable-auto-cleanup)
  fi
fi
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# The rank processes: descendants of the launcher named like the program.
ranks_of() {
  local p
  for p in $(pgrep -P "$1"); do
    [[ $(ps -o comm= -p "$p" 2>/dev/null) == fashion_mnist ]] && echo "$p"
    ranks_of "$p"
  done
}
alive() { # any of the pids still running (a zombie counts as gone)
  local p s
  for p in "$@"; do
    s=$(ps -o stat= -p "$p" 2>/dev/null) || continue
    [[ $s == Z* ]] || return 0
  done
  return 1
}

failed=0
for layout in $layouts; do
  times=() telar=0
  for ((r = 0; r < reps; ++r)); do
    log=$logs/$layout.$r.log # one per run: a late writer cannot fool the next
    : >"$log"
    "$mpiexec" "${flags[@]}" -np 2 "$program" --"$layout" 2 --epochs 50 --batch 64 \
      --data "$data" >"$log" 2>&1 </dev/null &
    launcher_pid=$!
    until grep -q "epoch 1/" "$log" || ! kill -0 "$launcher_pid" 2>/dev/null; do sleep 0.1; done
    sleep 1 # mid-run: inside a step, a collective or a pipeline transfer
    pids=()
    for ((k = 0; k < 50 && ${#pids[@]} < 2; ++k)); do
      mapfile -t pids < <(ranks_of "$launcher_pid" | sort -n)
      [[ ${#pids[@]} -ge 2 ]] || sleep 0.1
    done
    if [[ ${#pids[@]} -lt 2 ]]; then
      echo "$layout run $r: found ${#pids[@]} rank processes under launcher $launcher_pid"
      tail -n 5 "$log"
      kill -KILL "$launcher_pid" "${pids[@]}" 2>/dev/null
      wait "$launcher_pid" 2>/dev/null
      failed=$((failed + 1))
      continue
    fi
    t0=$(date +%s.%N)
    kill -KILL "${pids[-1]}"
    deadline=$(($(date +%s) + max_s))
    while { kill -0 "$launcher_pid" 2>/dev/null || alive "${pids[@]}"; } &&
      [[ $(date +%s) -lt $deadline ]]; do
      sleep 0.02
    done
    t1=$(date +%s.%N)
    if kill -0 "$launcher_pid" 2>/dev/null || alive "${pids[@]}"; then
      echo "$layout run $r: job still running ${max_s} s after the kill"
      kill -KILL "$launcher_pid" "${pids[@]}" 2>/dev/null
      failed=$((failed + 1))
    fi
    wait "$launcher_pid" 2>/dev/null
    grep -q "is gone; rank [0-9]* was waiting for it in" "$log" && telar=$((telar + 1))
    times+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')")
  done
  printf '%s\n' "${times[@]}" | sort -n | awk -v l="$layout" -v n="$reps" -v t="$telar" \
    -v m="$launcher" '{ v[NR] = $1 } END {
      printf "%s (launcher %s): %d runs, exit after kill: median %.2f s, max %.2f s; Telar message in %d\n",
             l, m, NR, v[int((NR + 1) / 2)], v[NR], t }'
done
[[ $failed == 0 ]]
