# shellcheck shell=bash
# Shared by the cluster tests (sourced): skip (exit 77, with the reason)
# where the emulated cluster cannot run, then bring up N nodes in
# $TELAR_CLUSTER_DIR and stop them again on exit, also after a failure.
#   cluster_up N SCRIPTS_DIR
# Sets run (scripts/cluster/run.sh) and shared ($TELAR_CLUSTER_SHARED) for
# the caller; fail and wait_for show $out, the job output the caller sets.
skip() { echo "cluster test skipped: $*"; exit 77; }

cluster_up() {
  local nodes=$1
  scripts=$2
  [[ $(id -u) == 0 ]] || skip "needs root (network/UTS/mount namespaces, a bridge, slurmd starting jobs)"
  export PATH=$PATH:/usr/sbin:/sbin
  for tool in unshare nsenter ip tc munged slurmctld slurmd sbatch; do
    command -v "$tool" >/dev/null || skip "$tool not installed (scripts/setup.sh installs iproute2, munge, slurm-wlm)"
  done
  unshare --net --uts --mount true 2>/dev/null || skip "this machine does not allow network namespaces (unshare --net failed)"
  unshare --net sh -c 'ip link add b0 type bridge && ip link add v0 type veth peer name v1' 2>/dev/null ||
    skip "this kernel cannot make a bridge or veth pair in a network namespace"
  t0=$SECONDS
  trap cluster_down EXIT
  trap 'echo "cluster test: interrupted"; exit 1' INT TERM
  timeout 40 "$scripts/cluster/start.sh" "$nodes" ||
    { echo "cluster test: start.sh $nodes failed or took over 40 s (logs in $TELAR_CLUSTER_DIR/log)"; exit 1; }
  source "$TELAR_CLUSTER_DIR/env"
  source "$scripts/cluster/lib.sh" # ns_name
  run=$scripts/cluster/run.sh
  shared=$TELAR_CLUSTER_SHARED
}

cluster_down() {
  local rc=$?
  "$scripts/cluster/stop.sh" || rc=1
  echo "cluster test: done in $((SECONDS - t0)) s"
  exit $rc
}

# mpi_flavour PROGRAM: mpich or openmpi, from the libraries it links.
# (ldd's output read whole: `ldd | grep -q` under pipefail fails when grep
# quits before ldd has written everything.)
mpi_flavour() {
  local libs
  libs=$(ldd "$1" 2>/dev/null || true)
  if grep -q libmpich <<<"$libs"; then echo mpich; else echo openmpi; fi
}

# dump_cluster: the queue, the nodes and the daemons' last log lines, for a
# failure message.
dump_cluster() {
  echo "--- queue and nodes:"
  "$run" head squeue 2>&1 || true
  "$run" head sinfo -N 2>&1 || true
  tail -n 20 "$TELAR_CLUSTER_DIR"/log/slurmctld.log "$TELAR_CLUSTER_DIR"/log/slurmd-node*.log 2>/dev/null || true
}

# fail MESSAGE: says what failed, shows $out (the job's output) and the
# cluster's state, exits 1.
fail() {
  echo "cluster test: $*"
  echo "--- job output ($out):"
  cat "$out" 2>/dev/null || echo "(none)"
  dump_cluster
  exit 1
}

# wait_for SECONDS WHAT CMD...: polls CMD every 0.1 s; fails naming WHAT.
wait_for() {
  local limit=$1 what=$2 i
  shift 2
  for ((i = 0; i < limit * 10; ++i)); do
    "$@" && return 0
    sleep 0.1
  done
  fail "waited $limit s for $what"
}

# node_pids NODE PROGRAM: pids of PROGRAM's processes on NODE (head, nodeI).
node_pids() {
  local exe pid
  exe=$(readlink -f "$2")
  ip netns pids "$(ns_name "$1")" 2>/dev/null | while read -r pid; do
    [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$exe" ]] && echo "$pid"
  done
  return 0
}

# job_gone JOB: true once Slurm no longer lists JOB.
job_gone() { [[ -z $("$run" head squeue -h -j "$1" 2>/dev/null) ]]; }

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
    dump_cluster
    exit 1
  fi
  cat "$out"
  grep -q "$expect" "$out" || { echo "cluster test: job '$name' did not print a line matching: $expect"; exit 1; }
}
