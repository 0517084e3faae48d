#!/usr/bin/env bash
# Runs a command on a node of the emulated cluster (scripts/cluster/start.sh):
#   scripts/cluster/run.sh NODE CMD [ARGS...]
# NODE is head (slurmctld's namespace, on the bridge) or node1 ... nodeN.
# The command sees the node's hostname, network (eth0 on the bridge, the
# cluster's /etc/hosts) and local scratch, keeps the caller's working
# directory and environment, and gets SLURM_CONF set to the cluster's.
#   scripts/cluster/run.sh head sbatch -N 2 --wrap 'srun hostname'
#   scripts/cluster/run.sh node1 ping -c1 node2
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/lib.sh"
[[ $# -ge 2 ]] || { echo "usage: run.sh NODE CMD [ARGS...]   (NODE: head, node1 ... nodeN)" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "run.sh: needs root (nsenter)" >&2; exit 2; }
node=$1
shift
[[ -f $cluster_dir/env ]] && source "$cluster_dir/env"
in_node "$node" "$@"
