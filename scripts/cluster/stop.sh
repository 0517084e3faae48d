#!/usr/bin/env bash
# Tears down the emulated cluster of $TELAR_CLUSTER_DIR (default
# /tmp/telar-cluster): every process in its namespaces (slurmctld, slurmd,
# job steps, the namespace holders), the namespaces with their bridge, veths
# and mounts, and its munged. Keeps the logs in $TELAR_CLUSTER_DIR/log.
# Idempotent: stopping a stopped cluster does nothing. Needs root.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/lib.sh"
[[ $(id -u) == 0 ]] || { echo "stop.sh: needs root" >&2; exit 2; }
export PATH=$PATH:/usr/sbin:/sbin
t0=$(date +%s.%N)
if [[ -z ${TELAR_CLUSTER_LOCKED:-} ]]; then
  exec 9>"$cluster_dir.lock"
  flock -w 120 9 || { echo "stop.sh: another start.sh or stop.sh held $cluster_dir.lock for 120 s" >&2; exit 1; }
fi

# Our namespaces: those named tc<id>-*, and any holder whose name was lost.
mapfile -t spaces < <(ip netns list 2>/dev/null | awk -v p="$cluster_prefix-" 'index($1, p) == 1 {print $1}')
pids=()
for ns in "${spaces[@]}"; do
  mapfile -t -O "${#pids[@]}" pids < <(ip netns pids "$ns" 2>/dev/null)
done
for f in "$cluster_dir"/ns/*.pid; do
  [[ -f $f ]] || continue
  pid=$(<"$f")
  # Only a holder we started: a sleep whose net namespace is not the host's.
  [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == sleep &&
     $(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null) != $(stat -L -c %i /proc/self/ns/net) ]] && pids+=("$pid")
done
if [[ -f $cluster_dir/munge/munged.pid ]]; then
  pid=$(<"$cluster_dir/munge/munged.pid")
  [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == @(tc-munged|munged) ]] && pids+=("$pid")
fi

if ((${#pids[@]})); then
  kill -TERM "${pids[@]}" 2>/dev/null
  for _ in $(seq 50); do
    alive=()
    for pid in "${pids[@]}"; do [[ -d /proc/$pid ]] && alive+=("$pid"); done
    ((${#alive[@]})) || break
    sleep 0.1
  done
  ((${#alive[@]})) && kill -KILL "${alive[@]}" 2>/dev/null
  # A step started while we were stopping: once more, by namespace.
  for ns in "${spaces[@]}"; do
    rest=$(ip netns pids "$ns" 2>/dev/null)
    [[ -n $rest ]] && kill -KILL $rest 2>/dev/null
  done
fi
status=0
for ns in "${spaces[@]}"; do
  ip netns del "$ns" 2>/dev/null || { echo "stop.sh: could not delete network namespace $ns" >&2; status=1; }
done
# The runtime state goes; the logs stay for a post-mortem.
if [[ -f $cluster_dir/.telar-cluster ]]; then
  find "$cluster_dir" -mindepth 1 -maxdepth 1 ! -name log ! -name .telar-cluster -exec rm -rf {} + 2>/dev/null
fi
awk -v n="${#spaces[@]}" -v t="$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')" -v d="$cluster_dir" \
  'BEGIN {printf "stop.sh: cluster in %s stopped (%d namespace(s)) in %.1f s\n", d, n, t}'
exit $status
