#!/usr/bin/env bash
# ctest: start the project's local Slurm, run fashion_mnist on 2 tasks through
# sbatch (scripts/slurm/telar.sbatch -> telar-srun -> srun) and check that its
# JSON summary equals the same run under mpirun (timings aside).
#   sbatch_matches_mpirun.sh PROGRAM MPIEXEC SCRIPTS_DIR
# Fails with the reason when Slurm cannot be started; exits 77 (skipped)
# only when the Fashion-MNIST data is not installed, as the example tests do.
# The Slurm instance is this build's own ($TELAR_SLURM_DIR, set per build
# tree by CMake): started here, stopped at the end, never shared with another
# build or with the emulated cluster. Every wait is bounded and a failure
# says what it waited for.
set -euo pipefail
program=$1 mpiexec=$2 scripts=$3
data=${TELAR_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
[[ -d $data ]] || { echo "Fashion-MNIST not installed in $data: skipped"; exit 77; }

out=$(mktemp -d)
trap '"$scripts/stop_local_slurm.sh"; rm -rf "$out"' EXIT
echo "Slurm instance of this build: ${TELAR_SLURM_DIR:-/tmp/telar-slurm}"
# Fails here, naming the step and what it waited for, if Slurm cannot start.
eval "$(timeout 120 "$scripts/start_local_slurm.sh")" ||
  { echo "start_local_slurm.sh failed or took over 120 s"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
args=(--epochs 1 --limit-steps 30 --seed 5 --json --data "$data")

# The batch job: sbatch --wait returns the job's exit code.
if ! timeout 150 sbatch --wait --ntasks=2 --cpus-per-task=1 --time=5 --output="$out/job.out" \
  "$scripts/telar.sbatch" "$program" "${args[@]}" >"$out/sbatch.out" 2>&1; then
  echo "the sbatch job failed or did not finish within 150 s; sbatch said:"
  cat "$out/sbatch.out"
  echo "--- job output:"
  cat "$out/job.out" 2>/dev/null || echo "(none)"
  echo "--- the job and the node, as slurmctld sees them:"
  squeue -o '%i %T %r %M' 2>&1 || true
  sinfo -N -o '%N %T %E' 2>&1 || true
  exit 1
fi
cat "$out/job.out"
grep -q 'telar-srun: rank 1 on ' "$out/job.out" || { echo "telar-srun did not say where rank 1 runs"; exit 1; }

OMP_NUM_THREADS=1 "$mpiexec" -np 2 "$program" "${args[@]}" >"$out/mpirun.out" 2>&1 ||
  { cat "$out/mpirun.out"; exit 1; }

# The summaries, without the fields that are timings.
summary() { grep -o '^{"final_loss".*' "$1" | sed -E 's/"(samples_per_s|step_ms_median|predicted_step_ms)":[^,]*,//g'; }
a=$(summary "$out/job.out") b=$(summary "$out/mpirun.out")
[[ -n $a ]] || { echo "no JSON summary from the sbatch job"; exit 1; }
echo "sbatch: $a"
echo "mpirun: $b"
[[ $a == "$b" ]] || { echo "the sbatch run differs from the mpirun run"; exit 1; }
echo "sbatch and mpirun give the same summary"
