#!/usr/bin/env bash
# Stops the single-node Slurm that start_local_slurm.sh started in
# $TELAR_SLURM_DIR (default /tmp/telar-slurm): its slurmd, slurmctld and
# munged, found by their pid files (other instances are left alone).
set -uo pipefail
dir=${TELAR_SLURM_DIR:-/tmp/telar-slurm}
pids=()
for f in telar-slurmd:"$dir/slurmd.pid" telar-slurmctld:"$dir/slurmctld.pid" telar-munged:"$dir/munge/munged.pid"; do
  name=${f%%:*} file=${f#*:}
  pid=$(cat "$file" 2>/dev/null) || continue
  [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == @("$name"|"${name#telar-}") ]] && pids+=("$pid")
done
((${#pids[@]})) || exit 0
kill "${pids[@]}" 2>/dev/null
for _ in $(seq 50); do
  left=()
  for pid in "${pids[@]}"; do [[ -d /proc/$pid ]] && left+=("$pid"); done
  ((${#left[@]})) || exit 0
  sleep 0.2
done
kill -KILL "${left[@]}" 2>/dev/null
exit 0
