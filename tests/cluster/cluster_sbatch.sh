#!/usr/bin/env bash
# ctest (label cluster): bring up a 4-node emulated cluster
# (scripts/cluster/start.sh); run PROGRAM (cluster_hello) on 2 nodes x 2
# tasks through sbatch -> telar.sbatch -> telar-srun -> srun with the PMI of
# the MPI it links (TCP between the nodes, shared memory inside each), then
# on 4 nodes x 1 task through srun; check that the ranks saw 2 (then 4)
# hostnames and right allreduces; tear the cluster down, also on failure or
# timeout.
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

# The batch job; telar-srun picks pmix (Open MPI) or pmi2 (MPICH) from ldd.
job_out=$shared/job.out
if ! timeout 40 "$run" head sbatch --wait -N 2 --ntasks=4 --ntasks-per-node=2 --time=2 --output="$job_out" \
  --export=ALL,TELAR_SLURM_SCRIPTS="$scripts/slurm" \
  "$scripts/slurm/telar.sbatch" "$program" 2 >"$shared/sbatch.out" 2>&1; then
  echo "cluster test: the 2-node batch job failed or did not finish within 40 s; sbatch said:"
  cat "$shared/sbatch.out"
  echo "--- job output:"
  cat "$job_out" 2>/dev/null || echo "(none)"
  echo "--- queue and nodes:"
  "$run" head squeue 2>&1 || true
  "$run" head sinfo -N 2>&1 || true
  tail -n 20 "$TELAR_CLUSTER_DIR"/log/slurmctld.log "$TELAR_CLUSTER_DIR"/log/slurmd-node*.log 2>/dev/null || true
  exit 1
fi
cat "$job_out"
grep -q 'telar-srun: rank 3 on node2' "$job_out" || { echo "cluster test: rank 3 did not run on node2"; exit 1; }
grep -q '^cluster_hello: 4 ranks on 2 hosts (node1,node2.*: ok$' "$job_out" ||
  { echo "cluster test: cluster_hello did not report 4 ranks on 2 hosts with right allreduces"; exit 1; }
echo "cluster test: 4 ranks on node1 and node2, allreduces right"

# 4 nodes, one rank each, straight through srun.
# (ldd's output read whole: `ldd | grep -q` under pipefail fails when grep
# quits before ldd has written everything.)
libs=$(ldd "$program" 2>/dev/null || true)
mpi=pmix
grep -q libmpich <<<"$libs" && mpi=pmi2
if ! timeout 30 "$run" head srun -N 4 --ntasks-per-node=1 --time=2 --mpi=$mpi "$program" 4 >"$shared/srun.out" 2>&1; then
  echo "cluster test: srun -N 4 --mpi=$mpi failed or did not finish within 30 s:"
  cat "$shared/srun.out"
  "$run" head sinfo -N 2>&1 || true
  exit 1
fi
cat "$shared/srun.out"
grep -q '^cluster_hello: 4 ranks on 4 hosts (node1,node2,node3,node4.*: ok$' "$shared/srun.out" ||
  { echo "cluster test: cluster_hello did not report 4 ranks on 4 hosts with right allreduces"; exit 1; }
echo "cluster test: 4 ranks on node1 ... node4 through srun --mpi=$mpi, allreduces right"
