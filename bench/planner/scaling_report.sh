#!/bin/sh
# The scaling report (Markdown + SVG): the cost model's data-parallel curves
# to 1,024 GPUs on the published hardware profiles, beside the published
# results, and the layouts bench/planner/validate.sh measured here.
#   bash bench/planner/scaling_report.sh BUILD_DIR [VALIDATION.jsonl ...] [PEERS.jsonl] [POINTS.jsonl]
# (PEERS.jsonl: bench/planner/peer_scaling.sh, Telar beside PyTorch DDP here;
# POINTS.jsonl: bench/cluster/scaling.sh, measured through Slurm on the emulated cluster)
# OUT (default /tmp/telar_scaling_report) receives scaling_report.md and its SVGs.
set -eu
build=${1:?usage: scaling_report.sh BUILD_DIR [VALIDATION.jsonl ...]}
shift
here=$(dirname "$0")
out=${OUT:-/tmp/telar_scaling_report}
mkdir -p "$out"
cmake --build "$build" -j1 --target telar_scaling_curves >/dev/null
"$build/bench/planner/telar_scaling_curves" "$here/profiles" > "$out/curves.jsonl"
python3 "$here/scaling_report.py" "$out/curves.jsonl" "$@" --out "$out"
