#!/usr/bin/env bash
# ResNet-50 training step (batch 16, 3x128x128, fp32, one thread): Telar's
# native network (example 06), the same network imported from PyTorch's ONNX
# export (example 04 --data synthetic), PyTorch 1.13 and 2.6 (resnet_torch.py;
# 2.6 with the backward of its three 1x1 stride-2 projections outside oneDNN,
# whose 3.6 crashes there on this machine, and 1.13 the same way to show what
# that costs), and a GEMM floor (PyTorch 1.13's 1024^3 fp32 matmul, GFLOP/s), in
# interleaved rounds: the machine's speed swings, so compare within a round.
# Prints "<round> <who> <ms>" lines, then each one's median and the medians
# of the per-round ratios to PyTorch 1.13 and 2.6.
#
#   bash bench/peers/resnet50_rounds.sh [ROUNDS] [BUILD_DIR]
#   TORCH26=0 bash bench/peers/resnet50_rounds.sh     # PyTorch 1.13 only
#   TORCH26_SH=/path/to/torch26.sh bash bench/peers/resnet50_rounds.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
build=${2:-build}
steps=${STEPS:-8}
export OMP_NUM_THREADS=1
torch26sh=${TORCH26_SH:-../shared/peers/torch26.sh}
[[ -f $torch26sh ]] || TORCH26=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

first_number_after() { grep -oE "$1[^0-9]*[0-9.]+" | head -1 | grep -oE '[0-9.]+$'; }

# The Telar runs share one calibration (the step prediction's), cached once.
telar_flags=(--batch 16 --limit-steps "$steps" --lr 0.01 --json --profile "$work/profile.json")
native() {
  "$build/examples/06_resnet/resnet" --model resnet50 --resolution 128 "${telar_flags[@]}" \
    2>/dev/null | first_number_after '"step_ms_median":'
}
imported() {
  "$build/examples/04_onnx/onnx_train" --model "$work/resnet50.onnx" --data synthetic \
    --optimizer momentum "${telar_flags[@]}" 2>/dev/null | first_number_after '"step_ms_median":'
}
# torch <extra flags> <python...>: resnet_torch.py's median step.
torch() {
  local extra=$1
  shift
  # shellcheck disable=SC2086 # the extra flags split into words
  "$@" bench/peers/resnet_torch.py --model resnet50 --batch 16 --resolution 128 \
    --steps "$steps" --warmup 2 $extra | first_number_after '"step_ms_median":'
}
gemm_floor() {
  /usr/bin/python3 -c "
import time, torch
torch.set_num_threads(1)
a, b = torch.rand(1024, 1024), torch.rand(1024, 1024)
best = min((lambda t0: (torch.mm(a, b), time.perf_counter() - t0)[1])(time.perf_counter())
           for _ in range(7))
print(f'{2 * 1024**3 / best / 1e9:.1f}')"
}

/usr/bin/python3 bench/peers/resnet_torch.py --model resnet50 --resolution 128 \
  --onnx "$work/resnet50.onnx" >/dev/null
out=$work/rounds.txt
for r in $(seq 1 "$rounds"); do
  echo "# round $r, load $(cut -d' ' -f1-3 /proc/loadavg)"
  {
    echo "$r gemm_gflops $(gemm_floor)"
    echo "$r telar_native $(native)"
    echo "$r telar_imported $(imported)"
    echo "$r torch1.13 $(torch "" /usr/bin/python3)"
    echo "$r torch1.13_projections $(torch --projections-outside-onednn /usr/bin/python3)"
    # 2.6's oneDNN (Debian 13: 3.6) dies of SIGFPE here in the backward of
    # 1x1 stride-2 convolutions (resnet_torch.py, projections_outside_onednn).
    [[ ${TORCH26:-1} == 0 ]] ||
      echo "$r torch2.6 $(torch --projections-outside-onednn bash "$torch26sh" python3)"
  } | tee -a "$out"
done
/usr/bin/python3 - "$out" <<'EOF'
import collections, statistics, sys
by = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, who, v = line.split()
    by[who][r] = float(v)
for who, runs in by.items():
    print(f"median {who}: {statistics.median(runs.values()):.1f}")
for peer in ("torch1.13", "torch1.13_projections", "torch2.6"):
    for who in ("telar_native", "telar_imported"):
        ratios = [by[who][r] / by[peer][r] for r in by[who] if r in by.get(peer, {})]
        if ratios:
            print(f"{who} / {peer}: median {statistics.median(ratios):.3f} "
                  f"(rounds: {' '.join(f'{x:.3f}' for x in ratios)})")
ratios = [by["telar_imported"][r] / by["telar_native"][r] for r in by["telar_native"]]
print(f"imported / native: median {statistics.median(ratios):.3f}")
EOF
