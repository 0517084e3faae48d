#!/bin/sh
# Predicted vs measured step time of the U-Net's layouts (docs/spatial.md,
# "Choosing dp and sp"): one command for its table.
#   sh bench/planner/validate_unet3d.sh BUILD_DIR VOLUMES.h5
# ROUNDS (default 3) interleaved rounds, each: `--dry-run --json` at 1 and 2
# ranks (the predictions; the first round calibrates into PROFILE, default
# ~/.cache/telar/profile.json, which later rounds read), then --limit-steps
# STEPS (default 12) of sp = 1 on one rank, dp = 2 (--batch 1) and sp = 2
# (--batch 2) on two, with one thread per rank. Prints each layout's
# predicted and measured medians and the error; OUT (default
# /tmp/telar_unet3d_validation.txt) keeps every JSON line.
set -eu
build=${1:?usage: validate_unet3d.sh BUILD_DIR VOLUMES.h5}
data=${2:?usage: validate_unet3d.sh BUILD_DIR VOLUMES.h5}
exe=$build/examples/07_unet3d/unet3d
rounds=${ROUNDS:-3}
steps=${STEPS:-12}
profile=${PROFILE:-$HOME/.cache/telar/profile.json}
out=${OUT:-/tmp/telar_unet3d_validation.txt}
mpirun=${MPIEXEC:-mpirun --oversubscribe}
export OMP_NUM_THREADS=1
common="--data $data --val 1"
run() { # tag, ranks, flags: the JSON lines of one run, tagged
  $mpirun -np "$2" "$exe" $common $3 </dev/null 2>/dev/null | grep '^{' | sed "s/^/$1 /" >> "$out"
}
: > "$out"
r=1
while [ "$r" -le "$rounds" ]; do
  echo "round $r: $(uptime)" >&2
  run pred 1 "--dry-run --json --profile $profile"
  run pred 2 "--dry-run --json --profile $profile"
  run "1 1" 1 "--batch 2 --epochs 1 --limit-steps $steps --json"
  run "2 1" 2 "--dp 2 --batch 1 --epochs 1 --limit-steps $steps --json"
  run "1 2" 2 "--sp 2 --batch 2 --epochs 1 --limit-steps $steps --json"
  r=$((r + 1))
done
python3 - "$out" <<'EOF'
import json, statistics, sys
pred, meas = {}, {}
for line in open(sys.argv[1]):
    words = line.split(' ', 2)
    if words[0] == 'pred':
        for l in json.loads(line[5:])['layouts']:
            pred.setdefault((l['dp'], l['sp']), []).append(l['predicted_step_ms'])
    else:
        meas.setdefault((int(words[0]), int(words[1])), []).append(json.loads(words[2])['step_ms'])
for k in sorted(meas):
    p, m = statistics.median(pred[k]), statistics.median(meas[k])
    print('dp %d x sp %d: predicted %.1f ms, measured %.1f ms (%s), error %+.0f%%' % (
        k[0], k[1], p, m, ', '.join('%.1f' % x for x in meas[k]), 100 * (p / m - 1)))
EOF
