#!/bin/sh
# Predicted vs measured step time for every layout the planner ranks.
#   bench/planner/validate.sh BUILD_DIR [NP...]        (default NP: 2 4)
# For fashion_mnist (and cnn when built) at each NP: --dry-run --json lists
# the fitting layouts; each runs --limit-steps $STEPS (default 12) and its
# JSON summary's step_ms_median and predicted_step_ms go to
# (the first $LIMIT layouts, default all) to $OUT (default /tmp/telar_planner_validation.jsonl); then summarise.py
# prints median |error|, Spearman rank correlation and chosen vs best.
# EVERY=N runs every N-th layout of the ranking (plus the chosen one and
# plain data parallelism); PROFILE=FILE is passed as --profile (calibration
# adds its layer times there on the first run); EXAMPLES="examples/02_cnn/cnn"
# picks the examples (paths under BUILD_DIR).
set -eu
build=${1:?usage: validate.sh BUILD_DIR [NP...]}
shift
nps=${*:-2 4}
steps=${STEPS:-12}
batch=${BATCH:-64}
out=${OUT:-/tmp/telar_planner_validation.jsonl}
mpirun=${MPIEXEC:-mpirun --oversubscribe}
every=${EVERY:-1}
profile=${PROFILE:+--profile $PROFILE}
here=$(dirname "$0")
: > "$out"
for exe in ${EXAMPLES:-examples/01_fashion_mnist/fashion_mnist examples/02_cnn/cnn}; do
  [ -x "$build/$exe" ] || continue
  name=$(basename "$exe")
  for np in $nps; do
    plan=$($mpirun -np "$np" "$build/$exe" --dry-run --json --batch "$batch" $profile </dev/null 2>/dev/null | grep '^{"profile"')
    echo "$plan" | python3 "$here/summarise.py" --layouts "$every" | head -n "${LIMIT:-1000}" | while read -r flags; do
      line=$($mpirun -np "$np" "$build/$exe" $flags --batch "$batch" --epochs 1 $profile </dev/null \
        --limit-steps "$steps" --json 2>/dev/null | grep '^{"final_loss"' || true)
      [ -n "$line" ] && echo "{\"example\":\"$name\",\"np\":$np,\"flags\":\"$flags\",\"run\":$line,\"plan\":$plan}" >> "$out"
      echo "$name np=$np $flags: done" >&2
    done
  done
done
python3 "$here/summarise.py" "$out"
