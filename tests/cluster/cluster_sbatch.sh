#!/usr/bin/env bash
# ctest (label cluster): bring up a 4-node emulated cluster
# (scripts/cluster/start.sh); run PROGRAM (cluster_hello) on 2 nodes x 2
# tasks (TCP between the nodes, shared memory inside each), then on 4 nodes
# x 1 task, as batch jobs: MPICH through srun --mpi=pmi2 (the first job via
# telar.sbatch -> telar-srun), Open MPI through mpirun inside the allocation;
# check that the ranks saw 2 (then 4) hostnames and right allreduces; tear
# the cluster down, also on failure or timeout.
#   cluster_sbatch.sh PROGRAM SCRIPTS_DIR STATE_DIR
# Exits 77 (skipped) when it cannot run here: not root, no namespaces, no
# Slurm or munge installed. Each wait is bounded and says what it waited for.
set -euo pipefail
program=$1 scripts=$2
export TELAR_CLUSTER_DIR=$3
skip() { echo "cluster test skipped: $*"; exit 77; }

[[ $(id -u) == 0 ]] || skip "needs root (network/UTS/mount namespaces, a bridge, slurmd starting jobs)"
export PATH=$PATH:/usr/sbin:/sbin
for tool in unshare nsenter ip tc munged slurmctld slurmd sbatch; do
  command -v "$tool" >/dev/null || skip "$tool not installed (scripts/setup.sh installs iproute2, munge, slurm-wlm)"
done
unshare --net --uts --mount true 2>/dev/null || skip "this machine does not allow network namespaces (unshare --net failed)"
unshare --net sh -c 'ip link add b0 type bridge && ip link add v0 type veth peer name v1' 2>/dev/null ||
  skip "this kernel cannot make a bridge or veth pair in a network namespace"

t0=$SECONDS
cleanup() {
  local rc=$?
  "$scripts/cluster/stop.sh" || rc=1
  echo "cluster test: done in $((SECONDS - t0)) s"
  exit $rc
}
trap cleanup EXIT
trap 'echo "cluster test: interrupted"; exit 1' INT TERM

timeout 40 "$scripts/cluster/start.sh" 4 ||
  { echo "cluster test: start.sh 4 failed or took over 40 s (logs in $TELAR_CLUSTER_DIR/log)"; exit 1; }
source "$TELAR_CLUSTER_DIR/env"
run=$scripts/cluster/run.sh
shared=$TELAR_CLUSTER_SHARED

# (ldd's output read whole: `ldd | grep -q` under pipefail fails when grep
# quits before ldd has written everything.)
libs=$(ldd "$program" 2>/dev/null || true)
if grep -q libmpich <<<"$libs"; then flavour=mpich; else flavour=openmpi; fi

# job NAME NODES TASKS EXPECTED_LINE SBATCH_ARGS...: one batch job, bounded,
# its output checked for EXPECTED_LINE (a grep pattern).
job() {
  local name=$1 nodes=$2 tasks=$3 expect=$4 out=$shared/$1.out
  shift 4
  if ! timeout 40 "$run" head sbatch --wait -N "$nodes" --ntasks="$tasks" --ntasks-per-node=$((tasks / nodes)) \
    --time=2 --output="$out" "$@" >"$shared/$name.sbatch" 2>&1; then
    echo "cluster test: the $nodes-node job '$name' failed or did not finish within 40 s; sbatch said:"
    cat "$shared/$name.sbatch"
    echo "--- job output:"
    cat "$out" 2>/dev/null || echo "(none)"
    echo "--- queue and nodes:"
    "$run" head squeue 2>&1 || true
    "$run" head sinfo -N 2>&1 || true
    tail -n 20 "$TELAR_CLUSTER_DIR"/log/slurmctld.log "$TELAR_CLUSTER_DIR"/log/slurmd-node*.log 2>/dev/null || true
    exit 1
  fi
  cat "$out"
  grep -q "$expect" "$out" || { echo "cluster test: job '$name' did not print a line matching: $expect"; exit 1; }
}

two='^cluster_hello: 4 ranks on 2 hosts (node1,node2, .*: ok$'
four='^cluster_hello: 4 ranks on 4 hosts (node1,node2,node3,node4, .*: ok$'
if [[ $flavour == mpich ]]; then
  # MPICH: srun --mpi=pmi2, through telar.sbatch / telar-srun (which reads
  # the PMI from ldd), then straight.
  job sbatch_2x2 2 4 "$two" --export=ALL,TELAR_SLURM_SCRIPTS="$scripts/slurm" \
    "$scripts/slurm/telar.sbatch" "$program" 2
  grep -q 'telar-srun: rank 3 on node2' "$shared/sbatch_2x2.out" || { echo "cluster test: rank 3 did not run on node2"; exit 1; }
  job srun_4x1 4 4 "$four" --wrap "srun --mpi=pmi2 $program 4"
else
  # Open MPI: mpirun inside the allocation (it starts its daemons with srun).
  # Not srun --mpi=pmix: with Debian's Open MPI 4.1.4 and Slurm 22.05 a rank
  # that is still in MPI_Init can receive a message from a rank that has
  # left it, before ob1 registered its handlers (a call through NULL in
  # mca_btl_tcp: 1 run in 13 to 30 here); mpirun had 0 failures in 60.
  job mpirun_2x2 2 4 "$two" --wrap "mpirun $program 2"
  job mpirun_4x1 4 4 "$four" --wrap "mpirun $program 4"
fi
echo "cluster test: $flavour ranks on 2 nodes (2 each) and on 4 nodes, distinct hostnames, allreduces right"
