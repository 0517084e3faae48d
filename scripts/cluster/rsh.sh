#!/usr/bin/env bash
# An ssh stand-in for launchers that start their daemons with ssh (Open
# MPI's mpirun, MPICH's Hydra): `rsh.sh NODE COMMAND...` runs COMMAND, a
# shell command line as ssh would pass it, on NODE of the emulated cluster.
#   mpirun --mca plm_rsh_agent scripts/cluster/rsh.sh --host node1,node2 ...
#   mpiexec.mpich -launcher ssh -launcher-exec scripts/cluster/rsh.sh -hosts node1,node2 ...
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# ssh's own options (-x, -o ..., -p ...) before the host name are ignored.
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in -o | -p | -l | -i) shift 2 ;; *) shift ;; esac
done
node=$1
shift
exec "$here/run.sh" "$node" bash -c "$*"
