#!/usr/bin/env bash
# ctest: every row of docs/errors.md — program, ranks, arguments, message —
# must exit non-zero and print the message (on every rank that prints).
#   error_catalogue.sh CATALOGUE MPIEXEC PROGRAM_DIR...
# Programs are looked up by name in the PROGRAM_DIRs; "" in a row's arguments
# is one empty argument. TELAR_CATALOGUE_MIN_RANKS=2 runs only the rows of two
# or more ranks (the MPICH pass of scripts/test.sh: one-process rows do not
# depend on the MPI implementation, and the Open MPI pass runs them).
# TELAR_CATALOGUE_ABSENT="cnn gpt ..." names programs this build leaves out
# on purpose (TELAR_ONE_MPI_EXAMPLES=OFF): their rows are skipped and
# counted; any other program that is not found fails its rows.
#
# The one-rank rows run TELAR_CATALOGUE_JOBS (default 3) at a time: each
# waits mostly for MPI's singleton start (0.45 s of wall time for 0.1 s of
# CPU), and no two of them write the same file (the ones that write name
# their own cat_*.h5). The rows of two or more ranks then run one after the
# other, in the catalogue's order: row 100 reads the file row 68 wrote.
set -uo pipefail
catalogue=$1 mpiexec=$2
shift 2
data=${TELAR_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
[[ -d $data ]] || { echo "Fashion-MNIST not installed in $data: skipped (rows need it)"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
dirs=("$@")
min_ranks=${TELAR_CATALOGUE_MIN_RANKS:-1} jobs=${TELAR_CATALOGUE_JOBS:-3}
absent=" ${TELAR_CATALOGUE_ABSENT:-} " skipped=0
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT

find_program() {
  for d in "${dirs[@]}"; do
    [[ -x $d/$1 ]] && { echo "$d/$1"; return; }
  done
}

# run_row NUM NAME RANKS ARGS MESSAGE: prints why the row failed (nothing
# when it passed).
run_row() {
  local num=$1 name=$2 ranks=$3 args=$4 message=$5 program out rc
  program=$(find_program "$name")
  if [[ -z $program ]]; then
    echo "row $num: program $name not built"
    return
  fi
  local argv
  read -ra argv <<<"$args"
  for i in "${!argv[@]}"; do # "" in a row is an empty argument (--checkpoint-dir "")
    [[ ${argv[$i]} == '""' ]] && argv[$i]=
  done
  if [[ $ranks == 1 ]]; then
    out=$(timeout 120 "$program" "${argv[@]}" 2>&1 </dev/null)
  else
    out=$(timeout 120 "$mpiexec" -np "$ranks" "$program" "${argv[@]}" 2>&1 </dev/null)
  fi
  rc=$?
  if [[ $rc == 0 ]]; then
    echo "row $num: '$name $args' on $ranks rank(s) exited 0"
  elif [[ $rc == 124 ]]; then
    echo "row $num: '$name $args' on $ranks rank(s) did not end within 120 s"
  elif ! grep -qF -- "$message" <<<"$out"; then
    echo "row $num: '$name $args' on $ranks rank(s) did not print: $message"
    echo "$out" | grep -v '^ ' | head -n 8
  fi
}

rows=() several=()
while IFS='|' read -r _ num name ranks args message _; do
  num=${num// /}
  [[ $num =~ ^[0-9]+$ ]] || continue
  name=${name// /} ranks=${ranks// /}
  ((ranks >= min_ranks)) || continue
  if [[ $absent == *" $name "* ]]; then
    skipped=$((skipped + 1))
    continue
  fi
  args=$(sed -E 's/^ *`(.*)` *$/\1/' <<<"$args")
  message=$(sed -E 's/^ *`(.*)` *$/\1/' <<<"$message")
  rows+=("$num")
  if ((ranks == 1)); then
    while (($(jobs -rp | wc -l) >= jobs)); do wait -n; done
    run_row "$num" "$name" "$ranks" "$args" "$message" >"$results/$num" &
  else
    several+=("$num|$name|$ranks|$args|$message")
  fi
done <"$catalogue"
wait
for row in "${several[@]}"; do
  IFS='|' read -r num name ranks args message <<<"$row"
  run_row "$num" "$name" "$ranks" "$args" "$message" >"$results/$num"
done

failed=0
for num in "${rows[@]}"; do
  [[ -s $results/$num ]] || continue
  cat "$results/$num"
  failed=$((failed + 1))
done
echo "${#rows[@]} rows of $min_ranks or more ranks, $failed failed" \
  "($skipped skipped: not built here:${absent% })"
[[ ${#rows[@]} -gt 0 && $failed == 0 ]]
