#!/usr/bin/env bash
# bf16 against fp32, Telar against PyTorch 1.13 and 2.6 (CPU autocast bf16),
# on the three networks of docs/precision.md, one thread, in interleaved
# rounds (the machine is shared: only ratios within a round mean anything).
# Prints one line per run, "<round> <network> <who> <precision> <ms>", and
# the load average before each round.
#
#   bash bench/precision_rounds.sh [ROUNDS] [BUILD_DIR...]
#   bash bench/precision_rounds.sh 5 build-rel build-native  # builds side by side:
#                                          # "telar@<dir>" in place of "telar"
#   TORCH26=0 bash bench/precision_rounds.sh   # PyTorch 1.13 only
#   TORCH26_SH=/work/shared/peers/torch26.sh bash ...   # where ../shared is elsewhere
#   NETS="block cnn" bash bench/precision_rounds.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
builds=("${@:2}")
[[ ${#builds[@]} -gt 0 ]] || builds=(build)
export OMP_NUM_THREADS=1
torch26sh=${TORCH26_SH:-../shared/peers/torch26.sh}
torch26=(bash "$torch26sh" python3)
[[ -f $torch26sh ]] || TORCH26=0

# The first number after a pattern in a run's output.
ms_after() { grep -oE "$1[^0-9]*[0-9.]+" | head -1 | grep -oE '[0-9.]+$'; }

# telar <build> <network> <precision>: one Telar run, its median step in ms.
telar() {
  local build=$1
  shift
  case $1 in
  mlp) "$build/bench/mlp/bench_mlp_step" --steps 15 --warmup 3 --precision "$2" |
    ms_after '"step_ms_median":' ;;
  block) "$build/bench/transformer/bench_transformer" --reps 7 --warmup 2 --precision "$2" |
    ms_after 'forward\+backward median' ;;
  cnn) "$build/examples/02_cnn/cnn" --batch 128 --epochs 1 --limit-steps 12 --eval-limit 64 \
    --json --precision "$2" 2>/dev/null | ms_after '"step_ms_median":' ;;
  esac
}

# torch <network> <precision> <python...>: the peer script's median step.
torch() {
  local net=$1 p=$2
  shift 2
  case $net in
  mlp) "$@" bench/peers/mlp_torch.py --steps 15 --warmup 3 --precision "$p" |
    ms_after 'step median' ;;
  block) "$@" bench/transformer/block_torch.py --reps 7 --warmup 2 --precision "$p" |
    ms_after 'forward\+backward median' ;;
  cnn) "$@" bench/peers/cnn_torch.py --batch 128 --steps 12 --warmup 2 --precision "$p" |
    ms_after 'median step' ;;
  esac
}

for r in $(seq 1 "$rounds"); do
  echo "# round $r, load $(cut -d' ' -f1-3 /proc/loadavg)"
  for net in ${NETS:-mlp block cnn}; do
    for p in fp32 bf16; do
      for b in "${builds[@]}"; do
        who=telar
        [[ ${#builds[@]} -eq 1 ]] || who=telar@$(basename "$b")
        echo "$r $net $who $p $(telar "$b" "$net" "$p")"
      done
      echo "$r $net torch1.13 $p $(torch "$net" "$p" /usr/bin/python3)"
      [[ ${TORCH26:-1} == 0 ]] || echo "$r $net torch2.6 $p $(torch "$net" "$p" "${torch26[@]}")"
    done
  done
done
