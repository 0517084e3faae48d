#!/usr/bin/env bash
# ctest: every row of docs/errors.md — program, ranks, arguments, message —
# must exit non-zero and print the message (on every rank that prints).
#   error_catalogue.sh CATALOGUE MPIEXEC PROGRAM_DIR...
# Programs are looked up by name in the PROGRAM_DIRs; "" in a row's arguments
# is one empty argument. TELAR_CATALOGUE_MIN_RANKS=2 runs only the rows of two
# or more ranks (the MPICH pass of scripts/test.sh: one-process rows do not
# depend on the MPI implementation, and the Open MPI pass runs them).
set -uo pipefail
catalogue=$1 mpiexec=$2
shift 2
data=${TELAR_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
[[ -d $data ]] || { echo "Fashion-MNIST not installed in $data: skipped (rows need it)"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

find_program() {
  for d in "$@"; do
    [[ -x $d/$name ]] && { echo "$d/$name"; return; }
  done
}

rows=0 failed=0 min_ranks=${TELAR_CATALOGUE_MIN_RANKS:-1}
while IFS='|' read -r _ num name ranks args message _; do
  num=${num// /}
  [[ $num =~ ^[0-9]+$ ]] || continue
  name=${name// /} ranks=${ranks// /}
  ((ranks >= min_ranks)) || continue
  args=$(sed -E 's/^ *`(.*)` *$/\1/' <<<"$args")
  message=$(sed -E 's/^ *`(.*)` *$/\1/' <<<"$message")
  program=$(find_program "$@")
  rows=$((rows + 1))
  if [[ -z $program ]]; then
    echo "row $num: program $name not built"
    failed=$((failed + 1))
    continue
  fi
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
    failed=$((failed + 1))
  elif [[ $rc == 124 ]]; then
    echo "row $num: '$name $args' on $ranks rank(s) did not end within 120 s"
    failed=$((failed + 1))
  elif ! grep -qF -- "$message" <<<"$out"; then
    echo "row $num: '$name $args' on $ranks rank(s) did not print: $message"
    echo "$out" | grep -v '^ ' | head -n 8
    failed=$((failed + 1))
  fi
done <"$catalogue"
echo "$rows rows of $min_ranks or more ranks, $failed failed"
[[ $rows -gt 0 && $failed == 0 ]]
