#!/usr/bin/env bash
# test_onnx against fixtures written by PyTorch 2.6 (Debian 13's, in the
# chroot of ../shared/peers/torch26.sh) instead of the build's PyTorch 1.13:
# make_models.py runs in the chroot, then test_onnx reads its files through
# TELAR_ONNX_FIXTURES. Not part of CI (it needs root and the chroot).
#
#   tests/onnx/torch26_check.sh [BUILD_DIR] [--all]
#
# Run from the repository root (as bench/peers/README.md runs torch26.sh).
# BUILD_DIR (default: build) is a configured build tree; test_onnx is built
# there first (nice -n 10, one job). Runs test_onnx at 1 rank, its hidden
# [zoo_deep] case (ResNet-50 and DenseNet-121, whose exports check_export.py
# reads) and its [mpi] case at 2 ranks; --all adds [mpi4] at 4 ranks; then
# check_export.py in the chroot (PyTorch 2.6 loads Telar's exports). Each measured figure is printed as "onnx-report: <what> <value>"
# (TELAR_ONNX_REPORT) and collected in $OUT/report.txt. The fixtures go to
# /tmp/telar-onnx-fx26 inside the chroot ($PEER_ROOT/tmp/telar-onnx-fx26 here).
set -euo pipefail
build=build
all=0
for a in "$@"; do
  case "$a" in
    --all) all=1 ;;
    -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
    *) build=$a ;;
  esac
done
peer=../shared/peers/torch26.sh
[ -x "$peer" ] || { echo "torch26_check: $peer not found (run from the repository root)" >&2; exit 1; }
R=${PEER_ROOT:-/var/tmp/telar-peer-trixie}
# The chroot (built by torch26.sh on its first call), with onnx and torchvision.
"$peer" python3 -c 'import torch; print("torch26_check: PyTorch", torch.__version__)'
if ! chroot "$R" python3 -c 'import onnx, torchvision' 2>/dev/null; then
  chroot "$R" apt-get update -q >/dev/null
  chroot "$R" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    python3-onnx python3-torchvision >/dev/null
fi
fx=/tmp/telar-onnx-fx26
rm -rf "${R:?}$fx" && mkdir -p "$R$fx"
"$peer" python3 tests/onnx/make_models.py "$fx" 2> >(grep -v -e TracerWarning -e 'torch.tensor(' >&2)
OUT=$R$fx
nice -n 10 cmake --build "$build" --target test_onnx -- -j1
bin=$build/tests/onnx/test_onnx
mpi=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
export TELAR_ONNX_FIXTURES=$OUT TELAR_ONNX_REPORT=1
status=0
run() { # ranks, test spec...
  local np=$1
  shift
  echo "torch26_check: $np rank(s): test_onnx $*"
  "${mpi[@]}" -np "$np" "$bin" "$@" | tee -a "$OUT/test_onnx.log" || status=1
}
: >"$OUT/test_onnx.log"
run 1
run 1 "[zoo_deep]"
run 2 "[mpi]"
[ "$all" = 0 ] || run 4 "[mpi4]"
# PyTorch 2.6 on Telar's exports (<name>_telar.onnx, written by the 1-rank runs).
echo "torch26_check: check_export.py (PyTorch 2.6 on Telar's exports)"
"$peer" python3 tests/onnx/check_export.py "$fx" | tee -a "$OUT/test_onnx.log" || status=1
{
  grep -o 'onnx-report: .*' "$OUT/test_onnx.log" | sed 's/^onnx-report: //' # other ranks' lines may precede one
  sed -n 's/^\(.*\): PyTorch on Telar.s export vs Telar: relative error \(.*\)$/\1 export \2/p' \
    "$OUT/test_onnx.log"
} >"$OUT/report.txt" || true
echo "torch26_check: $(wc -l <"$OUT/report.txt") figures in $OUT/report.txt; fixtures in $OUT"
[ "$status" = 0 ] && echo "torch26_check: passed" || echo "torch26_check: FAILED" >&2
exit "$status"
