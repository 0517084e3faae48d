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
source "$(dirname "$0")/lib.sh"
cluster_up 4 "$scripts"
flavour=$(mpi_flavour "$program")

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
