#!/usr/bin/env bash
# ctest: start the project's local Slurm, run fashion_mnist on 2 tasks through
# sbatch (scripts/slurm/telar.sbatch -> telar-srun -> srun) and check that its
# JSON summary equals the same run under mpirun (timings aside).
#   sbatch_matches_mpirun.sh PROGRAM MPIEXEC SCRIPTS_DIR
# Fails with the reason when Slurm cannot be started; exits 77 (skipped)
# only when the Fashion-MNIST data is not installed, as the example tests do.
set -euo pipefail
program=$1 mpiexec=$2 scripts=$3
data=${TELAR_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
[[ -d $data ]] || { echo "Fashion-MNIST not installed in $data: skipped"; exit 77; }

eval "$("$scripts/start_local_slurm.sh")" # fails here, naming the step, if Slurm cannot start
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
args=(--epochs 1 --limit-steps 30 --seed 5 --json --data "$data")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# The batch job: sbatch --wait returns the job's exit code.
if ! sbatch --wait --ntasks=2 --cpus-per-task=1 --time=5 --output="$out/job.out" \
  "$scripts/telar.sbatch" "$program" "${args[@]}" >"$out/sbatch.out" 2>&1; then
  echo "the sbatch job failed:"
  cat "$out/sbatch.out" "$out/job.out" 2>/dev/null
  exit 1
fi
cat "$out/job.out"
grep -q 'telar-srun: rank 1 on ' "$out/job.out" || { echo "telar-srun did not say where rank 1 runs"; exit 1; }

OMP_NUM_THREADS=1 "$mpiexec" -np 2 "$program" "${args[@]}" >"$out/mpirun.out" 2>&1 ||
  { cat "$out/mpirun.out"; exit 1; }

# The summaries, without the fields that are timings.
summary() { grep -o '^{"final_loss".*' "$1" | sed -E 's/"(samples_per_s|step_ms_median)":[^,]*,//g'; }
a=$(summary "$out/job.out") b=$(summary "$out/mpirun.out")
[[ -n $a ]] || { echo "no JSON summary from the sbatch job"; exit 1; }
echo "sbatch: $a"
echo "mpirun: $b"
[[ $a == "$b" ]] || { echo "the sbatch run differs from the mpirun run"; exit 1; }
echo "sbatch and mpirun give the same summary"
