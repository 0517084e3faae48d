#!/usr/bin/env bash
# ctest comm_failure_exit: a rank that dies, stops or throws alone ends the
# job within seconds, with Telar's message naming the lost rank and the
# operation the others were waiting in.
#   failure_exit.sh MPIEXEC PROBE       (PROBE: test_comm_failure)
# mpirun (Open MPI) and hydra (MPICH) kill the whole job themselves as soon
# as a process dies by a signal, faster than Telar's watch (1 s); the kill
# case therefore runs once as launched by default (the job must end) and
# once with the launcher told not to clean up: under Open MPI
# (--mca orte_abort_on_non_zero_status 0) Telar's own message must end it;
# MPICH 4.0's hydra ends the job within 0.2 s even with -disable-auto-cleanup
# (its proxy fails on the dead rank's socket), so there only the bound is checked.
set -uo pipefail
mpiexec=$1 probe=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
gone="telar: rank 0: rank 1 \(pid [0-9]+ on host [^)]+\) is gone; rank 0 was waiting for it in MPI_Allreduce on rank 0 of 2 \(communicator 'world'\)"
if "$mpiexec" --version 2>&1 | grep -qE "Open MPI|OpenRTE"; then
  keep=(--mca orte_abort_on_non_zero_status 0)
else
  keep=(-disable-auto-cleanup) gone=""
fi
failed=0
# case NAME LIMIT_S MESSAGE_REGEX ENV... -- MPIEXEC_FLAGS... : runs the probe on 2 ranks.
case_() {
  local name=$1 limit=$2 regex=$3
  shift 3
  local envs=() flags=()
  while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  flags=("$@")
  local t0 t1 out rc
  t0=$(date +%s.%N)
  out=$(env "${envs[@]}" timeout 60 "$mpiexec" "${flags[@]}" -np 2 "$probe" "${name%%-*}" 2>&1 </dev/null)
  rc=$?
  t1=$(date +%s.%N)
  local secs
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  echo "$name: exit $rc after $secs s"
  if [[ $rc == 0 || $rc == 124 ]] || awk -v s="$secs" -v l="$limit" 'BEGIN { exit !(s > l) }'; then
    echo "  FAILED: expected a non-zero exit within $limit s"
    failed=$((failed + 1))
  fi
  if [[ -n $regex ]] && ! grep -qE -- "$regex" <<<"$out"; then
    echo "  FAILED: no line matching: $regex"
    echo "$out" | head -n 12 | sed 's/^/  | /'
    failed=$((failed + 1))
  fi
}
case_ kill-launcher 20 "" X=1 --
case_ kill 20 "$gone" X=1 -- "${keep[@]}"
case_ stop 20 "telar: rank 0: MPI_Allreduce timed out after [0-9.]+ s on rank 0 of 2 \(communicator 'world'\).*; rank 1 \(pid [0-9]+ on host [^)]+\) is stopped" TELAR_COMM_TIMEOUT=3 --
# A stopped rank under the default communication timeout (300 s): the
# stopped-peer bound (TELAR_STOPPED_TIMEOUT, default 30 s, 3 here) ends it.
case_ stop-bound 20 "telar: rank 0: rank 1 \(pid [0-9]+ on host [^)]+\) has been stopped \(SIGSTOP\) for [0-9]+ s; rank 0 was waiting for it in MPI_Allreduce on rank 0 of 2 \(communicator 'world'\)" TELAR_STOPPED_TIMEOUT=3 --
case_ throw 15 "telar: rank 1: rank 1 alone failed" X=1 --
[[ $failed == 0 ]]
