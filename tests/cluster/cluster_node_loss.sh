#!/usr/bin/env bash
# ctest (label cluster): losing a node. On a 4-node emulated cluster, a job
# of 4 ranks (one per node; PROBE = test_comm_failure, summing forever) loses
# node4 mid-run, three ways:
#   link — `ip link set eth0 down` inside node4 (nothing dies, nothing is
#          delivered: only Telar's heartbeats can tell)
#   stop — SIGSTOP to node4's rank (alive, silent; its node's daemons fine)
#   kill — SIGKILL to node4's rank (the launcher may end the job first)
# Each time every surviving rank (nodes 1-3) must end within 30 s of the
# fault, and the job must fail (non-zero) naming node4: for link and stop
# Telar's message "lost host node4 (rank 3, pid P): ... was waiting in
# MPI_Allreduce", for kill Telar's or the launcher's. Open MPI launches with
# mpirun inside the allocation, MPICH with srun --mpi=pmi2 (as
# cluster_sbatch.sh, which says why).
#   cluster_node_loss.sh PROBE SCRIPTS_DIR STATE_DIR
# Exits 77 (skipped) where the cluster cannot run (not root, ...).
set -euo pipefail
probe=$1 scripts=$2
export TELAR_CLUSTER_DIR=$3
source "$(dirname "$0")/lib.sh"
cluster_up 4 "$scripts"
if [[ $(mpi_flavour "$probe") == mpich ]]; then
  # UCX over TCP only: its shared-memory transports reach across the
  # emulated nodes (one kernel, one IPC namespace and /dev/shm: UCX sees one
  # machine), so a node whose link is down would still take part.
  launch="env UCX_TLS=tcp,self srun --mpi=pmi2 $probe none -1 5"
else
  launch="mpirun $probe none -1 5"
fi
limit=30

survivors_gone() { [[ -z $(node_pids node1 "$probe")$(node_pids node2 "$probe")$(node_pids node3 "$probe") ]]; }

# lose MODE: one job, node4 lost by MODE, the checks above.
lose() {
  local mode=$1 victim fault_at secs
  out=$shared/loss-$mode.out
  job=$("$run" head sbatch --parsable --no-requeue -N 4 --ntasks=4 --ntasks-per-node=1 --time=2 --output="$out" \
    --wrap "$launch; echo \"launcher exit \$?\"")
  # Heartbeats flow once every rank has made its communicator; one more
  # second so that each has been heard (the fault then meets heard peers).
  wait_for 30 "the job's ranks to run" grep -qs "ranks running" "$out"
  sleep 2
  victim=$(node_pids node4 "$probe")
  [[ -n $victim ]] || fail "no rank of the probe runs on node4"
  fault_at=$(date +%s.%N)
  case $mode in
    link) "$run" node4 ip link set eth0 down ;;
    stop) kill -STOP "$victim" ;;
    kill) kill -KILL "$victim" ;;
  esac
  wait_for $limit "the ranks on node1-3 to end after node4's $mode" survivors_gone
  secs=$(awk -v a="$fault_at" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  # node4 back; the launcher gets a few seconds to end the job (mpirun
  # waits for node4's daemon, srun may wait for Slurm to call node4 failed).
  [[ $mode == link ]] && "$run" node4 ip link set eth0 up
  kill -KILL "$victim" 2>/dev/null || true
  for _ in $(seq 50); do job_gone "$job" && break; sleep 0.2; done
  job_gone "$job" || "$run" head scancel "$job"
  wait_for 40 "job $job to end after node4's $mode" job_gone "$job"
  echo "node4 $mode: ranks on node1-3 ended $secs s after the fault; the job said:"
  grep -E "^telar: |launcher exit|node4" "$out" | cut -c1-300 | sed 's/^/  | /'
  grep -q "launcher exit 0" "$out" && fail "node loss: job $job succeeded after node4's $mode"
  if [[ $mode == kill ]]; then
    grep -qE "lost host node4 \(rank 3, pid $victim\)|node4" "$out" || fail "nothing names node4 after its kill"
  else
    grep -qE "telar: rank [0-2]: lost host node4 \(rank 3, pid $victim\): no heartbeat for [0-9.]+ s .*was waiting in MPI_Allreduce on rank [0-2] of 4" "$out" ||
      fail "no rank named node4 (rank 3, pid $victim) and MPI_Allreduce after node4's $mode"
  fi
  wait_for 40 "node4 to be idle again" bash -c "'$run' head sinfo -h -n node4 -o %T | grep -qx idle"
}

lose link
lose stop
lose kill
echo "cluster node loss: every surviving rank ended within $limit s of node4's link going down, its rank stopping, its rank killed"
