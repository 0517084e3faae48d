#!/usr/bin/env bash
# ctest (label cluster): the topology-aware (hierarchical) allreduce equals
# the flat ring on real emulated nodes: test_comm_allreduce's "[nodes]" case
# as a 2-node x 2-task batch job (shared memory inside each node, TCP
# between them), which must see 2 nodes of 2 ranks and hierarchical groups
# of 2, and pass. Open MPI through mpirun inside the allocation, MPICH
# through srun --mpi=pmi2 (cluster_sbatch.sh says why).
#   cluster_allreduce.sh TEST_COMM_ALLREDUCE SCRIPTS_DIR STATE_DIR
# Exits 77 (skipped) where the cluster cannot run (not root, ...).
set -euo pipefail
program=$1 scripts=$2
export TELAR_CLUSTER_DIR=$3
source "$(dirname "$0")/lib.sh"
cluster_up 2 "$scripts"
launch="mpirun $program"
[[ $(mpi_flavour "$program") == mpich ]] && launch="srun --mpi=pmi2 $program"
job allreduce_2x2 2 4 '^allreduce nodes: 2 node(s) of 2 rank(s), hierarchical groups of 2$' \
  --wrap "$launch '[nodes]'"
grep -q "All tests passed" "$shared/allreduce_2x2.out" || { echo "cluster test: the [nodes] case failed"; exit 1; }
echo "cluster allreduce: hierarchical equals flat on 2 nodes of 2 ranks"
