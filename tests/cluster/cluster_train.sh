#!/usr/bin/env bash
# ctest (label cluster): fashion_mnist trained as a 4-node batch job (one
# rank per node, dp=4: TCP between the nodes) ends where the same run ends
# on one node (4 ranks, shared memory): final_loss, test_loss,
# test_accuracy and param_l2 of the JSON summaries equal within 1e-6
# relative (Telar's ring allreduce sums in rank order whatever the link, so
# they come out bitwise equal here). Open MPI through mpirun inside the
# allocation, MPICH through srun --mpi=pmi2 (cluster_sbatch.sh says why).
#   cluster_train.sh FASHION_MNIST SCRIPTS_DIR STATE_DIR
# Exits 77 (skipped) where the cluster cannot run (not root, ...) and
# without the Fashion-MNIST data.
set -euo pipefail
program=$1 scripts=$2
export TELAR_CLUSTER_DIR=$3
source "$(dirname "$0")/lib.sh"
data=${TELAR_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
[[ -d $data ]] || skip "Fashion-MNIST not installed in $data"
flavour=$(mpi_flavour "$program")
cluster_up 4 "$scripts"

flags="--data $data --epochs 1 --batch 64 --hidden 64 --seed 1 --limit-steps 30 --json"
launch="mpirun $program"
[[ $flavour == mpich ]] && launch="srun --mpi=pmi2 $program"

# train NAME SBATCH_ARGS...: one bounded batch job of 4 ranks, output in
# $shared/NAME.out.
train() {
  local name=$1
  out=$shared/$1.out
  shift
  timeout 90 "$run" head sbatch --wait --no-requeue --ntasks=4 --time=2 --output="$out" "$@" \
    --wrap "$launch $flags" >"$shared/$name.sbatch" 2>&1 ||
    { cat "$shared/$name.sbatch"; fail "the $name run failed or did not end within 90 s"; }
}
# -O: 4 tasks on node1's CPUs, as one host runs them.
train one_node -N 1 -w node1 -O
train four_nodes -N 4 --ntasks-per-node=1
one=$(grep '^{' "$shared/one_node.out" | tail -n 1 || true)
four=$(grep '^{' "$shared/four_nodes.out" | tail -n 1 || true)
grep -q '"layout": *"dp=4' <<<"$four" || fail "the 4-node run did not train dp=4: ${four:-no JSON}"

value() { grep -o "\"$1\": *[-0-9.e+]*" <<<"$2" | head -n 1 | sed 's/.*: *//'; }
for key in final_loss test_loss test_accuracy param_l2; do
  a=$(value "$key" "$one") b=$(value "$key" "$four")
  [[ -n $a && -n $b ]] || fail "no $key in a JSON summary: one node: $one; four nodes: $four"
  echo "cluster train: $key one node $a, four nodes $b"
  awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; exit !(d <= 1e-6 * m) }' ||
    fail "$key of the 4-node run ($b) differs from the one-node run ($a)"
done
echo "cluster train: $flavour, fashion_mnist dp=4 on 4 nodes ends as on one node"
