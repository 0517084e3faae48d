#!/usr/bin/env bash
# Telar next to PyTorch on the MLP 784-2048-2048-10, batch 128 per rank, fp32,
# one thread per rank, in one go (the machine is shared: compare ratios taken
# in the same run).
#   bash bench/peers/compare.sh [serial|dp|all] [steps]
# Needs a configured build (BUILD_DIR, default build) with benchmarks on.
set -euo pipefail
cd "$(dirname "$0")/../.."
what=${1:-all}
steps=${2:-40}
BUILD_DIR=${BUILD_DIR:-build}
bench="$BUILD_DIR/bench/mlp/bench_mlp_step"
[ -x "$bench" ] || cmake --build "$BUILD_DIR" --target bench_mlp_step
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
median() { grep -o '"step_ms_median": *[0-9.]*' | tail -1 | sed 's/.*: *//'; }
telar() { mpirun -np "$1" "$bench" --steps "$steps" "${@:2}" | median; }
torch() { /usr/bin/python3 bench/peers/mlp_torch.py --steps "$steps" "$@" | median; }
ratio() { python3 -c "print(f'{$1/$2:.3f}')"; }

echo "# $(date -u +%FT%TZ) $(nproc --all) cores, load $(cut -d' ' -f1-3 /proc/loadavg), steps $steps"
if [ "$what" = serial ] || [ "$what" = all ]; then
  t1=$(telar 1); p1=$(torch)
  echo "serial step ms: telar $t1, pytorch $p1, telar/pytorch $(ratio "$t1" "$p1")"
fi
if [ "$what" = dp ] || [ "$what" = all ]; then
  t1=$(telar 1)
  t2=$(telar 2)
  z2=$(telar 2 --zero 1)
  p1=$(torch)
  p2=$(torch --ddp --ranks 2)
  echo "1 rank:  telar $t1 ms, pytorch $p1 ms"
  echo "2 ranks: telar DP (bucketed ring allreduce) $t2 ms, telar DP+ZeRO-1 (shared memory) $z2 ms, pytorch DDP (gloo) $p2 ms"
  echo "weak-scaling efficiency 1->2: telar DP $(ratio "$t1" "$t2"), telar DP+ZeRO-1 $(ratio "$t1" "$z2"), pytorch DDP $(ratio "$p1" "$p2")"
  echo "2-rank step vs pytorch DDP: telar DP $(ratio "$t2" "$p2"), telar DP+ZeRO-1 $(ratio "$z2" "$p2")"
fi
