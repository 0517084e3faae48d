#!/bin/sh
# Predicted vs measured step time for the layouts the planner ranks: one
# command for the validation table of docs/planner.md.
#   bash bench/planner/validate.sh BUILD_DIR [NP...]        (default NP: 2 4)
# For each example (EXAMPLES, paths under BUILD_DIR; default fashion_mnist
# and cnn) at each NP, `--dry-run --json` lists the fitting layouts; a fixed
# selection of them (every EVERY-th in flag order, not in predicted order, so
# two cost models are measured on the same layouts; plus the planner's choice
# and plain data parallelism) runs --limit-steps $STEPS (default 12). ROUNDS
# (default 3) repeats the whole selection, interleaved (round 1 of every
# layout, then round 2, ...), so load from other work spreads over all
# layouts; summarise.py takes each layout's median over rounds (each run's
# step_ms_median leaves out the first, warm-up step) and prints median
# |error|, Spearman rank correlation and chosen vs best and vs plain dp.
# PROFILE=FILE is passed as --profile (calibration adds its layer times there
# on the first run); OUT (default /tmp/telar_planner_validation.jsonl)
# collects one JSON line per run, with `uptime` in it.
set -eu
build=${1:?usage: validate.sh BUILD_DIR [NP...]}
shift
nps=${*:-2 4}
steps=${STEPS:-12}
batch=${BATCH:-64}
rounds=${ROUNDS:-3}
out=${OUT:-/tmp/telar_planner_validation.jsonl}
mpirun=${MPIEXEC:-mpirun --oversubscribe}
profile=${PROFILE:+--profile $PROFILE}
here=$(dirname "$0")
sets=$(mktemp -d)
: > "$out"
echo "start: $(uptime)" >&2
# The plans first: one per (example, NP), and the layouts to run.
for exe in ${EXAMPLES:-examples/01_fashion_mnist/fashion_mnist examples/02_cnn/cnn}; do
  [ -x "$build/$exe" ] || continue
  name=$(basename "$exe")
  for np in $nps; do
    every=$(eval echo "\${EVERY_${name}_${np}:-${EVERY:-4}}")
    $mpirun -np "$np" "$build/$exe" --dry-run --json --batch "$batch" $profile </dev/null 2>/dev/null |
      grep '^{"profile"' > "$sets/$name.$np.plan"
    python3 "$here/summarise.py" --layouts "$every" < "$sets/$name.$np.plan" |
      head -n "${LIMIT:-1000}" > "$sets/$name.$np.layouts"
    echo "$exe $np $(wc -l < "$sets/$name.$np.layouts")" >> "$sets/index"
  done
done
r=1
while [ "$r" -le "$rounds" ]; do
  while read -r exe np count; do
    name=$(basename "$exe")
    while read -r flags; do
      line=$($mpirun -np "$np" "$build/$exe" $flags --batch "$batch" --epochs 1 $profile </dev/null \
        --limit-steps "$steps" --json 2>/dev/null | grep '^{"final_loss"' || true)
      load=$(cut -d' ' -f1 /proc/loadavg)
      [ -n "$line" ] && echo "{\"example\":\"$name\",\"np\":$np,\"round\":$r,\"load\":$load,\"flags\":\"$flags\",\"run\":$line,\"plan\":$(cat "$sets/$name.$np.plan")}" >> "$out"
    done < "$sets/$name.$np.layouts"
    echo "round $r: $name np=$np, $count layouts: $(uptime)" >&2
  done < "$sets/index"
  r=$((r + 1))
done
echo "end: $(uptime)" >&2
rm -rf "$sets"
python3 "$here/summarise.py" "$out"
