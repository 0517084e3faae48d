#!/usr/bin/env bash
# Sets up (idempotent), builds and runs the demo: an MLP trained on
# Fashion-MNIST, serially and then on 2 ranks in the layout the planner
# chooses (--layout auto), with what it predicted, what it measured and the
# speed-up against the serial run.
#   bash scripts/demo.sh                 # both runs
#   bash scripts/demo.sh --epochs 1      # extra flags go to fashion_mnist
# The model is 784-1024-1024-10 at a global batch of 256: at the examples'
# default 784-256-256-10, batch 64, a step is ~2 ms of compute and a second
# rank on 2 shared cores loses more to synchronisation than it gains
# (docs/planner.md); here compute dominates and a second rank can pay off,
# when both cores are free (on a machine loaded by other work it may not:
# the speed-up line says what happened).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target fashion_mnist
exe="$BUILD_DIR/examples/01_fashion_mnist/fashion_mnist"
# One thread per rank: ranks are the parallelism here.
export OMP_NUM_THREADS=1
flags=(--epochs 3 --hidden 1024 --batch 256 --json)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "== serial"
"$exe" "${flags[@]}" "$@" | tee "$out/serial.json"
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
echo "== 2 ranks, --layout auto (the planner chooses dp x pp x tp, ZeRO, micro-batches)"
mpirun -np 2 "$exe" "${flags[@]}" --layout auto "$@" | tee "$out/auto.json"
python3 - "$out/serial.json" "$out/auto.json" <<'EOF_PY'
import json, sys
serial, auto = (json.loads(open(p).read().strip().splitlines()[-1]) for p in sys.argv[1:3])
print("== the planner chose %s, %d micro-batches (%s)" % (
    auto["layout"], auto["config"]["microbatches"], auto["layout_reason"].split(";")[0]))
print("   step time: predicted %.1f ms, measured %.1f ms (median)" % (
    auto["predicted_step_ms"], auto["step_ms_median"]))
print("   %.0f samples/s against %.0f serial: %.2fx" % (
    auto["samples_per_s"], serial["samples_per_s"],
    auto["samples_per_s"] / serial["samples_per_s"]))
EOF_PY
